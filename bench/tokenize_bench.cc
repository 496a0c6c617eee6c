// tokenize_bench: SentencePiece encoding throughput (MB of text per second) of our tokenizer
// (worker/data/tokenizer.h over Debian's libsentencepiece) against python3-sentencepiece
// (bench/spm_encode.py) on the same documents in the same run, one thread each, repetitions
// interleaved; the ratio's median, min and max over repetitions, plus our multi-threaded corpus
// encoding (TokenCorpus::encode, what data.tokenizer and ringctl tokenize run).
// The same for a Hugging Face tokenizer.json (worker/data/bpe_tokenizer.h): a Llama-3-style
// byte-level BPE (its split regex; merges learned by tests/worker/bpe_train.py from
// /usr/share/common-licenses, as many as --vocab allows) against SentencePiece on the same
// documents in the same repetitions: the paired ratio BPE/SentencePiece, 1 thread and corpus.
//
//   tokenize_bench [--paths=/usr/share/doc] [--mb=16] [--reps=5] [--vocab=8000] [--threads=0]
//
// The model is trained first with spm_train on the documents (unigram, --vocab pieces).
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench_stats.h"
#include "worker/data/corpus.h"
#include "worker/data/token_corpus.h"
#include "worker/data/tokenizer.h"

namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

