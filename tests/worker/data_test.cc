// Tests of worker/data: corpus loading, packing, shuffle, cursor resume, passkey, rank split.
//
// Expected values are computed from the inputs the tests create (documents, seeds), never copied
// from a previous run.
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/spec/parse.h"
#include "worker/data/corpus.h"
#include "worker/data/cursor.h"
#include "worker/data/errors.h"
#include "worker/data/loader.h"
#include "worker/data/passkey.h"
#include "worker/data/sequence.h"
#include "worker/data/shuffle.h"
#include "worker/data/split.h"

namespace fs = std::filesystem;
using namespace ring::data;
using ring::spec::CausalBalance;

namespace {

// A fresh directory under the system temp dir, removed at the end of the test.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "ring_data_test_XXXXXX").string();
    path_ = ::mkdtemp(tmpl.data());
  }
  ~TempDir() {
    std::error_code ec;
    fs::permissions(path_, fs::perms::owner_all, fs::perm_options::add, ec);
    fs::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  std::string write(const std::string& rel, const std::string& bytes) const {
    fs::path p = fs::path(path_) / rel;
    fs::create_directories(p.parent_path());
    std::ofstream(p, std::ios::binary) << bytes;
    return p.string();
  }
  std::string write_gz(const std::string& rel, const std::string& bytes) const {
    fs::path p = fs::path(path_) / rel;
    fs::create_directories(p.parent_path());
    gzFile f = gzopen(p.c_str(), "wb");
    EXPECT_NE(f, nullptr);
    EXPECT_EQ(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())),
              static_cast<int>(bytes.size()));
    gzclose(f);
    return p.string();
  }

 private:
  std::string path_;
};

// Text of `n` bytes, printable ASCII with newlines, different for each `salt`.
std::string text_of(size_t n, uint64_t salt) {
  std::mt19937_64 rng(salt);
  std::string s(n, ' ');
  for (auto& c : s) {
    uint64_t r = rng() % 40;
    c = r == 0 ? '\n' : r < 8 ? ' ' : static_cast<char>('a' + r % 26);
  }
  return s;
}

std::string doc_string(const TextCorpus& c, int64_t i) {
  auto d = c.doc(i);
  return std::string(d.begin(), d.end());
}

std::vector<std::string> random_docs(int n, int min_len, int max_len, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::string> docs;
  for (int i = 0; i < n; ++i)
    docs.push_back(text_of(min_len + rng() % (max_len - min_len + 1), seed * 1000 + i));
  return docs;
}

std::shared_ptr<const TextCorpus> corpus_of(const std::vector<std::string>& docs,
                                            CorpusOptions o = {}) {
  return std::make_shared<const TextCorpus>(TextCorpus::from_documents(docs, o));
}

std::string throw_message(const std::function<void()>& f) {
  try {
    f();
  } catch (const DataError& e) {
    return e.what();
  }
  return "<no DataError thrown>";
}

// Segment s of `seq` as a string of its tokens.
std::string segment_text(const Sequence& seq, int64_t s) {
  std::string out;
  for (int32_t i = seq.cu_seqlens[s]; i < seq.cu_seqlens[s + 1]; ++i)
    out.push_back(static_cast<char>(seq.tokens[i]));
  return out;
}

bool same_sequence(const Sequence& a, const Sequence& b) {
  if (a.segments.size() != b.segments.size()) return false;
  for (size_t i = 0; i < a.segments.size(); ++i)
    if (a.segments[i].doc != b.segments[i].doc || a.segments[i].offset != b.segments[i].offset)
      return false;
  return a.tokens == b.tokens && a.labels == b.labels && a.positions == b.positions &&
         a.doc_ids == b.doc_ids && a.cu_seqlens == b.cu_seqlens;
}

}  // namespace

// ---- corpus ------------------------------------------------------------------------------------

