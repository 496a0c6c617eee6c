// ringctl tokenize --tokenizer M [--dtype uint16|uint32] -o OUT INPUT...: text files and
// directories (the text source's rules: recursive, sorted, .gz decompressed, binary and empty
// files skipped; worker/data/corpus.h) encoded with a SentencePiece model or a Hugging Face
// tokenizer.json (worker/data/tokenizer.h tells them apart) into a token dataset
// OUT.bin + OUT.idx (worker/data/token_file.h) for `data.source: tokens`. Every document is framed
// like the text source frames it with data.tokenizer: BOS first, EOS last when the model has
// them; documents are written whole (the loader cuts them to max_doc_len). The input is streamed
// file by file (TextCorpus::stream: memory is the largest file plus a 4 MB batch, whatever the
// corpus's size) and encoded in batches on --threads threads, with a progress line on stderr
// (MB encoded of the files' estimated total, MB/s, ETA; plain lines when stderr is not a
// terminal). `--index-flat FILE.bin --eot ID` instead writes only FILE.idx for a flat id file
// without an index (nanoGPT's train.bin), documents ending after each EOT id.
// `--chat-template llama3|chatml|FILE`: the inputs are chat JSONL files (or directories of
// *.jsonl; worker/data/chat.h); each conversation is rendered with the template and written as
// one document with its loss mask (OUT.mask, format version 2 of token_file.h), so that
// `data.source: tokens` trains on the assistant turns only, like `data.source: chat`.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <exception>
#include <iostream>
#include <limits>
#include <thread>

#include <fmt/format.h>

#include "cli/commands.h"
#include "cli/ctl_common.h"
#include "worker/data/chat.h"
#include "worker/data/corpus.h"
#include "worker/data/errors.h"
#include "worker/data/token_file.h"
#include "worker/data/tokenizer.h"

namespace ring::cli {
namespace {

struct TokenizeOpts {
  std::string tokenizer;
  std::string dtype;  // "", uint16, uint32
  std::string out;
  std::vector<std::string> inputs;
  int threads = 0;
  bool quiet = false;
  std::string index_flat;  // a flat .bin (nanoGPT) to index
  std::string chat_template;  // chat JSONL inputs rendered with this template
  int64_t eot = 50256;
  int64_t vocab = 0;
};

class Progress {
 public:
  // unit nullptr: bytes, shown in MB; else a count of `unit`.
  Progress(int64_t total, bool quiet, const char* unit = nullptr)
      : total_(total),
        quiet_(quiet),
        tty_(::isatty(2) == 1),
        unit_(unit),
        start_(Clock::now()),
        last_(start_) {}

  void update(int64_t done, bool final = false) {
    if (quiet_) return;
    const auto now = Clock::now();
    const double since = std::chrono::duration<double>(now - last_).count();
    if (!final && since < (tty_ ? 0.2 : 5.0)) return;
    last_ = now;
    const double secs = std::max(1e-9, std::chrono::duration<double>(now - start_).count());
    const double mbs = static_cast<double>(done) / 1e6 / secs;
    const double eta = done > 0 ? secs * static_cast<double>(total_ - done) / done : 0.0;
    const double pct = total_ > 0 ? 100.0 * static_cast<double>(done) / total_ : 100.0;
    std::string line =
        unit_ == nullptr
            ? fmt::format("tokenize: {:.1f}/{:.1f} MB ({:.0f}%)  {:.1f} MB/s  ETA {}", done / 1e6,
                          total_ / 1e6, pct, mbs, final ? "0s" : format_duration(eta))
            : fmt::format("tokenize: {}/{} {} ({:.0f}%)  {:.0f}/s  ETA {}", done, total_, unit_,
                          pct, done / secs, final ? "0s" : format_duration(eta));
    if (tty_) {
      int width = 28;
      int fill = static_cast<int>(pct / 100.0 * width);
      std::string bar = "[" + std::string(fill, '#') + std::string(width - fill, '.') + "] ";
      std::fprintf(stderr, "\r%s%s\033[K%s", bar.c_str(), line.c_str(), final ? "\n" : "");
    } else {
      std::fprintf(stderr, "%s\n", line.c_str());
    }
    std::fflush(stderr);
  }
  void set_total(int64_t total) { total_ = total; }
  double seconds() const { return std::chrono::duration<double>(Clock::now() - start_).count(); }