int main(int argc, char** argv) {
  std::string paths = "/usr/share/common-licenses,/usr/share/doc";
  int64_t mb = 16, reps = 5, vocab = 8000, threads = 0;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto val = [&](const char* name, std::string* s) {
      std::string p = std::string("--") + name + "=";
      if (a.rfind(p, 0) != 0) return false;
      *s = a.substr(p.size());
      return true;
    };
    std::string v;
    if (val("paths", &v))
      paths = v;
    else if (val("mb", &v))
      mb = std::atoll(v.c_str());
    else if (val("reps", &v))
      reps = std::atoll(v.c_str());
    else if (val("vocab", &v))
      vocab = std::atoll(v.c_str());
    else if (val("threads", &v))
      threads = std::atoll(v.c_str());
    else {
      std::fprintf(stderr, "unknown flag %s\n", a.c_str());
      return 2;
    }
  }
  std::vector<std::string> roots;
  for (size_t s = 0; s <= paths.size();) {
    size_t e = paths.find(',', s);
    if (e == std::string::npos) e = paths.size();
    if (e > s) roots.push_back(paths.substr(s, e - s));
    s = e + 1;
  }
  ring::data::CorpusOptions co;
  co.max_doc_len = 0;
  co.min_doc_len = 1;
  co.max_total_bytes = mb << 20;
  auto text = ring::data::TextCorpus::load(roots, co);
  char tmpl[] = "/tmp/tokenize-bench-XXXXXX";
  std::string dir = ::mkdtemp(tmpl);
  {
    std::ofstream docs(dir + "/docs", std::ios::binary);
    for (int64_t i = 0; i < text.num_docs(); ++i) {
      auto d = text.doc(i);
      if (i) docs.put('\0');
      docs.write(reinterpret_cast<const char*>(d.data()), static_cast<std::streamsize>(d.size()));
    }
  }
  const double mbytes = static_cast<double>(text.total_tokens()) / 1e6;
  std::printf("corpus: %lld documents, %.1f MB from %s\n", static_cast<long long>(text.num_docs()),
              mbytes, paths.c_str());
  std::string cmd = "spm_train --input=" + dir + "/docs --model_prefix=" + dir +
                    "/m --vocab_size=" + std::to_string(vocab) +
                    " --model_type=unigram --input_sentence_size=200000 --shuffle_input_sentence"
                    " --byte_fallback --minloglevel=2 > /dev/null 2>&1";
  if (std::system(cmd.c_str()) != 0) {
    std::fprintf(stderr, "spm_train failed: %s\n", cmd.c_str());
    return 1;
  }
  auto tok = ring::data::Tokenizer::load(dir + "/m.model");
  const std::string train = "/usr/bin/python3 " + std::string(RING_SOURCE_DIR) +
                            "/tests/worker/bpe_train.py --style bytelevel --corpus "
                            "/usr/share/common-licenses --out " + dir + "/bpe --merges " +
                            std::to_string(vocab - 256);
  if (std::system(train.c_str()) != 0) {
    std::fprintf(stderr, "bpe_train.py failed: %s\n", train.c_str());
    return 1;
  }
  auto bpe = ring::data::Tokenizer::load(dir + "/bpe/tokenizer.json");

  // Interleaved repetitions: ours (one thread), python3-sentencepiece (one thread, its own
  // process, loading excluded), ours multi-threaded; pairs close in time on a noisy machine.
  std::vector<double> ours, mt, py, bpe1, bpe_mt;
  int64_t bpe_ids = 0;
  int64_t ids = 0, py_ids = 0;
  const std::string pcmd = "/usr/bin/python3 " + std::string(RING_SOURCE_DIR) +
                           "/bench/spm_encode.py " + dir + "/m.model " + dir + "/docs 1";
  for (int64_t r = 0; r < reps; ++r) {
    double t0 = now();
    std::vector<int32_t> out;
    int64_t n = 0;
    for (int64_t i = 0; i < text.num_docs(); ++i) {
      auto d = text.doc(i);
      out.clear();
      tok->encode(std::string_view(reinterpret_cast<const char*>(d.data()), d.size()), out);
      n += static_cast<int64_t>(out.size());
    }
    ours.push_back(now() - t0);
    ids = n;
    FILE* p = ::popen(pcmd.c_str(), "r");
    double s;
    long long pn;
    if (p && std::fscanf(p, "%lf %lld", &s, &pn) == 2) {
      py.push_back(s);
      py_ids = pn;
    }
    if (p) ::pclose(p);
    t0 = now();
    auto c = ring::data::TokenCorpus::encode(text, *tok, 0, 1, static_cast<int>(threads));
    mt.push_back(now() - t0);
    // tokenizer.json: one thread (a fresh thread, so its per-thread cache starts empty), then the
    // corpus encode.
    std::thread([&] {
      const double b0 = now();
      std::vector<int32_t> bout;
      int64_t bn = 0;
      for (int64_t i = 0; i < text.num_docs(); ++i) {
        auto d = text.doc(i);
        bout.clear();
        bpe->encode(std::string_view(reinterpret_cast<const char*>(d.data()), d.size()), bout);
        bn += static_cast<int64_t>(bout.size());
      }
      bpe1.push_back(now() - b0);
      bpe_ids = bn;
    }).join();
    t0 = now();
    auto bc = ring::data::TokenCorpus::encode(text, *bpe, 0, 1, static_cast<int>(threads));
    bpe_mt.push_back(now() - t0);
  }
  std::system(("rm -rf " + dir).c_str());
  if (py.size() != ours.size()) {
    std::fprintf(stderr, "python3-sentencepiece baseline failed (%zu of %lld repetitions)\n",
                 py.size(), static_cast<long long>(reps));
    return 1;
  }
  auto o = ring::bench::spread(ours), q = ring::bench::spread(py), m = ring::bench::spread(mt);
  // Throughput ratio ours/python = t_python / t_ours, paired by repetition.
  auto ratio = ring::bench::paired_ratio(py, ours);
  std::printf("ids: ours %lld, python %lld (%s)\n", static_cast<long long>(ids),
              static_cast<long long>(py_ids), ids == py_ids ? "same" : "DIFFERENT");
  std::printf("ours, 1 thread:            %.2f MB/s (median; %.2f..%.2f)\n", mbytes / o.median,
              mbytes / o.max, mbytes / o.min);
  std::printf("python3-sentencepiece:     %.2f MB/s (median; %.2f..%.2f)\n", mbytes / q.median,
              mbytes / q.max, mbytes / q.min);
  std::printf("ratio ours/python:         %.2fx (median; %.2f..%.2f over %zu repetitions)\n",
              ratio.median, ratio.min, ratio.max, ratio.count);
  std::printf("ours, corpus encode (%s threads): %.2f MB/s (median; %.2f..%.2f)\n",
              threads > 0 ? std::to_string(threads).c_str() : "all", mbytes / m.median,
              mbytes / m.max, mbytes / m.min);
  auto b1 = ring::bench::spread(bpe1), bm = ring::bench::spread(bpe_mt);
  auto r1 = ring::bench::paired_ratio(ours, bpe1), rm = ring::bench::paired_ratio(mt, bpe_mt);
  std::printf("tokenizer.json BPE, 1 thread:  %.2f MB/s (median; %.2f..%.2f), %lld ids\n",
              mbytes / b1.median, mbytes / b1.max, mbytes / b1.min,
              static_cast<long long>(bpe_ids));
  std::printf("tokenizer.json BPE, corpus encode: %.2f MB/s (median; %.2f..%.2f)\n",
              mbytes / bm.median, mbytes / bm.max, mbytes / bm.min);
  std::printf("ratio BPE/SentencePiece, 1 thread: %.2fx (median; %.2f..%.2f); corpus: %.2fx "
              "(%.2f..%.2f)\n",
              r1.median, r1.min, r1.max, rm.median, rm.min, rm.max);
  return ids == py_ids ? 0 : 1;
}