TEST(Corpus, ReadsTreeSortedSkipsBinaryEmptyAndDuplicates) {
  TempDir t;
  const std::string a = text_of(300, 1), b = text_of(200, 2), c = text_of(500, 3),
                    d = text_of(150, 4);
  t.write("b/nested/deep.txt", b);
  t.write("a.txt", a);
  t.write_gz("c.txt.gz", c);
  t.write("z_last.txt", d);
  t.write("empty.txt", "");
  std::string bin = text_of(400, 5);
  bin[17] = '\0';
  t.write("tool.bin", bin);
  std::string latin(300, '\xe9');  // not UTF-8 at all
  t.write("latin1.dat", latin);
  t.write_gz("bin.gz", bin);
  t.write("bad.gz", std::string("\x1f\x8b\x08\x00", 4) + "garbage that is not deflate");
  fs::create_symlink(fs::path(t.path()) / "a.txt", fs::path(t.path()) / "link_to_a.txt");
  fs::create_directory_symlink(t.path(), fs::path(t.path()) / "b/nested/loop");
  fs::create_symlink(fs::path(t.path()) / "missing", fs::path(t.path()) / "broken");
  ASSERT_EQ(::mkfifo((fs::path(t.path()) / "fifo").c_str(), 0600), 0);  // must not block

  TextCorpus corpus = TextCorpus::load({t.path()}, CorpusOptions{.min_doc_len = 16});
  // Sorted by name at each level: a.txt, b/nested/deep.txt, c.txt.gz, z_last.txt.
  ASSERT_EQ(corpus.num_docs(), 4);
  EXPECT_EQ(doc_string(corpus, 0), a);
  EXPECT_EQ(doc_string(corpus, 1), b);
  EXPECT_EQ(doc_string(corpus, 2), c);
  EXPECT_EQ(doc_string(corpus, 3), d);
  EXPECT_EQ(corpus.total_tokens(), static_cast<int64_t>(a.size() + b.size() + c.size() + d.size()));
  const CorpusStats& s = corpus.stats();
  EXPECT_EQ(s.files_used, 4);
  EXPECT_EQ(s.files_empty, 1);
  EXPECT_EQ(s.files_binary, 3);     // tool.bin, latin1.dat, bin.gz
  EXPECT_EQ(s.files_duplicate, 1);  // link_to_a.txt
  EXPECT_EQ(s.entries_skipped, 3);  // bad.gz, broken, fifo
  EXPECT_FALSE(s.capped);
}

TEST(Corpus, CutsLongDocumentsAndDropsShortPieces) {
  const std::string doc = text_of(100, 9);
  TextCorpus c = TextCorpus::from_documents({doc, "short"},
                                            CorpusOptions{.max_doc_len = 30, .min_doc_len = 15});
  ASSERT_EQ(c.num_docs(), 3);  // 30 + 30 + 30; the last 10 and "short" are dropped
  for (int i = 0; i < 3; ++i) EXPECT_EQ(doc_string(c, i), doc.substr(30 * i, 30));
  EXPECT_EQ(c.stats().bytes_dropped, 10 + 5);

  TextCorpus c2 =
      TextCorpus::from_documents({doc}, CorpusOptions{.max_doc_len = 30, .min_doc_len = 5});
  ASSERT_EQ(c2.num_docs(), 4);
  EXPECT_EQ(doc_string(c2, 3), doc.substr(90));
}

TEST(Corpus, ByteCapStopsLoadingInSortedOrder) {
  TempDir t;
  t.write("1.txt", text_of(1000, 1));
  t.write("2.txt", text_of(1000, 2));
  t.write("3.txt", text_of(1000, 3));
  TextCorpus c =
      TextCorpus::load({t.path()}, CorpusOptions{.min_doc_len = 1, .max_total_bytes = 1500});
  EXPECT_EQ(c.total_tokens(), 1500);
  ASSERT_EQ(c.num_docs(), 2);
  EXPECT_EQ(doc_string(c, 1), text_of(1000, 2).substr(0, 500));
  EXPECT_TRUE(c.stats().capped);
  EXPECT_EQ(c.stats().files_not_loaded, 1);
}