 private:
  using Clock = std::chrono::steady_clock;
  int64_t total_;
  bool quiet_, tty_;
  const char* unit_;
  Clock::time_point start_, last_;
};

// --index-flat FILE.bin: writes FILE.idx (documents end after each --eot id).
int run_index_flat(const TokenizeOpts& o) {
  if (!o.tokenizer.empty() || !o.out.empty() || !o.inputs.empty()) {
    std::cerr << "ringctl tokenize: --index-flat takes no --tokenizer, -o or inputs\n";
    return kExitUsage;
  }
  try {
    const int width = o.dtype == "uint32" ? 4 : 2;
    int64_t docs =
        data::write_index_for_flat_bin(o.index_flat, width, o.eot, static_cast<uint64_t>(o.vocab));
    const std::string prefix = data::token_file_prefix(o.index_flat);
    std::cerr << fmt::format("wrote {}.idx: {} documents (split after each id {}) over {}.bin\n",
                             prefix, docs, o.eot, prefix);
    return kExitOk;
  } catch (const data::DataError& e) {
    std::cerr << "ringctl tokenize: " << e.what() << "\n";
    return kExitFailed;
  }
}

// The width of the ids: --dtype, else uint16 when the tokenizer's ids fit. 0 (after a message):
// --dtype uint16 cannot hold them.
int token_width(const TokenizeOpts& o, const data::Tokenizer& tok) {
  const int width = o.dtype == "uint16" ? 2 : o.dtype == "uint32" ? 4
                    : tok.vocab_size() <= 65536 ? 2 : 4;
  if (width == 2 && tok.vocab_size() > 65536) {
    std::cerr << fmt::format(
        "ringctl tokenize: --dtype uint16 holds ids below 65536 but '{}' has {} pieces; use "
        "--dtype uint32\n",
        o.tokenizer, tok.vocab_size());
    return 0;
  }
  return width;
}

// --chat-template: conversations from JSONL, ids and loss mask per conversation.
int run_tokenize_chat(const TokenizeOpts& o) {
  try {
    auto tok = data::Tokenizer::load(o.tokenizer);
    const int width = token_width(o, *tok);
    if (width == 0) return kExitUsage;
    const data::ChatEncoder encoder(data::chat_template(o.chat_template), tok.get());
    const std::vector<data::Conversation> chats = data::read_chat_paths(o.inputs);
    const std::string prefix = data::token_file_prefix(o.out);
    data::TokenFileWriter w(prefix, width, static_cast<uint64_t>(tok->vocab_size()),
                            /*with_mask=*/true);
    const int threads = o.threads > 0
                            ? o.threads
                            : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    const auto n = static_cast<int64_t>(chats.size());
    Progress progress(n, o.quiet, "conversations");
    int64_t targets = 0;
    constexpr int64_t kBatch = 4096;
    for (int64_t first = 0; first < n; first += kBatch) {
      const int64_t last = std::min(n, first + kBatch);
      std::vector<data::EncodedChat> enc(static_cast<size_t>(last - first));
      std::vector<std::exception_ptr> errors(static_cast<size_t>(threads));
      auto work = [&](int t) {
        try {
          for (int64_t i = first + t; i < last; i += threads)
            enc[i - first] = encoder.encode(chats[i]);
        } catch (...) {
          errors[t] = std::current_exception();
        }
      };
      std::vector<std::thread> pool;
      for (int t = 1; t < threads && first + t < last; ++t) pool.emplace_back(work, t);
      work(0);
      for (auto& th : pool) th.join();
      for (auto& e : errors)
        if (e) std::rethrow_exception(e);
      for (const auto& e : enc) {
        w.add_document(e.ids, e.mask);
        for (uint8_t m : e.mask) targets += m;
      }
      progress.update(last);
    }
    w.finish();
    progress.update(n, true);
    std::cerr << fmt::format(
        "wrote {}.bin, {}.idx and {}.mask: {} conversations, {} tokens ({}), {} of them "
        "targets (assistant turns, template {}), in {:.1f}s\n",
        prefix, prefix, prefix, w.documents(), w.tokens(), width == 2 ? "uint16" : "uint32",
        targets, o.chat_template, progress.seconds());
    return kExitOk;
  } catch (const data::DataError& e) {
    std::cerr << "ringctl tokenize: " << e.what() << "\n";
    return kExitFailed;
  }
}

int run_tokenize(const TokenizeOpts& o) {
  if (!o.index_flat.empty()) return run_index_flat(o);
  if (o.tokenizer.empty() || o.out.empty() || o.inputs.empty()) {
    std::cerr << "ringctl tokenize: needs --tokenizer, -o and at least one input (or "
                 "--index-flat FILE.bin)\n  `ringctl tokenize --help` shows its arguments\n";
    return kExitUsage;
  }
  if (!o.chat_template.empty()) return run_tokenize_chat(o);
  try {
    auto tok = data::Tokenizer::load(o.tokenizer);
    const int width = token_width(o, *tok);
    if (width == 0) return kExitUsage;
    data::CorpusOptions co;
    co.max_doc_len = 0;
    co.min_doc_len = 1;
    co.max_total_bytes = std::numeric_limits<int64_t>::max();
    const std::string prefix = data::token_file_prefix(o.out);
    data::TokenFileWriter w(prefix, width, static_cast<uint64_t>(tok->vocab_size()));

    int threads = o.threads > 0
                      ? o.threads
                      : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    // The text is streamed file by file (each file is a document): documents gather into a
    // batch of about kBatchBytes, encoded in parallel and written in order, so memory is the
    // largest file plus a batch, whatever the corpus's size.
    Progress progress(0, o.quiet);  // the total: the files' estimated bytes, once listed
    constexpr int64_t kBatchBytes = 4 << 20;
    std::vector<std::string> batch;
    int64_t batch_bytes = 0, done_bytes = 0;
    auto encode_batch = [&] {
      const auto n = static_cast<int64_t>(batch.size());
      std::vector<std::vector<int32_t>> ids(batch.size());
      std::vector<std::exception_ptr> errors(static_cast<size_t>(threads));
      auto work = [&](int t) {
        try {
          for (int64_t i = t; i < n; i += threads) ids[i] = tok->encode_document(batch[i]);
        } catch (...) {
          errors[t] = std::current_exception();
        }
      };
      std::vector<std::thread> pool;
      for (int t = 1; t < threads && t < n; ++t) pool.emplace_back(work, t);
      work(0);
      for (auto& th : pool) th.join();
      for (auto& e : errors)
        if (e) std::rethrow_exception(e);
      for (const auto& d : ids) w.add_document(d);
      done_bytes += batch_bytes;
      progress.update(done_bytes);
      batch.clear();
      batch_bytes = 0;
    };
    const data::CorpusStats st =
        data::TextCorpus::stream(o.inputs, co, [&](std::span<const uint8_t> d) {
          batch.emplace_back(reinterpret_cast<const char*>(d.data()), d.size());
          batch_bytes += static_cast<int64_t>(d.size());
          if (batch_bytes >= kBatchBytes) encode_batch();
        },
        [&](int64_t estimated) { progress.set_total(estimated); });
    encode_batch();
    w.finish();
    progress.set_total(done_bytes);  // what the text documents held (binary files skipped)
    progress.update(done_bytes, true);
    std::cerr << fmt::format(
        "wrote {}.bin and {}.idx: {} documents, {} tokens ({}), {:.1f} MB of text in {:.1f}s; "
        "skipped {} binary, {} empty, {} unreadable, {} duplicate files\n",
        prefix, prefix, w.documents(), w.tokens(), width == 2 ? "uint16" : "uint32",
        done_bytes / 1e6, progress.seconds(), st.files_binary, st.files_empty,
        st.entries_skipped, st.files_duplicate);
    return kExitOk;
  } catch (const data::DataError& e) {
    std::cerr << "ringctl tokenize: " << e.what() << "\n";
    return kExitFailed;
  }
}

}  // namespace

Subcommand add_tokenize(CLI::App& app) {
  auto o = std::make_shared<TokenizeOpts>();
  auto* s = app.add_subcommand(
      "tokenize",
      "Encode text files/directories with a SentencePiece model or a Hugging Face "
      "tokenizer.json into OUT.bin + OUT.idx (data.source: tokens)");
  s->add_option("--tokenizer", o->tokenizer,
                "SentencePiece model (.model) or Hugging Face tokenizer.json (a .json name or "
                "JSON content; tokenizer_config.json beside it gives BOS/EOS) (required)")
      ->check(CLI::ExistingFile);
  s->add_option("--dtype", o->dtype,
                "Token width: uint16 or uint32 (default: uint16 when the "
                "tokenizer has at most 65536 ids)")
      ->check(CLI::IsMember({"uint16", "uint32"}));
  s->add_option("-o,--output", o->out, "Output prefix: writes OUT.bin and OUT.idx (required)");
  s->add_option("--threads", o->threads, "Encoding threads (default: all cores)")
      ->check(CLI::Range(1, 1024));
  s->add_flag("-q,--quiet", o->quiet, "No progress on stderr");
  s->add_option("inputs", o->inputs,
                "Text files or directories (recursive; .gz read); with --chat-template, chat "
                "JSONL files or directories of *.jsonl");
  s->add_option("--chat-template", o->chat_template,
                "Inputs are chat JSONL ({\"messages\":[{role, content}...]} or {\"prompt\", "
                "\"response\"} per line), rendered with llama3, chatml or a YAML template file; "
                "writes OUT.mask too: the loss mask, targets on the assistant turns only "
                "(docs/data.md)");
  s->add_option("--index-flat", o->index_flat,
                "Instead: write FILE.idx for an existing flat FILE.bin of ids without an index "
                "(nanoGPT's train.bin), documents ending after each --eot id; --dtype gives the "
                "width (default uint16)")
      ->check(CLI::ExistingFile);
  s->add_option("--eot", o->eot, "With --index-flat: the end-of-text id (default 50256, GPT-2)")
      ->check(CLI::Range(int64_t{0}, int64_t{0xffffffff}));
  s->add_option("--vocab", o->vocab,
                "With --index-flat: the vocab to record in the header (default 0: not recorded)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 32));
  return {s, [o] { return run_tokenize(*o); }};
}

}  // namespace ring::cli
