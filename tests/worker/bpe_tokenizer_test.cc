// Hugging Face tokenizer.json (worker/data/bpe_tokenizer.h) against Hugging Face's own pure-JS
// tokenizers (@huggingface/tokenizers, run under node by tests/worker/hf_tokenize.mjs): ids
// identical on every document of /usr/share/common-licenses and on an adversarial set, for two
// tokenizers the test builds (tests/worker/bpe_train.py): a Llama-3-style byte-level BPE (split
// regex, merges learned from the licenses) and a Llama-2-style BPE with byte fallback. Also the
// decode round trip, BOS/EOS rules, `ringctl tokenize` with a tokenizer.json, threads, and the
// errors for bad files.
//
// The reference is installed by scripts/install-deps.sh into /var/cache/ringmaster/npm
// (RING_HF_TOKENIZERS_JS overrides the module path); the parity tests skip, saying why, when node
// or the package is missing.
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
#include "worker/data/token_corpus.h"
#include "worker/data/token_file.h"
#include "worker/data/tokenizer.h"

namespace fs = std::filesystem;
using namespace ring::data;
using json = nlohmann::json;

namespace {

const char* kLicenses = "/usr/share/common-licenses";

struct TempDir {
  fs::path p;
  TempDir() {
    char t[] = "/tmp/ring-bpe-XXXXXX";
    p = ::mkdtemp(t);
  }
  ~TempDir() { fs::remove_all(p); }
  std::string operator/(const std::string& n) const { return (p / n).string(); }
};

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

std::string hf_module() {
  if (const char* e = std::getenv("RING_HF_TOKENIZERS_JS")) return e;
  return "/var/cache/ringmaster/npm/node_modules/@huggingface/tokenizers/dist/tokenizers.mjs";
}

// Why the JS reference cannot run, or "" when it can.
std::string reference_missing() {
  if (std::system("command -v node >/dev/null 2>&1") != 0)
    return "node is not installed (scripts/install-deps.sh installs nodejs)";
  if (!fs::exists(hf_module()))
    return "@huggingface/tokenizers is not at " + hf_module() +
           " (scripts/install-deps.sh installs it; RING_HF_TOKENIZERS_JS overrides)";
  return "";
}

// The two tokenizers, built once per test binary.
struct Built {
  TempDir dir;
  std::string bytelevel, bytefallback;  // directories holding tokenizer.json
  Built() {
    for (const char* style : {"bytelevel", "bytefallback"}) {
      const std::string out = dir / style;
      const std::string cmd = "/usr/bin/python3 " + std::string(RING_SOURCE_DIR) +
                              "/tests/worker/bpe_train.py --style " + style + " --corpus " +
                              kLicenses + " --out " + out + " --merges 2000";
      if (std::system(cmd.c_str()) != 0) ADD_FAILURE() << "failed: " << cmd;
      (std::string(style) == "bytelevel" ? bytelevel : bytefallback) = out;
    }
  }
};

const Built& built() {
  static Built b;
  return b;
}

// The adversarial inputs: name -> bytes.
std::vector<std::pair<std::string, std::string>> adversarial() {
  std::string spaces = "a" + std::string(200, ' ') + "b\n\n\n   \t\t  \r\n  c   " +
                       std::string(70, '\n') + std::string(33, ' ');
  std::string long_word = std::string(1000, 'x') + "abc";
  for (int i = 0; i < 300; ++i) long_word += "ab";
  return {
      {"emoji", "Hello \xF0\x9F\x91\x8B\xF0\x9F\x8F\xBD world \xF0\x9F\x87\xA9\xF0\x9F\x87\xAA "
                "family \xF0\x9F\x91\xA8\xE2\x80\x8D\xF0\x9F\x91\xA9\xE2\x80\x8D\xF0\x9F\x91\xA7 "
                "\xF0\x9F\x98\x80\xF0\x9F\x98\x80\xF0\x9F\x98\x80!!! done"},
      {"cjk", "\xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E\xE3\x81\xAE\xE3\x83\x86\xE3\x82\xAD\xE3\x82"
              "\xB9\xE3\x83\x88\xE3\x81\xA8\xE4\xB8\xAD\xE6\x96\x87\xE6\x96\x87\xE6\x9C\xAC\xEF"
              "\xBC\x8C\xED\x95\x9C\xEA\xB5\xAD\xEC\x96\xB4 \xED\x85\x8D\xEC\x8A\xA4\xED\x8A\xB8"
              "\xE3\x80\x82 GPL\xE3\x81\xAE\xE6\x9D\xA1\xE4\xBB\xB6"},
      {"combining", "e\xCC\x81 n\xCC\x83 a\xCC\x88\xCC\x84 Z\xCD\x91\xCD\x92\xCD\x97 caf\xC3\xA9 "
                    "cafe\xCC\x81 na\xC3\xAFve \xE0\xA4\xA8\xE0\xA4\xBF\xE0\xA4\xB9\xE0\xA4\xBE"},
      {"spaces", spaces},
      {"digits", "1234567890123 3.14159 1,000,000 00000000000000000000 \xD9\xA3\xD9\xA4 "
                 "\xE2\x85\xA7 \xC2\xB2 v2.0.1"},
      {"contractions", "I'M he'S They'LL we've DON'T it's 'tis \xE2\x80\x99s '\xC5\xBF 'K"},
      {"unicode_spaces", "a\xC2\xA0" "b\xE2\x80\x83" "c\xE3\x80\x80" "d\xC2\x85" "e\xE1\xA0\x8E"
                         "f\xEF\xBB\xBF" "g\xE2\x80\xA8" "h\x0B" "i\x0C" "j \t\n"},
      {"long_word", long_word},
      {"empty", ""},
      {"one_space", " "},
      {"invalid_utf8", "abc\xFF\xFE def \xC3\x28 \xE2\x82 \xF0\x9F\x98 end\x80 \xED\xA0\x80 "
                       "\xC0\xAF \xF4\x90\x80\x80 \xE0\x80 tail\xC3"},
      {"specials_bytelevel",
       "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>"
       "text  <|pad|>  padded  <|pad|>x ringmaster ringmasters<|end_of_text|><|begin_of_text"
       "<|eot_id|><|eot_id|> <s></s><unk>"},
      {"specials_bytefallback", "<s>Hello</s> <s> world <unk>x</s></s> <s"},
  };
}

bool valid_utf8(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto b = static_cast<unsigned char>(s[i]);
    int n = b < 0x80 ? 1 : (b >= 0xC2 && b <= 0xDF) ? 2 : (b >= 0xE0 && b <= 0xEF) ? 3
                                                       : (b >= 0xF0 && b <= 0xF4) ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    for (int k = 1; k < n; ++k)
      if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return false;
    const auto c1 = static_cast<unsigned char>(n > 1 ? s[i + 1] : 0);
    if ((b == 0xE0 && c1 < 0xA0) || (b == 0xED && c1 > 0x9F) || (b == 0xF0 && c1 < 0x90) ||
        (b == 0xF4 && c1 > 0x8F))
      return false;
    i += n;
  }
  return true;
}