TEST(Corpus, ErrorsNameThePath) {
  TempDir t;
  const std::string missing = t.path() + "/does/not/exist";
  std::string m = throw_message([&] { TextCorpus::load({missing}, {}); });
  EXPECT_NE(m.find(missing), std::string::npos) << m;
  EXPECT_NE(m.find("No such file"), std::string::npos) << m;

  std::string bin(64, 'x');
  bin[3] = '\0';
  t.write("only/binary.bin", bin);
  t.write("only/empty.txt", "");
  m = throw_message([&] { TextCorpus::load({t.path() + "/only"}, {}); });
  EXPECT_NE(m.find("no document"), std::string::npos) << m;
  EXPECT_NE(m.find(t.path() + "/only"), std::string::npos) << m;
  EXPECT_NE(m.find("1 binary"), std::string::npos) << m;

  const std::string corrupt =
      t.write("corrupt.gz", std::string("\x1f\x8b\x08\x00zzzzzzzzzzzz", 16));
  m = throw_message([&] { TextCorpus::load({corrupt}, {}); });
  EXPECT_NE(m.find(corrupt), std::string::npos) << m;

  if (::geteuid() != 0) {  // root reads everything
    t.write("locked/a.txt", text_of(100, 1));
    fs::permissions(t.path() + "/locked", fs::perms::none);
    m = throw_message([&] { TextCorpus::load({t.path() + "/locked"}, {}); });
    EXPECT_NE(m.find(t.path() + "/locked"), std::string::npos) << m;
    fs::permissions(t.path() + "/locked", fs::perms::owner_all);
  }
  m = throw_message([&] { TextCorpus::load({}, {}); });
  EXPECT_NE(m.find("data.paths"), std::string::npos) << m;
}

TEST(Corpus, ContentHashTellsCorporaApart) {
  auto docs = random_docs(10, 20, 80, 3);
  TextCorpus a = TextCorpus::from_documents(docs, {});
  TextCorpus b = TextCorpus::from_documents(docs, {});
  EXPECT_EQ(a.content_hash(), b.content_hash());
  docs[4][7] ^= 1;
  EXPECT_NE(TextCorpus::from_documents(docs, {}).content_hash(), a.content_hash());
  // Same bytes, different boundaries.
  std::vector<std::string> merged = {docs[0] + docs[1]};
  std::vector<std::string> split = {docs[0], docs[1]};
  EXPECT_NE(TextCorpus::from_documents(merged, {}).content_hash(),
            TextCorpus::from_documents(split, {}).content_hash());
}

TEST(Corpus, Utf8Check) {
  auto frac = [](const std::string& s) {
    return invalid_utf8_fraction({reinterpret_cast<const uint8_t*>(s.data()), s.size()});
  };
  EXPECT_EQ(frac("plain ascii"), 0.0);
  EXPECT_EQ(frac("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"), 0.0);
  EXPECT_GT(frac("\xff\xfe\xfd\xfc"), 0.99);
  EXPECT_NEAR(frac("abc\xe9"), 0.0, 1e-12);  // cut at the end of the buffer: not counted
  EXPECT_NEAR(frac("ab\xe9z"), 0.25, 1e-12);
}

// ---- shuffle -----------------------------------------------------------------------------------

TEST(Shuffle, PermutationsDeterministicAndDistinct) {
  for (int64_t n : {0, 1, 2, 7, 1000}) {
    auto p = epoch_permutation(n, 42, 0);
    std::vector<uint32_t> sorted = p;
    std::sort(sorted.begin(), sorted.end());
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(sorted[i], i);
    EXPECT_EQ(p, epoch_permutation(n, 42, 0));
  }
  EXPECT_NE(epoch_permutation(1000, 42, 0), epoch_permutation(1000, 42, 1));
  EXPECT_NE(epoch_permutation(1000, 42, 0), epoch_permutation(1000, 43, 0));
  // std::mt19937_64 is pinned by the standard: the 10000th output is 9981545732273789042.
  std::mt19937_64 g;
  g.discard(9999);
  EXPECT_EQ(g(), 9981545732273789042ull);
}

TEST(Shuffle, UniformBelowIsInRangeAndRoughlyUniform) {
  std::mt19937_64 rng(5);
  std::vector<int> counts(6);
  for (int i = 0; i < 60000; ++i) {
    uint64_t v = uniform_below(rng, 6);
    ASSERT_LT(v, 6u);
    ++counts[v];
  }
  for (int c : counts) EXPECT_NEAR(c, 10000, 500);
  EXPECT_EQ(uniform_below(rng, 1), 0u);
}

