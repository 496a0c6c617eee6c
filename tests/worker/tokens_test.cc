// SentencePiece ids in the text loader (data.tokenizer) and pre-tokenized .bin/.idx datasets
// (data.source: tokens). The tokenizer is trained in the test with spm_train on
// /usr/share/common-licenses; ids are compared with python3-sentencepiece's.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/spec/parse.h"
#include "worker/data/corpus.h"
#include "worker/data/errors.h"
#include "worker/data/loader.h"
#include "worker/data/token_corpus.h"
#include "worker/data/token_file.h"
#include "worker/data/tokenizer.h"

namespace fs = std::filesystem;
using namespace ring::data;

namespace {

const char* kLicenses = "/usr/share/common-licenses";

struct TempDir {
  fs::path p;
  TempDir() {
    char t[] = "/tmp/ring-tokens-XXXXXX";
    p = ::mkdtemp(t);
  }
  ~TempDir() { fs::remove_all(p); }
  std::string operator/(const std::string& n) const { return (p / n).string(); }
};

int run(const std::string& cmd) {
  return std::system(cmd.c_str());
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

// One model for the whole test binary: spm_train on the licenses (identity normalisation and
// byte fallback, so decoding gives the text back exactly).
const std::string& model_path() {
  static TempDir dir;
  static std::string path = [] {
    std::string inputs;
    for (const auto& e : fs::directory_iterator(kLicenses)) {
      if (!e.is_regular_file()) continue;
      inputs.append(inputs.empty() ? "" : ",").append(e.path().string());
    }
    std::string prefix = dir / "tok";
    int rc = run("spm_train --input=" + inputs + " --model_prefix=" + prefix +
                 " --vocab_size=1000 --model_type=unigram --normalization_rule_name=identity"
                 " --remove_extra_whitespaces=false --byte_fallback=true"
                 " --character_coverage=1.0 --minloglevel=2 >/dev/null 2>&1");
    return rc == 0 ? prefix + ".model" : std::string();
  }();
  return path;
}

std::string throw_message(const std::function<void()>& f) {
  try {
    f();
  } catch (const DataError& e) {
    return e.what();
  }
  return "(no DataError)";
}

std::vector<Sequence> take(SequenceSource& s, int n) {
  std::vector<Sequence> out;
  for (int i = 0; i < n; ++i) out.push_back(s.next_sequence());
  return out;
}

bool same(const Sequence& a, const Sequence& b) {
  return a.tokens == b.tokens && a.labels == b.labels && a.doc_ids == b.doc_ids &&
         a.cu_seqlens == b.cu_seqlens;
}

std::shared_ptr<const TokenCorpus> c4_for_vocab_check(const TempDir& dir) {
  return TokenCorpus::open({dir / "ds4"}, 0, 1);
}

}  // namespace

TEST(Tokenizer, IdsMatchPythonSentencepieceOnEveryDocument) {
  ASSERT_FALSE(model_path().empty()) << "spm_train failed";
  auto tok = Tokenizer::load(model_path());
  EXPECT_EQ(tok->vocab_size(), 1000);
  EXPECT_EQ(tok->bos_id(), 1);
  EXPECT_EQ(tok->eos_id(), 2);
  TextCorpus text = TextCorpus::load({kLicenses}, {.max_doc_len = 0, .min_doc_len = 1});
  ASSERT_GT(text.num_docs(), 10);
  // Python reads the same documents (as bytes) and prints one line of ids per document.
  TempDir dir;
  for (int64_t i = 0; i < text.num_docs(); ++i) {
    auto d = text.doc(i);
    write_file(dir / ("doc" + std::to_string(i)), std::string(d.begin(), d.end()));
  }
  write_file(dir / "enc.py",
             "import sentencepiece as spm, sys\n"
             "sp = spm.SentencePieceProcessor(model_file=sys.argv[1])\n"
             "for i in range(int(sys.argv[3])):\n"
             "    ids = sp.encode(open(f'{sys.argv[2]}/doc{i}', 'rb').read())\n"
             "    print(' '.join(map(str, ids)))\n");
  ASSERT_EQ(run("/usr/bin/python3 " + dir / "enc.py" + " " + model_path() + " " + dir.p.string() +
                " " + std::to_string(text.num_docs()) + " > " + dir / "ids.txt"),
            0);
  std::ifstream in(dir / "ids.txt");
  std::string line;
  int64_t docs = 0, tokens = 0;
  for (int64_t i = 0; i < text.num_docs(); ++i) {
    ASSERT_TRUE(std::getline(in, line)) << "python gave fewer documents";
    std::vector<int32_t> want;
    std::istringstream ls(line);
    for (int32_t id; ls >> id;) want.push_back(id);
    auto d = text.doc(i);
    std::vector<int32_t> got;
    tok->encode(std::string_view(reinterpret_cast<const char*>(d.data()), d.size()), got);
    ASSERT_EQ(got, want) << "document " << i;
    // The loader's document: BOS, the ids, EOS; decoding gives the text back.
    auto framed =
        tok->encode_document(std::string_view(reinterpret_cast<const char*>(d.data()), d.size()));
    ASSERT_EQ(framed.front(), 1);
    ASSERT_EQ(framed.back(), 2);
    ASSERT_EQ(tok->decode(framed), std::string(d.begin(), d.end()));
    ++docs;
    tokens += static_cast<int64_t>(got.size());
  }
  std::printf("%lld documents, %lld ids, all identical to python3-sentencepiece\n",
              static_cast<long long>(docs), static_cast<long long>(tokens));
}

TEST(Tokenizer, TextSourceWithTokenizerPacksIdsAndResumesExactly) {
  ASSERT_FALSE(model_path().empty());
  auto tok = Tokenizer::load(model_path());
  TextCorpus text = TextCorpus::load({kLicenses}, {.max_doc_len = 0, .min_doc_len = 1});
  auto ids = TokenCorpus::encode(text, *tok, /*max_doc_len=*/512, /*min_doc_len=*/16, 2);
  EXPECT_STREQ(ids->source_name(), "text");
  EXPECT_LT(ids->max_token(), 1000);
  // Fewer tokens than bytes (the pieces are longer than one byte).
  EXPECT_LT(ids->total_tokens(), text.total_tokens() / 2);
  // The same encoding with another thread count gives the same documents.
  auto one = TokenCorpus::encode(text, *tok, 512, 16, 1);
  EXPECT_EQ(one->content_hash(), ids->content_hash());
  for (bool pack : {true, false}) {
    TextLoader ref(ids, {.seq_len = 256, .pack = pack, .seed = 5});
    auto all = take(ref, 60);
    for (const auto& s : all) check_sequence(s, 1000);
    TextLoader a(ids, {.seq_len = 256, .pack = pack, .seed = 5});
    take(a, 23);
    nlohmann::json saved = a.cursor();
    TextLoader b(ids, {.seq_len = 256, .pack = pack, .seed = 5});
    b.seek(saved.get<Cursor>());
    for (int i = 23; i < 60; ++i) ASSERT_TRUE(same(b.next_sequence(), all[i])) << i;
  }
  // A byte-level cursor is refused on the tokenized corpus.
  auto bytes = std::make_shared<const TextCorpus>(
      TextCorpus::load({kLicenses}, {.max_doc_len = 512, .min_doc_len = 16}));
  TextLoader bl(bytes, {.seq_len = 256, .seed = 5});
  TextLoader tl(ids, {.seq_len = 256, .seed = 5});
  EXPECT_NE(throw_message([&] { tl.seek(bl.cursor()); }).find("content hash"), std::string::npos);
}

TEST(TokenFiles, WriteOpenAndResumeExactly) {
  TempDir dir;
  std::vector<std::vector<int32_t>> docs;
  for (int d = 0; d < 40; ++d) {
    std::vector<int32_t> v;
    for (int k = 0; k < 20 + 13 * d; ++k) v.push_back((d * 131 + k * 7) % 60000);
    docs.push_back(v);
  }
  for (int width : {2, 4}) {
    std::string prefix = dir / ("ds" + std::to_string(width));
    TokenFileWriter w(prefix, width, 60000);
    for (const auto& d : docs) w.add_document(d);
    w.finish();
    auto f = TokenFile::open(prefix + ".bin");
    ASSERT_EQ(f->num_docs(), 40);
    auto c = TokenCorpus::open({prefix + ".idx"}, /*max_doc_len=*/0, /*min_doc_len=*/1);
    ASSERT_EQ(c->num_docs(), 40);
    for (int d = 0; d < 40; ++d) ASSERT_EQ(c->doc(d), docs[d]);
    // Cutting: pieces of at most 100, tails under 30 dropped.
    auto cut = TokenCorpus::open({prefix}, 100, 30);
    for (int64_t i = 0; i < cut->num_docs(); ++i) {
      EXPECT_LE(cut->doc_len(i), 100);
      EXPECT_GE(cut->doc_len(i), 30);
    }
    TextLoader ref(cut, {.seq_len = 64, .pack = true, .seed = 9});
    auto all = take(ref, 150);  // past one epoch
    TextLoader a(cut, {.seq_len = 64, .pack = true, .seed = 9});
    take(a, 97);
    EXPECT_EQ(a.cursor().identity.source, "tokens");
    nlohmann::json saved = a.cursor();
    TextLoader b(cut, {.seq_len = 64, .pack = true, .seed = 9});
    b.seek(saved.get<Cursor>());
    for (int i = 97; i < 150; ++i) ASSERT_TRUE(same(b.next_sequence(), all[i])) << i;
  }
  // model.vocab must be above the largest id in the data.
  TextLoader big(c4_for_vocab_check(dir), {.seq_len = 64});
  EXPECT_NO_THROW(check_vocab(big, 60000));
  EXPECT_NE(throw_message([&] {
              check_vocab(big, 1000);
            }).find("model.vocab (1000) is not above the largest token id in the data"),
            std::string::npos);
  // Same ids in either width: same documents.
  auto c2 = TokenCorpus::open({dir / "ds2"}, 0, 1);
  auto c4 = TokenCorpus::open({dir / "ds4"}, 0, 1);
  for (int d = 0; d < 40; ++d) ASSERT_EQ(c2->doc(d), c4->doc(d));
  // An id that does not fit.
  TokenFileWriter w(dir / "big", 2, 0);
  EXPECT_NE(throw_message([&] {
              w.add_document(std::vector<int32_t>{1, 70000});
            }).find("70000"),
            std::string::npos);
}

// Issue 31.6: `ringctl tokenize -o` over a dataset a running job has mapped truncated it under
// the job. Now the new dataset replaces the old one whole at the end (the job's mapping keeps the
// old bytes: another inode), an unfinished writer leaves the old one and no temporary, and a link
// planted at the .idx name is replaced, not followed.
TEST(TokenFiles, RewritingADatasetNeverTruncatesItUnderItsReaders) {
  TempDir dir;
  const std::string p = dir / "ds";
  {
    TokenFileWriter w(p, 2, 0);
    w.add_document(std::vector<int32_t>(1000, 7));
    w.finish();
  }
  auto mapped = TokenFile::open(p + ".bin");  // a running job's mapping
  ASSERT_EQ(mapped->num_tokens(), 1000);
  {
    TokenFileWriter unfinished(p, 2, 0);
    unfinished.add_document(std::vector<int32_t>(10, 1));
  }  // dropped before finish(): the old dataset stays, no temporary left
  EXPECT_EQ(TokenFile::open(p + ".bin")->num_tokens(), 1000);
  for (const auto& e : std::filesystem::directory_iterator(dir.p))
    EXPECT_EQ(e.path().filename().string().find(".tmp-"), std::string::npos) << e.path();
  { std::ofstream(dir / "victim") << "mine"; }
  std::filesystem::remove(p + ".idx");
  std::filesystem::create_symlink(dir / "victim", p + ".idx");
  {
    TokenFileWriter w(p, 2, 0);
    w.add_document(std::vector<int32_t>(10, 3));
    w.finish();
  }
  EXPECT_EQ(TokenFile::open(p + ".bin")->num_tokens(), 10);
  EXPECT_FALSE(std::filesystem::is_symlink(p + ".idx"));
  std::ifstream v(dir / "victim");
  EXPECT_EQ(std::string((std::istreambuf_iterator<char>(v)), {}), "mine");
  // The old mapping still reads the old tokens.
  EXPECT_EQ(mapped->num_tokens(), 1000);
  EXPECT_EQ(mapped->data()[0], 7);
}

TEST(TokenFiles, HostileIndexAndBinGiveClearErrors) {
  TempDir dir;
  const std::string p = dir / "ok";
  {
    TokenFileWriter w(p, 2, 100);
    w.add_document(std::vector<int32_t>{1, 2, 3, 4});
    w.add_document(std::vector<int32_t>{5, 6});
    w.finish();
  }
  const std::string idx = slurp(p + ".idx"), bin = slurp(p + ".bin");
  auto with = [&](std::string i, std::string b) {
    write_file(dir / "bad.idx", i);
    write_file(dir / "bad.bin", b);
    return throw_message([&] { TokenCorpus::open({dir / "bad"}, 0, 1); });
  };
  auto patch = [&](size_t at, uint64_t v, int bytes) {
    std::string i = idx;
    std::memcpy(i.data() + at, &v, bytes);
    return i;
  };
  struct Case {
    std::string name, idx, bin, want;
  };
  std::vector<Case> cases = {
      {"missing", "", "", ""},
      {"short header", idx.substr(0, 20), bin, "shorter than the 48-byte header"},
      {"magic", "MMIDIDX\0\0" + idx.substr(9), bin, "bad magic"},
      {"version", patch(8, 7, 4), bin, "version 7"},
      {"width", patch(12, 3, 4), bin, "token width 3"},
      {"doc count", patch(16, 5, 8), bin, "says 5 documents"},
      {"huge doc count", patch(16, ~uint64_t{0}, 8), bin, "documents"},
      {"token count", patch(24, 9, 8), bin, "last offset 6 is not the token count 9"},
      {"wrapping token count", patch(24, uint64_t{1} << 62, 8), "", "not plausible"},
      {"unknown flags", patch(40, 2, 8), bin, "flags 0x2 has bits this build does not know"},
      {"mask flag without a mask", patch(40, 1, 8), bin, "cannot open"},
      {"first offset", patch(48, 1, 8), bin, "offsets[0] is 1"},
      {"decreasing", patch(56, 7, 8), bin, "offsets[1] = 7"},
      {"truncated offsets", idx.substr(0, idx.size() - 3), bin, "bytes of offsets"},
      {"short bin", idx, bin.substr(0, 10), "10 bytes, but"},
      {"long bin", idx, bin + "xx", "14 bytes, but"},
  };
  {  // version 1: the flags field was reserved and must be 0
    std::string v1 = patch(8, 1, 4);
    const uint64_t one = 1;
    std::memcpy(v1.data() + 40, &one, 8);
    cases.push_back({"v1 reserved", v1, bin, "reserved header field is not 0"});
  }
  for (const auto& c : cases) {
    std::string m;
    if (c.name == "missing") {
      m = throw_message([&] { TokenCorpus::open({dir / "nothing"}, 0, 1); });
      EXPECT_NE(m.find("nothing.idx"), std::string::npos) << m;
      continue;
    }
    m = with(c.idx, c.bin);
    EXPECT_NE(m.find(c.want), std::string::npos) << c.name << ": " << m;
    EXPECT_NE(m.find("bad."), std::string::npos) << c.name << ": names the file: " << m;
  }
}

TEST(RingctlTokenize, CommonLicensesRoundTrip) {
  ASSERT_FALSE(model_path().empty());
  TempDir dir;
  const std::string out = dir / "lic";
  ASSERT_EQ(run(std::string(RINGCTL) + " tokenize --tokenizer " + model_path() + " -o " + out +
                " " + kLicenses + " 2> " + dir / "err"),
            0)
      << slurp(dir / "err");
  const std::string err = slurp(dir / "err");
  EXPECT_NE(err.find("MB/s"), std::string::npos) << err;  // progress (plain: not a terminal)
  EXPECT_NE(err.find("ETA"), std::string::npos) << err;
  EXPECT_NE(err.find("wrote " + out + ".bin and " + out + ".idx"), std::string::npos) << err;
  auto f = TokenFile::open(out);
  EXPECT_EQ(f->width(), 2);
  EXPECT_EQ(f->vocab(), 1000u);
  auto tok = Tokenizer::load(model_path());
  TextCorpus text = TextCorpus::load({kLicenses}, {.max_doc_len = 0, .min_doc_len = 1});
  ASSERT_EQ(f->num_docs(), text.num_docs());
  auto c = TokenCorpus::open({out}, 0, 1);
  for (int64_t i = 0; i < text.num_docs(); ++i) {
    auto b = text.doc(i);
    auto ids = c->doc(i);
    ASSERT_EQ(ids.front(), tok->bos_id());
    ASSERT_EQ(ids.back(), tok->eos_id());
    ASSERT_EQ(tok->decode(ids), std::string(b.begin(), b.end())) << "document " << i;
  }
  // uint32 on request; bad input is a clear error.
  ASSERT_EQ(run(std::string(RINGCTL) + " tokenize -q --dtype uint32 --tokenizer " + model_path() +
                " -o " + dir / "w4" + " " + kLicenses),
            0);
  EXPECT_EQ(TokenFile::open(dir / "w4.idx")->width(), 4);
  EXPECT_EQ(TokenCorpus::open({dir / "w4"}, 0, 1)->content_hash(), c->content_hash());
  EXPECT_EQ(run(std::string(RINGCTL) + " tokenize --tokenizer " + model_path() + " -o " +
                dir / "x /nonexistent 2> " + dir / "err2"),
            1 << 8);
  EXPECT_NE(slurp(dir / "err2").find("cannot read '/nonexistent'"), std::string::npos);
}

TEST(RingctlTokenize, IndexesAFlatNanoGptBin) {
  TempDir dir;
  // Flat uint16 ids, documents separated by the GPT-2 EOT id, the last one without it.
  std::vector<uint16_t> flat = {10, 11, 50256, 12, 50256, 13, 14, 15};
  write_file(dir / "train.bin",
             std::string(reinterpret_cast<const char*>(flat.data()), flat.size() * 2));
  ASSERT_EQ(run(std::string(RINGCTL) + " tokenize --index-flat " + dir / "train.bin" +
                " --vocab 50304 2> " + dir / "err"),
            0)
      << slurp(dir / "err");
  EXPECT_NE(slurp(dir / "err").find("3 documents"), std::string::npos) << slurp(dir / "err");
  auto c = TokenCorpus::open({dir / "train"}, 0, 1);
  ASSERT_EQ(c->num_docs(), 3);
  EXPECT_EQ(c->doc(0), (std::vector<int32_t>{10, 11, 50256}));
  EXPECT_EQ(c->doc(1), (std::vector<int32_t>{12, 50256}));
  EXPECT_EQ(c->doc(2), (std::vector<int32_t>{13, 14, 15}));
  EXPECT_EQ(TokenFile::open(dir / "train")->vocab(), 50304u);
  // An odd byte count is refused, naming the file.
  write_file(dir / "odd.bin", "abc");
  EXPECT_EQ(run(std::string(RINGCTL) + " tokenize --index-flat " + dir / "odd.bin" + " 2> " +
                dir / "err2"),
            1 << 8);
  EXPECT_NE(slurp(dir / "err2").find("odd.bin': 3 bytes is not a whole number"), std::string::npos)
      << slurp(dir / "err2");
}

TEST(TokenSpec, ValidationReadsThePieceCount) {
  ASSERT_FALSE(model_path().empty());
  auto load = [](int vocab, const std::string& data) {
    std::string y = "job: {name: t}\nmodel: {layers: 1, d_model: 32, heads: 2, vocab: " +
                    std::to_string(vocab) + "}\ndata: {seq_len: 256, " + data +
                    "}\ntrain: {steps: 2}\n";
    auto r = ring::spec::load_spec_string(y, "t.yaml");
    std::string all;
    for (const auto& d : r.diagnostics) all += d.key + ": " + d.message + "\n";
    return std::make_pair(r.ok(), all);
  };
  const std::string tok = "tokenizer: " + model_path();
  auto r = load(1000, "source: text, paths: [/x], " + tok);
  EXPECT_TRUE(r.first) << r.second;
  r = load(999, "source: text, paths: [/x], " + tok);
  EXPECT_FALSE(r.first);
  EXPECT_NE(r.second.find("below the 1000 pieces"), std::string::npos) << r.second;
  r = load(300, "source: text, paths: [/x], tokenizer: /nonexistent/tok.model");
  EXPECT_FALSE(r.first);
  EXPECT_NE(r.second.find("data.tokenizer: cannot read the SentencePiece model "
                          "'/nonexistent/tok.model'"),
            std::string::npos)
      << r.second;
  r = load(300, "source: text, paths: [/x], tokenizer: /etc/hostname");
  EXPECT_NE(r.second.find("not a SentencePiece model"), std::string::npos) << r.second;
  r = load(300, "source: text, paths: [/x], tokenizer: /dev/zero");
  EXPECT_NE(r.second.find("not a regular file"), std::string::npos) << r.second;
  r = load(200, "source: text, paths: [/x]");  // byte-level
  EXPECT_NE(r.second.find("below 256"), std::string::npos) << r.second;
  r = load(200, "source: tokens, paths: [/x]");
  EXPECT_TRUE(r.first) << r.second;
  // A token dataset's .idx records its vocab: checked when the file is there.
  TempDir dir;
  {
    TokenFileWriter w(dir / "ds", 2, 1000);
    w.add_document(std::vector<int32_t>{1, 2, 3});
    w.finish();
  }
  r = load(999, "source: tokens, paths: [" + dir / "ds.bin" + "]");
  EXPECT_NE(r.second.find("model.vocab (999) is below the vocab 1000 recorded in"),
            std::string::npos)
      << r.second;
  r = load(1000, "source: tokens, paths: [" + dir / "ds" + "]");
  EXPECT_TRUE(r.first) << r.second;
  r = load(256, "source: tokens");
  EXPECT_NE(r.second.find("data.source is tokens but data.paths is empty"), std::string::npos)
      << r.second;
}

TEST(TokenSpec, MakeSourceReadsTokenizerAndTokenDatasets) {
  ASSERT_FALSE(model_path().empty());
  ring::spec::DataSection d;
  d.source = ring::spec::DataSource::kText;
  d.paths = {kLicenses};
  d.tokenizer = model_path();
  d.seq_len = 512;
  d.pack = true;
  d.min_doc_len = 16;
  d.seed = 2;
  auto src = make_source(d);
  EXPECT_EQ(src->identity().source, "text");
  int bos = 0, eos = 0;
  for (int i = 0; i < 30; ++i) {
    Sequence s = src->next_sequence();
    check_sequence(s, 1000);
    bos += static_cast<int>(std::count(s.tokens.begin(), s.tokens.end(), 1));
    eos += static_cast<int>(std::count(s.tokens.begin(), s.tokens.end(), 2));
  }
  EXPECT_GT(bos, 0);  // documents start with BOS and end with EOS
  EXPECT_GT(eos, 0);
  // The same ids written to a token dataset: the tokens source gives the same sequences.
  auto tok = Tokenizer::load(model_path());
  TextCorpus text = TextCorpus::load({kLicenses}, {.max_doc_len = 0, .min_doc_len = 1});
  TempDir dir;
  TokenFileWriter w(dir / "lic", 2, 1000);
  for (int64_t i = 0; i < text.num_docs(); ++i) {
    auto b = text.doc(i);
    w.add_document(
        tok->encode_document(std::string_view(reinterpret_cast<const char*>(b.data()), b.size())));
  }
  w.finish();
  ring::spec::DataSection t = d;
  t.source = ring::spec::DataSource::kTokens;
  t.tokenizer = "";
  t.paths = {dir / "lic.bin"};
  auto tsrc = make_source(t);
  EXPECT_EQ(tsrc->identity().source, "tokens");
  EXPECT_EQ(tsrc->identity().content_hash, src->identity().content_hash);
  auto again = make_source(d);
  for (int i = 0; i < 20; ++i) ASSERT_TRUE(same(tsrc->next_sequence(), again->next_sequence()));
}