struct Input {
  std::string name, path, bytes;
};

std::vector<Input> inputs(const std::string& dir) {
  std::vector<Input> in;
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(kLicenses))
    if (e.is_regular_file()) files.push_back(e.path());
  std::sort(files.begin(), files.end());
  for (const auto& f : files) in.push_back({f.filename().string(), f.string(), slurp(f.string())});
  fs::create_directories(dir);
  for (auto& [name, bytes] : adversarial()) {
    const std::string p = dir + "/" + name;
    write_file(p, bytes);
    in.push_back({name, p, bytes});
  }
  return in;
}

std::vector<std::vector<int32_t>> reference_ids(const std::string& tok_dir,
                                                const std::vector<Input>& in,
                                                const std::string& work) {
  std::string list;
  for (const auto& i : in) list += i.path + "\n";
  write_file(work + "/list", list);
  const std::string cmd = "node " + std::string(RING_SOURCE_DIR) + "/tests/worker/hf_tokenize.mjs " +
                          hf_module() + " " + tok_dir + " " + work + "/list > " + work + "/ref";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  std::vector<std::vector<int32_t>> out;
  std::istringstream lines(slurp(work + "/ref"));
  for (std::string line; std::getline(lines, line);) out.push_back(json::parse(line));
  return out;
}