// ---- packing loader ----------------------------------------------------------------------------

TEST(Loader, PackedSequencesAreFullAndLabelledPerSegment) {
  auto corpus = corpus_of(random_docs(40, 5, 300, 11));
  TextLoader loader(corpus, {.seq_len = 256, .pack = true, .seed = 3});
  for (int k = 0; k < 60; ++k) {
    Sequence s = loader.next_sequence();
    ASSERT_NO_THROW(check_sequence(s));
    ASSERT_EQ(s.size(), 256);
    EXPECT_EQ(s.pad_begin(), 256);
    for (int64_t seg = 0; seg < s.num_segments(); ++seg) {
      const int64_t b = s.cu_seqlens[seg], e = s.cu_seqlens[seg + 1];
      // The segment is the document's bytes at its offset.
      const auto& src = s.segments[seg];
      EXPECT_EQ(segment_text(s, seg), doc_string(*corpus, src.doc).substr(src.offset, e - b));
      // Segments that end before the sequence does end their document (they were not cut).
      if (e < 256) {
        EXPECT_EQ(src.offset + (e - b), corpus->doc_len(src.doc));
      }
      // A segment after the first starts a document; the first may continue one.
      if (seg > 0) {
        EXPECT_EQ(src.offset, 0);
      }
      for (int64_t i = b; i < e; ++i) {
        EXPECT_EQ(s.doc_ids[i], seg);
        EXPECT_EQ(s.positions[i], i);
        EXPECT_EQ(s.labels[i], i + 1 < e ? s.tokens[i + 1] : kIgnoreLabel);
      }
    }
    EXPECT_EQ(s.valid_labels(), 256 - s.num_segments());
  }
}

// Walks sequences from the start and checks that epoch 0 emits every document exactly once, in
// order, whole, and in the loader's epoch-0 permutation.
void check_epoch_accounting(const std::shared_ptr<const TextCorpus>& corpus, int64_t seq_len,
                            bool pack, int64_t seed) {
  TextLoader loader(corpus, {.seq_len = seq_len, .pack = pack, .seed = seed});
  const std::vector<uint32_t> order0 = loader.epoch_order();
  std::vector<int64_t> next_offset(corpus->num_docs(), 0);
  std::vector<uint32_t> emitted;  // documents in the order they completed
  std::string rebuilt_current;
  int64_t tokens = 0, pad = 0;
  while (static_cast<int64_t>(emitted.size()) < corpus->num_docs()) {
    Sequence s = loader.next_sequence();
    ASSERT_NO_THROW(check_sequence(s));
    for (int64_t seg = 0; seg < s.num_segments(); ++seg) {
      const auto& src = s.segments[seg];
      const int64_t n = s.cu_seqlens[seg + 1] - s.cu_seqlens[seg];
      if (src.doc < 0) {
        pad += n;
        continue;
      }
      if (static_cast<int64_t>(emitted.size()) == corpus->num_docs()) break;  // epoch 1 started
      ASSERT_EQ(src.offset, next_offset[src.doc]) << "document " << src.doc << " out of order";
      EXPECT_EQ(segment_text(s, seg), doc_string(*corpus, src.doc).substr(src.offset, n));
      next_offset[src.doc] += n;
      tokens += n;
      if (next_offset[src.doc] == corpus->doc_len(src.doc)) emitted.push_back(src.doc);
    }
  }
  EXPECT_EQ(emitted, order0);
  EXPECT_EQ(tokens, corpus->total_tokens());
  for (int64_t d = 0; d < corpus->num_docs(); ++d) EXPECT_EQ(next_offset[d], corpus->doc_len(d));
  if (pack) {
    EXPECT_EQ(pad, 0);
  }
}

TEST(Loader, EveryTokenOnceAcrossAnEpoch) {
  auto corpus = corpus_of(random_docs(57, 16, 700, 12));
  check_epoch_accounting(corpus, 128, true, 0);
  check_epoch_accounting(corpus, 1000, true, 5);
  check_epoch_accounting(corpus, 128, false, 9);  // documents longer than 128 continue
}

TEST(Loader, UnpackedSequencesHoldOneDocumentAndPadding) {
  auto corpus = corpus_of(random_docs(20, 16, 100, 13));
  TextLoader loader(corpus, {.seq_len = 128, .pack = false, .seed = 1});
  for (int k = 0; k < 20; ++k) {
    Sequence s = loader.next_sequence();
    ASSERT_NO_THROW(check_sequence(s));
    const int64_t len = corpus->doc_len(s.segments[0].doc);
    ASSERT_EQ(s.num_segments(), 2);
    EXPECT_EQ(s.pad_begin(), len);
    EXPECT_EQ(s.segments[1].doc, -1);
    for (int64_t i = len; i < 128; ++i) {
      EXPECT_EQ(s.labels[i], kIgnoreLabel);
      EXPECT_EQ(s.doc_ids[i], 1);
      EXPECT_EQ(s.tokens[i], kPadToken);
    }
    EXPECT_EQ(s.valid_labels(), len - 1);
  }
}

TEST(Loader, DeterministicForSeedDifferentAcrossSeeds) {
  auto corpus = corpus_of(random_docs(30, 16, 200, 14));
  TextLoader a(corpus, {.seq_len = 200, .seed = 7});
  TextLoader b(corpus, {.seq_len = 200, .seed = 7});
  TextLoader c(corpus, {.seq_len = 200, .seed = 8});
  int differ = 0;
  for (int k = 0; k < 50; ++k) {
    Sequence sa = a.next_sequence(), sb = b.next_sequence(), sc = c.next_sequence();
    EXPECT_TRUE(same_sequence(sa, sb)) << "sequence " << k;
    differ += !same_sequence(sa, sc);
  }
  EXPECT_GT(differ, 40);
  EXPECT_NE(a.epoch_order(), c.epoch_order());
}

TEST(Loader, CursorResumeIsExact) {
  auto corpus = corpus_of(random_docs(25, 16, 400, 15));
  for (bool pack : {true, false}) {
    for (int skip : {0, 1, 7, 23, 40, 61}) {  // several epochs are crossed
      TextLoader ref(corpus, {.seq_len = 160, .pack = pack, .seed = 21});
      for (int k = 0; k < skip; ++k) ref.next_sequence();
      // Through text, as a checkpoint manifest stores it.
      const std::string saved = nlohmann::json(ref.cursor()).dump();
      TextLoader resumed(corpus, {.seq_len = 160, .pack = pack, .seed = 21});
      resumed.seek(nlohmann::json::parse(saved).get<Cursor>());
      EXPECT_EQ(resumed.cursor(), ref.cursor());
      for (int k = 0; k < 30; ++k)
        ASSERT_TRUE(same_sequence(ref.next_sequence(), resumed.next_sequence()))
            << "pack " << pack << " skip " << skip << " step " << k;
    }
  }
}

TEST(Loader, CursorAdvancesAndRollsEpochs) {
  auto corpus = corpus_of({std::string(100, 'a'), std::string(60, 'b')});
  TextLoader l(corpus, {.seq_len = 50, .seed = 0});
  int64_t total = 0;
  Cursor prev = l.cursor();
  EXPECT_EQ(prev.epoch, 0);
  for (int k = 0; k < 10; ++k) {
    l.next_sequence();
    total += 50;
    Cursor c = l.cursor();
    // Tokens consumed, from the cursor: whole epochs, whole documents, then the offset.
    int64_t consumed = c.epoch * corpus->total_tokens() + c.offset;
    auto order = epoch_permutation(2, 0, c.epoch);
    for (int64_t i = 0; i < c.index; ++i) consumed += corpus->doc_len(order[i]);
    EXPECT_EQ(consumed, total);
  }
  EXPECT_EQ(l.cursor().epoch, 3);  // 500 tokens over a 160-token corpus
}