void check_parity(const std::string& tok_dir) {
  const std::string why = reference_missing();
  if (!why.empty()) GTEST_SKIP() << why;
  TempDir work;
  auto in = inputs(work / "in");
  auto ref = reference_ids(tok_dir, in, work.p.string());
  ASSERT_EQ(ref.size(), in.size());
  auto tok = Tokenizer::load(tok_dir + "/tokenizer.json");
  EXPECT_STREQ(tok->format(), "tokenizer.json");
  int64_t tokens = 0;
  for (size_t i = 0; i < in.size(); ++i) {
    std::vector<int32_t> ids;
    tok->encode(in[i].bytes, ids);
    tokens += static_cast<int64_t>(ids.size());
    EXPECT_EQ(ids, ref[i]) << in[i].name << ": ids differ from @huggingface/tokenizers";
    std::vector<int32_t> again;  // the second time comes from the per-thread cache
    tok->encode(in[i].bytes, again);
    EXPECT_EQ(again, ids) << in[i].name;
    const bool has_specials = in[i].name.rfind("specials_", 0) == 0;
    if (valid_utf8(in[i].bytes) && !has_specials) {
      EXPECT_EQ(tok->decode(ids), in[i].bytes) << in[i].name << ": decode round trip";
    }
  }
  EXPECT_GT(tokens, 50000);  // the licenses were really encoded
}

std::string load_error(const std::string& path) {
  try {
    Tokenizer::load(path);
  } catch (const DataError& e) {
    return e.what();
  }
  return "(no DataError)";
}

}  // namespace

TEST(BpeTokenizer, ByteLevelIdsMatchHuggingFaceJs) {
  check_parity(built().bytelevel);
}

TEST(BpeTokenizer, ByteFallbackIdsMatchHuggingFaceJs) {
  check_parity(built().bytefallback);
}

TEST(BpeTokenizer, SpecialTokensAndByteFallbackAreUsed) {
  auto bl = Tokenizer::load(built().bytelevel + "/tokenizer.json");
  std::vector<int32_t> ids;
  bl->encode("<|eot_id|>x<|eot_id|>", ids);
  ASSERT_EQ(ids.size(), 3u);
  EXPECT_EQ(ids[0], ids[2]);
  EXPECT_EQ(bl->decode(ids), "<|eot_id|>x<|eot_id|>");
  // lstrip/rstrip: the spaces around <|pad|> go with it.
  ids.clear();
  bl->encode("a  <|pad|>  b", ids);
  std::vector<int32_t> ab;
  bl->encode("a<|pad|>b", ab);
  EXPECT_EQ(ids, ab);

  auto bf = Tokenizer::load(built().bytefallback + "/tokenizer.json");
  ids.clear();
  bf->encode("\xF0\x9F\x98\x80", ids);  // not in the vocabulary: four <0xXX> tokens
  ASSERT_EQ(ids.size(), 5u);            // "▁" then the four bytes
  EXPECT_EQ(ids[1], 3 + 0xF0);
  EXPECT_EQ(ids[4], 3 + 0x80);
  EXPECT_EQ(bf->decode(ids), "\xF0\x9F\x98\x80");
}