TEST(Loader, CursorMismatchIsRefused) {
  auto corpus = corpus_of(random_docs(10, 16, 100, 16));
  TextLoader l(corpus, {.seq_len = 64, .seed = 1});
  l.next_sequence();
  Cursor c = l.cursor();

  TextLoader other_seed(corpus, {.seq_len = 64, .seed = 2});
  std::string m = throw_message([&] { other_seed.seek(c); });
  EXPECT_NE(m.find("data.seed: the cursor was saved with 1, this loader has 2"), std::string::npos)
      << m;

  TextLoader other_len(corpus, {.seq_len = 128, .seed = 1});
  m = throw_message([&] { other_len.seek(c); });
  EXPECT_NE(m.find("data.seq_len"), std::string::npos) << m;

  auto docs = random_docs(10, 16, 100, 16);
  docs[3][0] ^= 1;
  TextLoader other_data(corpus_of(docs), {.seq_len = 64, .seed = 1});
  m = throw_message([&] { other_data.seek(c); });
  EXPECT_NE(m.find("content hash"), std::string::npos) << m;

  Cursor bad = c;
  bad.index = 10;
  m = throw_message([&] { l.seek(bad); });
  EXPECT_NE(m.find("outside the corpus"), std::string::npos) << m;
  bad = c;
  bad.offset = 100000;
  const Cursor before = l.cursor();
  m = throw_message([&] { l.seek(bad); });
  EXPECT_NE(m.find("offset 100000"), std::string::npos) << m;
  EXPECT_EQ(l.cursor(), before);  // unchanged after a refused seek

  nlohmann::json j = c;
  j.erase("offset");
  m = throw_message([&] { (void)j.get<Cursor>(); });
  EXPECT_NE(m.find("missing field cursor.offset"), std::string::npos) << m;
  j = c;
  j["data"]["content_hash"] = 5;
  m = throw_message([&] { (void)j.get<Cursor>(); });
  EXPECT_NE(m.find("content_hash"), std::string::npos) << m;
  j = c;
  j["version"] = 99;
  m = throw_message([&] { (void)j.get<Cursor>(); });
  EXPECT_NE(m.find("version 99"), std::string::npos) << m;
}

TEST(Loader, CommonLicenses) {
  const std::string dir = "/usr/share/common-licenses";
  if (!fs::is_directory(dir)) GTEST_SKIP() << dir << " is not present";
  ring::spec::DataSection d;
  d.source = ring::spec::DataSource::kText;
  d.paths = {dir};
  d.seq_len = 4096;
  d.pack = true;
  d.max_doc_len = 0;  // seq_len
  d.min_doc_len = 16;
  d.seed = 1;
  auto src = make_source(d);
  auto* loader = dynamic_cast<TextLoader*>(src.get());
  ASSERT_NE(loader, nullptr);
  const auto& c = dynamic_cast<const TextCorpus&>(loader->corpus());
  EXPECT_GT(c.stats().files_used, 5);
  EXPECT_GT(c.stats().files_duplicate, 0);  // GPL -> GPL-3 and friends are read once
  for (int64_t i = 0; i < c.num_docs(); ++i) {
    EXPECT_LE(c.doc_len(i), 4096);
    EXPECT_GE(c.doc_len(i), 16);
  }
  // The GPL-3 text is in there, cut into 4096-byte pieces.
  std::ifstream gpl(dir + "/GPL-3", std::ios::binary);
  std::string gpl_text((std::istreambuf_iterator<char>(gpl)), {});
  if (!gpl_text.empty()) {
    bool found = false;
    for (int64_t i = 0; i < c.num_docs() && !found; ++i)
      found = doc_string(c, i) == gpl_text.substr(0, 4096);
    EXPECT_TRUE(found);
  }
  check_epoch_accounting(std::dynamic_pointer_cast<const TextCorpus>(loader->shared_corpus()),
                         4096, true, 1);
}

TEST(Loader, MakeSourceFromSpecFile) {
  auto r =
      ring::spec::load_spec_file(std::string(RING_SOURCE_DIR) + "/configs/examples/passkey.yaml");
  ASSERT_TRUE(r.ok());
  auto src = make_source(r.spec->data);
  EXPECT_EQ(src->seq_len(), r.spec->data.seq_len);
  Sequence s = src->next_sequence();
  EXPECT_NO_THROW(check_sequence(s));
  EXPECT_EQ(src->cursor().index, 1);
  EXPECT_EQ(src->identity().source, "passkey");
}

// ---- passkey -----------------------------------------------------------------------------------

TEST(Passkey, AnswerSpanAndLayout) {
  for (auto [len, digits] : {std::pair<int64_t, int64_t>{128, 5},
                             {512, 32},
                             {4096, 5},
                             {passkey_min_seq_len(8), 8},
                             {100000, 7}}) {
    for (int64_t idx = 0; idx < 20; ++idx) {
      PasskeySample p = make_passkey_sample({.seq_len = len, .digits = digits, .seed = 3}, idx);
      const Sequence& s = p.sequence;
      ASSERT_NO_THROW(check_sequence(s));
      ASSERT_EQ(s.size(), len);
      ASSERT_EQ(static_cast<int64_t>(p.answer.size()), digits);
      EXPECT_EQ(p.answer_len, digits);
      EXPECT_EQ(p.answer_start, len - digits);
      std::string text(s.tokens.begin(), s.tokens.end());
      EXPECT_EQ(text.substr(p.answer_start), p.answer);
      EXPECT_TRUE(text.ends_with("What is the pass key? The pass key is " + p.answer));
      const std::string key =
          "The pass key is " + p.answer + ". Remember it. " + p.answer + " is the pass key.";
      EXPECT_EQ(text.substr(p.key_start, key.size()), key);
      EXPECT_LT(p.key_start, len / 2 + 1);
      // The only digits are the two in the key line and the answer.
      int64_t digit_count = std::count_if(text.begin(), text.end(), ::isdigit);
      EXPECT_EQ(digit_count, 3 * digits);
      EXPECT_EQ(s.num_segments(), 1);
      EXPECT_EQ(s.segments[0].doc, idx);
      EXPECT_EQ(s.labels[len - 1], kIgnoreLabel);
      for (int64_t i = 0; i < digits; ++i)
        EXPECT_EQ(s.labels[p.first_predicting_position() + i], p.answer[i]);
    }
  }
}

TEST(Passkey, DeterministicVariedAndAnswerLabels) {
  PasskeyOptions o{.seq_len = 2048, .digits = 5, .seed = 4};
  std::set<std::string> answers;
  std::set<int64_t> depths;
  for (int64_t i = 0; i < 50; ++i) {
    PasskeySample a = make_passkey_sample(o, i), b = make_passkey_sample(o, i);
    EXPECT_TRUE(same_sequence(a.sequence, b.sequence));
    EXPECT_EQ(a.answer, b.answer);
    answers.insert(a.answer);
    depths.insert(a.key_start);
  }
  EXPECT_GT(answers.size(), 45u);
  EXPECT_GT(depths.size(), 40u);
  PasskeyOptions o2 = o;
  o2.seed = 5;
  EXPECT_NE(make_passkey_sample(o, 0).sequence.tokens, make_passkey_sample(o2, 0).sequence.tokens);

  // Answer-only labels: exactly the digits are predicted, nothing else.
  o.labels = PasskeyLabels::kAnswer;
  PasskeySample p = make_passkey_sample(o, 3);
  EXPECT_EQ(p.sequence.valid_labels(), p.answer_len);  // the space before the digits predicts the
                                                       // first; the last digit predicts nothing
  for (int64_t i = 0; i < p.sequence.size(); ++i) {
    bool predicts = i >= p.first_predicting_position() && i < p.answer_start + p.answer_len - 1;
    EXPECT_EQ(p.sequence.labels[i] != kIgnoreLabel, predicts) << i;
  }
  EXPECT_EQ(p.sequence.tokens,
            make_passkey_sample({.seq_len = 2048, .digits = 5, .seed = 4}, 3).sequence.tokens);
}