TEST(BpeTokenizer, BosEosFromConfigElseFromTemplate) {
  auto bl = Tokenizer::load(built().bytelevel + "/tokenizer.json");
  const json j = json::parse(slurp(built().bytelevel + "/tokenizer.json"));
  auto id_of = [&](const std::string& content) {
    for (const auto& t : j["added_tokens"])
      if (t["content"] == content) return t["id"].get<int32_t>();
    return -2;
  };
  EXPECT_EQ(bl->bos_id(), id_of("<|begin_of_text|>"));
  EXPECT_EQ(bl->eos_id(), id_of("<|end_of_text|>"));
  EXPECT_EQ(bl->vocab_size(), id_of("ringmaster") + 1);
  auto doc = bl->encode_document("hi");
  EXPECT_EQ(doc.front(), bl->bos_id());
  EXPECT_EQ(doc.back(), bl->eos_id());

  // No tokenizer_config.json: BOS from the TemplateProcessing, no EOS.
  auto bf = Tokenizer::load(built().bytefallback + "/tokenizer.json");
  EXPECT_EQ(bf->bos_id(), 1);
  EXPECT_EQ(bf->eos_id(), -1);

  // The config wins over the template, token by token.
  TempDir d;
  fs::copy_file(built().bytefallback + "/tokenizer.json", d / "tokenizer.json");
  write_file(d / "tokenizer_config.json", R"({"eos_token": {"content": "</s>"}})");
  auto c = Tokenizer::load(d / "tokenizer.json");
  EXPECT_EQ(c->bos_id(), 1);
  EXPECT_EQ(c->eos_id(), 2);
  write_file(d / "tokenizer_config.json", R"({"bos_token": "<nope>"})");
  const std::string e = load_error(d / "tokenizer.json");
  EXPECT_NE(e.find("tokenizer_config.json"), std::string::npos) << e;
  EXPECT_NE(e.find("bos_token"), std::string::npos) << e;
  EXPECT_NE(e.find("<nope>"), std::string::npos) << e;
}

TEST(BpeTokenizer, DetectedByContentAndMultiThreadedCorpusEncodeMatches) {
  TempDir d;
  // A name without .json: detected by its first byte.
  fs::copy_file(built().bytelevel + "/tokenizer.json", d / "tok");
  auto tok = Tokenizer::load(d / "tok");
  EXPECT_STREQ(tok->format(), "tokenizer.json");
  CorpusOptions co;
  co.max_doc_len = 0;
  co.min_doc_len = 1;
  auto text = TextCorpus::load({kLicenses}, co);
  auto one = TokenCorpus::encode(text, *tok, 0, 1, 1);
  auto four = TokenCorpus::encode(text, *tok, 0, 1, 4);
  ASSERT_EQ(one->num_docs(), four->num_docs());
  EXPECT_EQ(one->content_hash(), four->content_hash());
  for (int64_t i = 0; i < text.num_docs(); ++i) {
    auto dd = text.doc(i);
    EXPECT_EQ(one->doc(i), tok->encode_document(std::string_view(
                               reinterpret_cast<const char*>(dd.data()), dd.size())));
  }
}

TEST(BpeTokenizer, RingctlTokenizeReadsTokenizerJson) {
  TempDir d;
  const std::string tj = built().bytelevel + "/tokenizer.json";
  const std::string cmd = std::string(RINGCTL) + " tokenize -q --threads 2 --tokenizer " + tj +
                          " -o " + (d / "ds") + " " + kLicenses;
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  auto f = TokenFile::open(d / "ds");
  auto tok = Tokenizer::load(tj);
  CorpusOptions co;
  co.max_doc_len = 0;
  co.min_doc_len = 1;
  co.max_total_bytes = int64_t{1} << 40;
  auto text = TextCorpus::load({kLicenses}, co);
  ASSERT_EQ(f->num_docs(), text.num_docs());
  EXPECT_EQ(f->width(), 2);
  for (int64_t i = 0; i < f->num_docs(); ++i) {
    auto dd = text.doc(i);
    auto want = tok->encode_document(
        std::string_view(reinterpret_cast<const char*>(dd.data()), dd.size()));
    std::vector<int32_t> got(static_cast<size_t>(f->doc_len(i)));
    for (int64_t k = 0; k < f->doc_len(i); ++k) {
      uint16_t v;
      std::memcpy(&v, f->data() + 2 * (f->doc_begin(i) + k), 2);
      got[k] = v;
    }
    EXPECT_EQ(got, want) << "document " << i;
  }
}