TEST(Passkey, LoaderResumeAndErrors) {
  PasskeyLoader a({.seq_len = 256, .digits = 5, .seed = 1});
  for (int k = 0; k < 5; ++k) a.next_sequence();
  PasskeyLoader b({.seq_len = 256, .digits = 5, .seed = 1});
  b.seek(nlohmann::json::parse(nlohmann::json(a.cursor()).dump()).get<Cursor>());
  for (int k = 0; k < 5; ++k) {
    PasskeySample sa = a.next_sample(), sb = b.next_sample();
    EXPECT_EQ(sa.answer, sb.answer);
    EXPECT_TRUE(same_sequence(sa.sequence, sb.sequence));
  }
  PasskeyLoader c({.seq_len = 256, .digits = 6, .seed = 1});
  EXPECT_THROW(c.seek(a.cursor()), DataError);
  std::string m = throw_message([] { PasskeyLoader({.seq_len = 40, .digits = 5}); });
  EXPECT_NE(m.find("too short"), std::string::npos) << m;
  m = throw_message([] { make_passkey_sample({.seq_len = 4096, .digits = 33}, 0); });
  EXPECT_NE(m.find("passkey_digits"), std::string::npos) << m;
}

// ---- rank split --------------------------------------------------------------------------------

TEST(Split, CoversEveryIndexOnceAndBalancesCausalWork) {
  for (auto balance : {CausalBalance::kZigzag, CausalBalance::kContiguous}) {
    for (int64_t ranks : {1, 2, 3, 4, 8}) {
      for (int64_t len : {int64_t{64}, int64_t{96}, int64_t{1000}, 2 * ranks * 37}) {
        std::vector<int> seen(len, 0);
        std::vector<double> work(ranks, 0);  // causal attention work: keys <= each query
        for (int64_t r = 0; r < ranks; ++r) {
          auto idx = ring::cp::rank_token_indices(len, ranks, r, balance);
          EXPECT_TRUE(std::is_sorted(idx.begin(), idx.end()));
          for (int64_t i : idx) {
            ++seen[i];
            work[r] += static_cast<double>(i + 1);
          }
          // Balanced token counts (within one chunk rounding per chunk).
          EXPECT_LE(std::abs(static_cast<double>(idx.size()) - double(len) / ranks), 2.0);
        }
        for (int64_t i = 0; i < len; ++i) ASSERT_EQ(seen[i], 1) << i;
        auto [mn, mx] = std::minmax_element(work.begin(), work.end());
        if (balance == CausalBalance::kZigzag && len % (2 * ranks) == 0) {
          EXPECT_LE(*mx / *mn, 1.0 + 1e-9) << "ranks " << ranks << " len " << len;
        } else if (balance == CausalBalance::kZigzag) {
          EXPECT_LE(*mx / *mn, 1.1) << "ranks " << ranks << " len " << len;
        } else if (ranks > 1) {
          EXPECT_GT(*mx / *mn, 2.0);  // contiguous: the last rank does most of the work
        }
      }
    }
  }
  auto z = ring::cp::rank_ranges(16, 4, 1, CausalBalance::kZigzag);
  ASSERT_EQ(z.size(), 2u);
  EXPECT_EQ(z[0].begin, 2);
  EXPECT_EQ(z[1].begin, 12);  // chunk 2P-1-r = 6 of 8
  EXPECT_THROW(ring::cp::rank_ranges(16, 4, 4, CausalBalance::kZigzag), std::invalid_argument);
  EXPECT_THROW(ring::cp::rank_ranges(6, 4, 0, CausalBalance::kZigzag), std::invalid_argument);
}

TEST(Split, ShardGathersTheSequence) {
  auto corpus = corpus_of(random_docs(10, 16, 90, 17));
  TextLoader l(corpus, {.seq_len = 96, .seed = 2});
  Sequence s = l.next_sequence();
  std::vector<int> seen(96, 0);
  for (int64_t r = 0; r < 3; ++r) {
    SequenceShard sh = shard_sequence(s, 3, r, CausalBalance::kZigzag);
    for (size_t k = 0; k < sh.indices.size(); ++k) {
      const int64_t i = sh.indices[k];
      ++seen[i];
      EXPECT_EQ(sh.tokens[k], s.tokens[i]);
      EXPECT_EQ(sh.labels[k], s.labels[i]);  // shifted before the split
      EXPECT_EQ(sh.positions[k], i);
      EXPECT_EQ(sh.doc_ids[k], s.doc_ids[i]);
    }
  }
  for (int c : seen) EXPECT_EQ(c, 1);
  // A rank outside the ring is a data error, naming the rule.
  EXPECT_THROW(shard_sequence(s, 3, 3, CausalBalance::kZigzag), DataError);
}