TEST(BpeTokenizer, BadFilesNameTheFileAndField) {
  TempDir d;
  const json good = json::parse(slurp(built().bytelevel + "/tokenizer.json"));
  struct Case {
    std::string name;
    std::function<void(json&)> edit;
    std::vector<std::string> expect;
  };
  const std::vector<Case> cases = {
      {"nfc", [](json& j) { j["normalizer"] = {{"type", "NFC"}}; },
       {"normalizer.type", "'NFC' is not supported"}},
      {"nested_nfkc",
       [](json& j) {
         j["normalizer"] = {{"type", "Sequence"},
                            {"normalizers", {{{"type", "Prepend"}, {"prepend", "x"}},
                                             {{"type", "NFKC"}}}}};
       },
       {"normalizer.normalizers[1].type", "NFKC"}},
      {"wordpiece", [](json& j) { j["model"]["type"] = "WordPiece"; },
       {"model.type", "'WordPiece' is not supported"}},
      {"unigram", [](json& j) { j["model"]["type"] = "Unigram"; }, {"model.type", "Unigram"}},
      {"metaspace", [](json& j) { j["pre_tokenizer"] = {{"type", "Metaspace"}}; },
       {"pre_tokenizer.type", "'Metaspace' is not supported"}},
      {"bad_regex",
       [](json& j) { j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(ab"; },
       {"pre_tokenizer.pretokenizers[0].pattern", "does not compile"}},
      {"merge_oov", [](json& j) { j["model"]["merges"][3] = {"qqq", "zzz"}; },
       {"model.merges[3]", "qqq"}},
      {"merge_form", [](json& j) { j["model"]["merges"][0] = 7; }, {"model.merges[0]", "7"}},
      {"no_vocab", [](json& j) { j["model"].erase("vocab"); }, {"model.vocab", "missing"}},
      {"split_invert",
       [](json& j) { j["pre_tokenizer"]["pretokenizers"][0]["invert"] = true; },
       {"pre_tokenizer.pretokenizers[0].invert"}},
      {"dropout", [](json& j) { j["model"]["dropout"] = 0.1; }, {"model.dropout", "0.1"}},
      {"decoder", [](json& j) { j["decoder"] = {{"type", "WordPiece"}}; },
       {"decoder.type", "WordPiece"}},
  };
  for (const auto& c : cases) {
    json j = good;
    c.edit(j);
    const std::string p = d / (c.name + ".json");
    write_file(p, j.dump());
    const std::string e = load_error(p);
    EXPECT_NE(e.find(p), std::string::npos) << c.name << ": " << e;
    for (const auto& want : c.expect)
      EXPECT_NE(e.find(want), std::string::npos) << c.name << ": '" << want << "' not in: " << e;
  }
  write_file(d / "broken.json", "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}");
  const std::string e = load_error(d / "broken.json");
  EXPECT_NE(e.find(d / "broken.json"), std::string::npos) << e;
  EXPECT_NE(e.find("not valid JSON"), std::string::npos) << e;
  write_file(d / "ids.bin", std::string("\x0a\x05hello", 7));  // not JSON: SentencePiece's error
  EXPECT_NE(load_error(d / "ids.bin").find("SentencePiece"), std::string::npos);
}

TEST(BpeTokenizer, SpecValidationReadsTheVocabOfATokenizerJson) {
  auto load = [](int vocab, const std::string& tok) {
    std::string y = "job: {name: t}\nmodel: {layers: 1, d_model: 32, heads: 2, vocab: " +
                    std::to_string(vocab) + "}\ndata: {seq_len: 256, source: text, paths: [/x], "
                    "tokenizer: " + tok + "}\ntrain: {steps: 2}\n";
    auto r = ring::spec::load_spec_string(y, "t.yaml");
    std::string all;
    for (const auto& d : r.diagnostics) all += d.key + ": " + d.message + "\n";
    return std::make_pair(r.ok(), all);
  };
  const std::string tj = built().bytelevel + "/tokenizer.json";
  const int64_t n = Tokenizer::load(tj)->vocab_size();
  auto r = load(static_cast<int>(n), tj);
  EXPECT_TRUE(r.first) << r.second;
  r = load(static_cast<int>(n - 1), tj);
  EXPECT_FALSE(r.first);
  EXPECT_NE(r.second.find("below the " + std::to_string(n)), std::string::npos) << r.second;
  TempDir d;
  write_file(d / "tokenizer.json", "{\"model\": ");
  r = load(300, d / "tokenizer.json");
  EXPECT_FALSE(r.first);
  EXPECT_NE(r.second.find("cannot read the tokenizer.json"), std::string::npos) << r.second;
}
