// worker/eval/eval_run.h: `ringctl eval`, one process or one rank of P.
#include "worker/eval/eval_run.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <limits>
#include <memory>
#include <numeric>
#include <optional>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/cp/split.h"
#include "common/spec/parse.h"
#include "kernels/backend.h"
#include "worker/data/errors.h"
#include "worker/data/loader.h"
#include "worker/data/split.h"
#include "worker/data/tokenizer.h"
#include "worker/generate/ring_generate.h"
#include "worker/model/model.h"
#include "worker/ring/ring_rank.h"

namespace ring::eval {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

constexpr int kExitOk = 0;
constexpr int kExitFailed = 1;
// ring-worker's held-out passkey evaluation: data.seed + this (worker/ring_worker.cc).
constexpr int64_t kHeldOutSeed = 1000003;

std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> out;
  size_t at = 0;
  while (true) {
    const size_t comma = text.find(',', at);
    std::string item = text.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
    item.erase(0, item.find_first_not_of(" \t"));
    item.erase(item.find_last_not_of(" \t") + 1);
    out.push_back(item);
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  return out;
}

}  // namespace

std::vector<PasskeyDepth> parse_depths(const std::string& text) {
  std::vector<PasskeyDepth> out;
  for (const std::string& item : split_list(text)) {
    PasskeyDepth d;
    d.text = item;
    if (item == "random") {
      d.random = true;
      out.push_back(d);
      continue;
    }
    const bool percent = !item.empty() && item.back() == '%';
    const std::string num = percent ? item.substr(0, item.size() - 1) : item;
    size_t used = 0;
    double v = std::numeric_limits<double>::quiet_NaN();
    try {
      v = std::stod(num, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (num.empty() || used != num.size() || !std::isfinite(v))
      throw UsageError(fmt::format(
          "--passkey '{}': depth '{}' is not a number; give fractions of the context in [0, 1] "
          "(0.1,0.5,0.9), percentages (10%) or 'random' (the training evaluation's own depth)",
          text, item));
    if (percent) v /= 100;
    if (v < 0 || v > 1)
      throw UsageError(fmt::format(
          "--passkey '{}': depth '{}' is outside [0, 1] (0: the key first, 1: just before the "
          "question)",
          text, item));
    d.depth = v;
    out.push_back(d);
  }
  return out;
}

std::vector<int64_t> parse_lengths(const std::string& flag, const std::string& text) {
  std::vector<int64_t> out;
  for (const std::string& item : split_list(text)) {
    int64_t mult = 1;
    std::string num = item;
    if (!num.empty() && (num.back() == 'K' || num.back() == 'k')) mult = 1024;
    if (!num.empty() && (num.back() == 'M' || num.back() == 'm')) mult = 1024 * 1024;
    if (mult > 1) num.pop_back();
    size_t used = 0;
    long long v = -1;
    try {
      v = std::stoll(num, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (num.empty() || used != num.size() || v < 1 || v > (int64_t{1} << 31) / mult ||
        v * mult < 2)
      throw UsageError(fmt::format(
          "{} '{}': length '{}' must be a token count in 2..2^31 (4096, 16K, 1M)", flag, text,
          item));
    out.push_back(v * mult);
  }
  return out;
}

data::PasskeySample passkey_at_depth(const data::PasskeyOptions& options, int64_t index,
                                     const PasskeyDepth& depth) {
  data::PasskeySample s = data::make_passkey_sample(options, index);
  if (depth.random) return s;
  // The key line: from the newline before key_start to the newline after "<answer> is the pass
  // key." (filler has no digits and no newline, so this is the only match).
  std::vector<int32_t>& t = s.sequence.tokens;
  const int64_t start = s.key_start - 1;
  const std::string tail = s.answer + " is the pass key.\n";
  int64_t end = -1;
  for (int64_t i = s.key_start; i + static_cast<int64_t>(tail.size()) <= s.answer_start; ++i) {
    bool match = true;
    for (size_t k = 0; k < tail.size() && match; ++k)
      match = t[static_cast<size_t>(i) + k] == static_cast<unsigned char>(tail[k]);
    if (match) {
      end = i + static_cast<int64_t>(tail.size());
      break;
    }
  }
  if (start < 0 || t[static_cast<size_t>(start)] != '\n' || end < 0)
    throw InputError(fmt::format("passkey sample {}: its key line was not found (internal)",
                                 index));
  // The question starts with the newline before "What is the pass key?": the last newline.
  int64_t question = s.answer_start;
  while (question > end && t[static_cast<size_t>(question)] != '\n') --question;
  std::vector<int32_t> key(t.begin() + start, t.begin() + end);
  std::vector<int32_t> filler(t.begin(), t.begin() + start);
  filler.insert(filler.end(), t.begin() + end, t.begin() + question);
  const auto at = static_cast<int64_t>(std::llround(depth.depth * static_cast<double>(filler.size())));
  std::vector<int32_t> moved(filler.begin(), filler.begin() + at);
  moved.insert(moved.end(), key.begin(), key.end());
  moved.insert(moved.end(), filler.begin() + at, filler.end());
  std::copy(moved.begin(), moved.end(), t.begin());
  s.key_start = at + 1;
  // Labels follow the tokens (kAll: every position; kAnswer: the answer's, unchanged).
  for (int64_t i = 0; i + 1 < s.sequence.size(); ++i)
    if (s.sequence.labels[static_cast<size_t>(i)] != data::kIgnoreLabel)
      s.sequence.labels[static_cast<size_t>(i)] = t[static_cast<size_t>(i) + 1];
  return s;
}

const std::vector<BucketRange>& position_buckets() {
  static const std::vector<BucketRange> b = {
      {0, 1 << 10, "[0, 1K)"},           {1 << 10, 1 << 12, "[1K, 4K)"},
      {1 << 12, 1 << 14, "[4K, 16K)"},   {1 << 14, 1 << 16, "[16K, 64K)"},
      {1 << 16, 1 << 18, "[64K, 256K)"}, {1 << 18, 1 << 20, "[256K, 1M)"},
      {1 << 20, -1, "[1M, ...)"}};
  return b;
}

namespace {

// Everything an evaluation needs, checked.
struct Loaded {
  contract::ModelConfig mc;
  std::string step_dir;
  std::vector<float> params;
  spec::DataSection data;
  bool has_data = false;
  std::unique_ptr<data::SequenceSource> source;
  std::vector<int64_t> doc_positions;  // the loader's index of each corpus document, in order
  int64_t documents = 0;               // to evaluate
  std::vector<PasskeyDepth> depths;
  std::vector<int64_t> lengths;
  int64_t digits = 5, seed = kHeldOutSeed;
};

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ",") + x;
  return s;
}

// The dataset's vocab against the model's: the tokenizer's size and the largest id.
void check_dataset_vocab(const Loaded& l, const EvalOpts& o) {
  const std::string what =
      o.data.empty() ? fmt::format("--spec {}: data.paths {}", o.spec, joined(l.data.paths))
                     : fmt::format("--data {}", joined(l.data.paths));
  if (!l.data.tokenizer.empty()) {
    std::unique_ptr<data::Tokenizer> tok;
    try {
      tok = data::Tokenizer::load(l.data.tokenizer);
    } catch (const data::DataError& e) {
      throw InputError(fmt::format("--tokenizer {}: {}", l.data.tokenizer, e.what()));
    }
    if (tok->vocab_size() > l.mc.vocab)
      throw InputError(fmt::format(
          "{} with tokenizer {}: the tokenizer's vocab is {} but the model of --checkpoint {} "
          "has vocab {}: the dataset and the model do not match",
          what, l.data.tokenizer, tok->vocab_size(), o.checkpoint, l.mc.vocab));
  }
  const int64_t need = l.source->max_token() + 1;
  if (need > l.mc.vocab)
    throw InputError(fmt::format(
        "{}: the dataset's token ids need a vocab of {} (largest id {}) but the model of "
        "--checkpoint {} has vocab {}: the dataset and the model do not match",
        what, need, need - 1, o.checkpoint, l.mc.vocab));
}

// The dataset: the spec's data section or the flags, through the training loader (pack false,
// documents of at most seq_len tokens), in corpus order.
void load_dataset(Loaded& l, const EvalOpts& o, const spec::JobSpec* sp) {
  spec::DataSection& d = l.data;
  if (sp != nullptr && sp->data.source != spec::DataSource::kPasskey) {
    d = sp->data;
    l.has_data = true;
  }
  if (!o.data.empty()) {
    // Other files of the spec's kind (text, tokens or chat, with its tokenizer and template);
    // without a data section in a spec, text (--source says otherwise).
    d.paths = o.data;
    if (!l.has_data) d.source = spec::DataSource::kText;
    if (sp == nullptr) d.tokenizer.clear();
    l.has_data = true;
  }
  if (!o.source.empty()) {
    if (!l.has_data) throw UsageError("--source needs a dataset (--data PATH)");
    d.source = o.source == "tokens" ? spec::DataSource::kTokens : spec::DataSource::kText;
  }
  if (!o.tokenizer.empty()) d.tokenizer = o.tokenizer;
  if (!l.has_data) return;
  if (d.source == spec::DataSource::kTokens && !o.tokenizer.empty())
    throw UsageError("--tokenizer: a tokens dataset is already token ids (--source tokens)");
  if (d.source == spec::DataSource::kTokens) d.tokenizer.clear();
  d.seq_len = o.seq_len > 0 ? o.seq_len
              : (sp != nullptr && sp->data.seq_len > 0) ? sp->data.seq_len
              : l.mc.max_positions > 0                   ? l.mc.max_positions
                                                         : 4096;
  d.pack = false;
  d.max_doc_len = 0;  // pieces of at most seq_len: one per sequence
  if (d.min_doc_len < 1) d.min_doc_len = 1;
  try {
    l.source = data::make_source(d, data::PasskeyLabels::kAll, data::CorpusOptions{});
  } catch (const data::DataError& e) {
    throw InputError(fmt::format("{} {}: {}", o.data.empty() ? "--spec " + o.spec + ": data"
                                                             : std::string("--data"),
                                 joined(d.paths), e.what()));
  }
  check_dataset_vocab(l, o);
  if (auto* tl = dynamic_cast<data::TextLoader*>(l.source.get())) {
    const std::vector<uint32_t>& order = tl->epoch_order();
    l.doc_positions.assign(order.size(), 0);
    for (size_t i = 0; i < order.size(); ++i) l.doc_positions[order[i]] = static_cast<int64_t>(i);
    l.documents = static_cast<int64_t>(order.size());
  } else {
    l.documents = -1;  // another source: its first epoch, in its own order
  }
  if (o.max_docs > 0 && (l.documents < 0 || o.max_docs < l.documents)) l.documents = o.max_docs;
}

void load_passkey(Loaded& l, const EvalOpts& o, const spec::JobSpec* sp) {
  const bool spec_passkey = sp != nullptr && sp->data.source == spec::DataSource::kPasskey;
  if (o.passkey.empty()) {
    if (!o.passkey_len.empty())
      throw UsageError("--passkey-len needs --passkey DEPTHS (e.g. --passkey 0.1,0.5,0.9)");
    return;
  }
  l.depths = parse_depths(o.passkey);
  if (!o.passkey_len.empty()) {
    l.lengths = parse_lengths("--passkey-len", o.passkey_len);
  } else if (spec_passkey) {
    l.lengths = {sp->data.seq_len};
  } else {
    throw UsageError(
        "--passkey needs --passkey-len LENGTHS (context lengths, e.g. 4096,16K), or a passkey "
        "spec (--spec with data.source passkey: its seq_len)");
  }
  l.digits = o.passkey_digits > 0 ? o.passkey_digits : spec_passkey ? sp->data.passkey_digits : 5;
  l.seed = o.passkey_seed >= 0 ? o.passkey_seed
           : sp != nullptr     ? sp->data.seed + kHeldOutSeed
                               : kHeldOutSeed;
  if (l.mc.vocab < 256)
    throw InputError(fmt::format(
        "--passkey: the samples are bytes (vocab 256) but the model of --checkpoint {} has "
        "vocab {}",
        o.checkpoint, l.mc.vocab));
  for (int64_t len : l.lengths) {
    try {
      (void)data::make_passkey_sample({len, l.digits, l.seed, data::PasskeyLabels::kAnswer}, 0);
    } catch (const data::DataError& e) {
      throw UsageError(fmt::format("--passkey-len {} with {} digits: {}", len, l.digits, e.what()));
    }
  }
}

Loaded load(const EvalOpts& o, bool quiet) {
  if (!o.source.empty() && o.source != "text" && o.source != "tokens")
    throw UsageError(fmt::format("--source '{}': text or tokens", o.source));
  if (o.dtype != "" && o.dtype != "fp32" && o.dtype != "bf16")
    throw UsageError(fmt::format("--dtype '{}': fp32 or bf16", o.dtype));
  if (o.passkey_samples < 1) throw UsageError("--passkey-samples must be >= 1");
  Loaded l;
  std::optional<spec::LoadResult> r;
  contract::ModelConfig spec_mc;
  if (!o.spec.empty()) {
    r = spec::load_spec_file(o.spec);
    if (!quiet || !r->ok())
      for (const auto& d : r->diagnostics) std::cerr << d.str() << "\n";
    if (!r->ok()) throw InputError(fmt::format("--spec {}: {} error(s)", o.spec, r->error_count()));
    try {
      spec_mc = contract::ModelConfig::from_spec(*r->spec);
    } catch (const contract::ModelError& e) {
      throw InputError(fmt::format("--spec {}: {}", o.spec, e.what()));
    }
  }
  const spec::JobSpec* sp = r ? &*r->spec : nullptr;
  if (o.checkpoint.empty()) throw UsageError("--checkpoint DIR is required");
  std::error_code ec;
  if (!fs::exists(o.checkpoint, ec))
    throw InputError(fmt::format("--checkpoint {}: no such checkpoint directory", o.checkpoint));
  l.mc = gen::model_of_checkpoint(o.checkpoint, sp ? &spec_mc : nullptr, o.spec, quiet);
  if (o.dtype == "fp32") l.mc.dtype = spec::DType::kFp32;
  if (o.dtype == "bf16") l.mc.dtype = spec::DType::kBf16;
  if (l.mc.dtype == spec::DType::kFp16)
    throw InputError("model.dtype fp16: eval computes in fp32 or bf16 (--dtype chooses one)");
  load_passkey(l, o, sp);
  load_dataset(l, o, sp);
  if (!l.has_data && l.depths.empty())
    throw UsageError(
        "nothing to evaluate: give a dataset (--data PATH, or --spec FILE with a text or tokens "
        "data section) and/or --passkey DEPTHS");
  if (!o.logits.empty() && !l.has_data)
    throw UsageError("--logits FILE writes the logits of a dataset's tokens: give --data PATH");
  l.params = gen::load_checkpoint_weights(o.checkpoint, l.mc);
  return l;
}

// The forward of one sequence over the ranks (ring) or alone, and what rank 0 gets back.
struct Scored {
  std::vector<double> ce;       // [len] cross-entropy of each labelled token (nats), NaN: none
  std::vector<int32_t> argmax;  // [len] the model's greedy next token
  std::vector<float> logits;    // [len, vocab] when asked
  double model_loss = 0;        // the model's own loss (LossResult.loss, summed over the ranks)
  bool scored = false;          // false: no label in the sequence (nothing was run)
};

class Evaluator {
 public:
  Evaluator(const contract::ModelConfig& mc, const std::vector<float>& params,
            kernels::Backend* backend, gen::GenerateRing* ring)
      : mc_(mc), backend_(backend), ring_(ring), local_(backend),
        model_(mc, backend, ring ? ring->attention() : &local_) {
    model_.set_params(params);
  }

  Scored run(const data::Sequence& seq, bool want_logits);
  bool lead() const { return ring_ == nullptr || ring_->rank() == 0; }
  model::Model& model() { return model_; }

 private:
  contract::ModelConfig mc_;
  kernels::Backend* backend_;
  gen::GenerateRing* ring_;
  model::LocalAttention local_;
  model::Model model_;
};

Scored Evaluator::run(const data::Sequence& s, bool want_logits) {
  const int64_t len = s.size(), V = mc_.vocab;
  const int64_t P = ring_ ? ring_->ranks() : 1;
  Scored out;
  out.ce.assign(static_cast<size_t>(len), std::numeric_limits<double>::quiet_NaN());
  out.argmax.assign(static_cast<size_t>(len), -1);
  const int64_t valid = s.valid_labels();
  if (valid == 0) return out;  // every rank has the same sequence: every rank skips it
  out.scored = true;
  // Over P ranks: padded to a multiple of 2P (zigzag chunks of one size), the padding after the
  // last token (causal: it changes nothing before it) in a document of its own, never labelled.
  data::Sequence q = s;
  if (P > 1) {
    const int64_t tp = std::max<int64_t>(2 * P, (len + 2 * P - 1) / (2 * P) * (2 * P));
    const int32_t pad_doc =
        (len > 0 ? *std::max_element(q.doc_ids.begin(), q.doc_ids.end()) : 0) + 1;
    for (int64_t i = len; i < tp; ++i) {
      q.tokens.push_back(data::kPadToken);
      q.labels.push_back(data::kIgnoreLabel);
      q.positions.push_back(i);
      q.doc_ids.push_back(pad_doc);
    }
  }
  data::SequenceShard sh;
  if (P > 1) {
    sh = data::shard_sequence(q, P, ring_->rank(), spec::CausalBalance::kZigzag);
  } else {
    sh.tokens = q.tokens;
    sh.labels = q.labels;
    sh.positions = q.positions;
    sh.doc_ids = q.doc_ids;
  }
  const auto n = static_cast<int64_t>(sh.tokens.size());
  model::Batch b{n, sh.tokens.data(), sh.labels.data(), sh.positions.data(), sh.doc_ids.data()};
  const model::LossResult r = model_.forward(b, valid);
  std::vector<float> lg(static_cast<size_t>(n * V));
  model::check_status(backend_->copy_to_host(lg.data(), model_.logits(), lg.size() * sizeof(float)),
                      "copy_to_host");
  // Each token's cross-entropy in float64 from its fp32 logits, and its argmax (the first
  // largest, as train::evaluate_passkey takes it).
  std::vector<double> ce(static_cast<size_t>(n), std::numeric_limits<double>::quiet_NaN());
  std::vector<int32_t> am(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const float* row = lg.data() + i * V;
    const int64_t best = std::max_element(row, row + V) - row;
    am[static_cast<size_t>(i)] = static_cast<int32_t>(best);
    const int32_t label = sh.labels[static_cast<size_t>(i)];
    if (label < 0) continue;
    const double mx = row[best];
    double sum = 0;
    for (int64_t c = 0; c < V; ++c) sum += std::exp(static_cast<double>(row[c]) - mx);
    ce[static_cast<size_t>(i)] = mx + std::log(sum) - static_cast<double>(row[label]);
  }
  if (P == 1) {
    out.ce = std::move(ce);
    out.argmax = std::move(am);
    out.model_loss = r.loss;
    if (want_logits) out.logits = std::move(lg);
    return out;
  }
  // Every rank's share to every rank (the same bytes from each: tp / P tokens), rank 0 keeps it.
  std::vector<double> all_ce(static_cast<size_t>(n * P));
  std::vector<int32_t> all_am(static_cast<size_t>(n * P));
  std::vector<double> all_loss(static_cast<size_t>(P));
  ring_->all_gather(ce.data(), all_ce.data(), ce.size() * sizeof(double));
  ring_->all_gather(am.data(), all_am.data(), am.size() * sizeof(int32_t));
  ring_->all_gather(&r.loss, all_loss.data(), sizeof(double));
  std::vector<float> all_lg;
  if (want_logits) {
    all_lg.resize(static_cast<size_t>(n * P * V));
    ring_->all_gather(lg.data(), all_lg.data(), lg.size() * sizeof(float));
    out.logits.assign(static_cast<size_t>(len * V), 0.f);
  }
  for (int64_t rk = 0; rk < P; ++rk) {
    out.model_loss += all_loss[static_cast<size_t>(rk)];
    const std::vector<int64_t> idx =
        cp::rank_token_indices(q.size(), P, rk, spec::CausalBalance::kZigzag);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t at = idx[static_cast<size_t>(i)];
      if (at >= len) continue;  // padding
      out.ce[static_cast<size_t>(at)] = all_ce[static_cast<size_t>(rk * n + i)];
      out.argmax[static_cast<size_t>(at)] = all_am[static_cast<size_t>(rk * n + i)];
      if (want_logits)
        std::memcpy(out.logits.data() + at * V, all_lg.data() + (rk * n + i) * V,
                    static_cast<size_t>(V) * sizeof(float));
    }
  }
  return out;
}

// A .npy file of float32 [rows, vocab] written row block by row block; the header (a fixed 128
// bytes, format 1.0) is written again with the final row count at the end.
class NpyWriter {
 public:
  NpyWriter(const std::string& path, int64_t cols) : path_(path), tmp_(path + ".tmp"), cols_(cols) {
    f_ = std::fopen(tmp_.c_str(), "wb");
    if (f_ == nullptr)
      throw InputError(fmt::format("--logits {}: cannot write {}: {}", path, tmp_,
                                   std::strerror(errno)));
    header();
  }
  ~NpyWriter() {
    if (f_ != nullptr) {
      std::fclose(f_);
      std::remove(tmp_.c_str());
    }
  }
  void append(const float* rows, int64_t n) {
    if (std::fwrite(rows, sizeof(float), static_cast<size_t>(n * cols_), f_) !=
        static_cast<size_t>(n * cols_))
      throw InputError(fmt::format("--logits {}: write failed: {}", path_, std::strerror(errno)));
    rows_ += n;
  }
  void finish() {
    std::fseek(f_, 0, SEEK_SET);
    header();
    const bool ok = std::fflush(f_) == 0 && std::fclose(f_) == 0;
    f_ = nullptr;
    std::error_code ec;
    if (ok) fs::rename(tmp_, path_, ec);
    if (!ok || ec) {
      std::remove(tmp_.c_str());
      throw InputError(fmt::format("--logits {}: cannot write it: {}", path_,
                                   ec ? ec.message() : std::strerror(errno)));
    }
  }
  int64_t rows() const { return rows_; }

 private:
  void header() {
    std::string h = fmt::format("{{'descr': '<f4', 'fortran_order': False, 'shape': ({}, {}), }}",
                                rows_, cols_);
    h.resize(128 - 10 - 1, ' ');
    h += '\n';
    std::string pre = "\x93NUMPY";
    pre += '\x01';
    pre += '\x00';
    pre += static_cast<char>(h.size() & 0xff);
    pre += static_cast<char>(h.size() >> 8);
    std::fwrite(pre.data(), 1, pre.size(), f_);
    std::fwrite(h.data(), 1, h.size(), f_);
  }
  std::string path_, tmp_;
  int64_t cols_ = 0, rows_ = 0;
  std::FILE* f_ = nullptr;
};

struct BucketSum {
  int64_t tokens = 0;
  double loss = 0;
};

struct DataResult {
  int64_t documents = 0, tokens = 0, scored = 0;
  double loss_sum = 0;
  std::vector<BucketSum> buckets = std::vector<BucketSum>(position_buckets().size());
  int64_t logits_rows = 0;
};

// Rank 0's progress on stderr: at most a line a second, and the last.
class Progress {
 public:
  explicit Progress(bool on) : on_(on) {}
  void line(const std::string& s, bool last) {
    if (!on_) return;
    const auto now = Clock::now();
    if (!last && now - last_ < std::chrono::seconds(1)) return;
    last_ = now;
    std::cerr << "eval: " << s << "\n" << std::flush;
  }

 private:
  bool on_;
  Clock::time_point last_ = Clock::now() - std::chrono::seconds(2);
};

size_t bucket_of(int64_t pos) {
  const auto& b = position_buckets();
  for (size_t i = 0; i < b.size(); ++i)
    if (pos >= b[i].lo && (b[i].hi < 0 || pos < b[i].hi)) return i;
  return b.size() - 1;
}

DataResult eval_dataset(Loaded& l, const EvalOpts& o, Evaluator& ev) {
  DataResult res;
  std::optional<NpyWriter> npy;
  if (!o.logits.empty() && ev.lead()) npy.emplace(o.logits, l.mc.vocab);
  Progress progress(ev.lead() && !o.quiet);
  data::SequenceSource& src = *l.source;
  auto* tl = dynamic_cast<data::TextLoader*>(&src);
  for (int64_t d = 0; l.documents < 0 || d < l.documents; ++d) {
    if (tl != nullptr) {
      data::Cursor c = src.cursor();
      c.epoch = 0;
      c.index = l.doc_positions[static_cast<size_t>(d)];
      c.offset = 0;
      src.seek(c);
    } else if (src.cursor().epoch > 0) {
      break;
    }
    data::Sequence seq = src.next_sequence();
    const int64_t len = seq.pad_begin();
    for (auto* v : {&seq.tokens, &seq.labels, &seq.doc_ids}) v->resize(static_cast<size_t>(len));
    seq.positions.resize(static_cast<size_t>(len));
    const Scored sc = ev.run(seq, !o.logits.empty());  // every rank gathers the same
    ++res.documents;
    res.tokens += len;
    if (ev.lead()) {
      for (int64_t i = 0; i < len; ++i) {
        const double c = sc.ce[static_cast<size_t>(i)];
        if (std::isnan(c)) continue;
        // The position of the token in its document: the context the model sees before it
        // predicts the next one (the loader cuts documents at seq_len; a piece starts at 0).
        const int64_t pos = i - seq.cu_seqlens[static_cast<size_t>(seq.doc_ids[static_cast<size_t>(i)])];
        BucketSum& b = res.buckets[bucket_of(pos)];
        b.tokens += 1;
        b.loss += c;
        res.loss_sum += c;
        res.scored += 1;
      }
      if (npy) {
        if (sc.scored) {
          npy->append(sc.logits.data(), len);
        } else {
          // No label: the forward was not run; its rows are NaN rather than missing.
          std::vector<float> nan(static_cast<size_t>(len * l.mc.vocab),
                                 std::numeric_limits<float>::quiet_NaN());
          npy->append(nan.data(), len);
        }
      }
    }
    const bool last = l.documents >= 0 && d + 1 == l.documents;
    progress.line(fmt::format("document {}{}: {} tokens scored, loss {:.4f}", d + 1,
                              l.documents >= 0 ? fmt::format("/{}", l.documents) : "",
                              res.scored, res.scored ? res.loss_sum / res.scored : 0.0),
                  last);
  }
  if (npy) {
    res.logits_rows = npy->rows();
    npy->finish();
  }
  return res;
}

struct PasskeyResult {
  int64_t seq_len = 0;
  PasskeyDepth depth;
  int64_t samples = 0;
  double digit_accuracy = 0, key_accuracy = 0, answer_loss = 0;
  double mean_depth = 0;  // where the key line started, as a fraction of the sample
};

std::vector<PasskeyResult> eval_passkey(const Loaded& l, const EvalOpts& o, Evaluator& ev) {
  std::vector<PasskeyResult> out;
  Progress progress(ev.lead() && !o.quiet);
  for (int64_t len : l.lengths) {
    const data::PasskeyOptions po{len, l.digits, l.seed, data::PasskeyLabels::kAnswer};
    for (const PasskeyDepth& d : l.depths) {
      PasskeyResult pr{len, d};
      int64_t right_digits = 0, digits = 0, right_keys = 0;
      double loss = 0, depth_sum = 0;
      for (int64_t i = 0; i < o.passkey_samples; ++i) {
        const data::PasskeySample s = passkey_at_depth(po, i, d);
        const Scored sc = ev.run(s.sequence, false);
        loss += sc.model_loss;
        depth_sum += static_cast<double>(s.key_start) / static_cast<double>(len);
        bool all = true;
        for (int64_t k = 0; k < s.answer_len; ++k) {
          const int64_t pos = s.first_predicting_position() + k;
          const bool ok = sc.argmax[static_cast<size_t>(pos)] ==
                          static_cast<unsigned char>(s.answer[static_cast<size_t>(k)]);
          right_digits += ok;
          all = all && ok;
          ++digits;
        }
        right_keys += all;
        progress.line(fmt::format("passkey length {} depth {}: sample {}/{}", len, d.text, i + 1,
                                  o.passkey_samples),
                      i + 1 == o.passkey_samples);
      }
      pr.samples = o.passkey_samples;
      pr.digit_accuracy = static_cast<double>(right_digits) / static_cast<double>(digits);
      pr.key_accuracy = static_cast<double>(right_keys) / static_cast<double>(pr.samples);
      pr.answer_loss = loss / static_cast<double>(pr.samples);
      pr.mean_depth = depth_sum / static_cast<double>(pr.samples);
      out.push_back(pr);
    }
  }
  return out;
}

json depth_json(const PasskeyDepth& d) {
  return d.random ? json("random") : json(d.depth);
}

std::string report(const Loaded& l, const EvalOpts& o, const DataResult* dr,
                   const std::vector<PasskeyResult>& pk, int ranks) {
  const char* dtype = l.mc.dtype == spec::DType::kBf16 ? "bf16" : "fp32";
  const auto& names = position_buckets();
  if (o.json) {
    json j;
    j["checkpoint"] = o.checkpoint;
    j["model"] = contract::model_record(l.mc);
    j["dtype"] = dtype;
    j["ranks"] = ranks;
    if (dr != nullptr) {
      j["data"] = {{"source", spec::to_string(l.data.source)},
                   {"paths", l.data.paths},
                   {"tokenizer", l.data.tokenizer},
                   {"seq_len", l.data.seq_len},
                   {"documents", dr->documents},
                   {"tokens", dr->tokens}};
      j["scored_tokens"] = dr->scored;
      j["loss_sum"] = dr->loss_sum;
      j["loss"] = dr->scored ? json(dr->loss_sum / dr->scored) : json(nullptr);
      j["perplexity"] = dr->scored ? json(std::exp(dr->loss_sum / dr->scored)) : json(nullptr);
      j["buckets"] = json::array();
      for (size_t i = 0; i < names.size(); ++i) {
        const BucketSum& b = dr->buckets[i];
        j["buckets"].push_back({{"range", names[i].name},
                                {"lo", names[i].lo},
                                {"hi", names[i].hi < 0 ? json(nullptr) : json(names[i].hi)},
                                {"tokens", b.tokens},
                                {"loss_sum", b.loss},
                                {"loss", b.tokens ? json(b.loss / b.tokens) : json(nullptr)}});
      }
      if (!o.logits.empty())
        j["logits"] = {{"file", o.logits}, {"shape", {dr->logits_rows, l.mc.vocab}}};
    }
    if (!pk.empty()) {
      j["passkey"] = {{"digits", l.digits}, {"seed", l.seed}, {"results", json::array()}};
      for (const PasskeyResult& p : pk)
        j["passkey"]["results"].push_back({{"seq_len", p.seq_len},
                                           {"depth", depth_json(p.depth)},
                                           {"key_depth", p.mean_depth},
                                           {"samples", p.samples},
                                           {"digit_accuracy", p.digit_accuracy},
                                           {"key_accuracy", p.key_accuracy},
                                           {"answer_loss", p.answer_loss}});
    }
    return j.dump(2) + "\n";
  }
  std::string s = fmt::format("model: {} layers, d_model {}, vocab {}, {} ({}{})\n", l.mc.layers,
                              l.mc.d_model, l.mc.vocab, dtype, o.checkpoint,
                              ranks > 1 ? fmt::format(", {} ranks", ranks) : "");
  if (dr != nullptr) {
    s += fmt::format("data: {} {} ({} documents, {} tokens, {} scored)\n",
                     spec::to_string(l.data.source),
                     joined(l.data.paths), dr->documents, dr->tokens, dr->scored);
    if (dr->scored > 0) {
      const double mean = dr->loss_sum / dr->scored;
      s += fmt::format("loss {:.6f} nats/token, perplexity {:.4f}\n", mean, std::exp(mean));
    } else {
      s += "loss: no labelled token\n";
    }
    s += "loss by position in the document (tokens at positions [lo, hi)):\n";
    for (size_t i = 0; i < names.size(); ++i) {
      const BucketSum& b = dr->buckets[i];
      s += b.tokens ? fmt::format("  {:<12} {:>12} tokens  loss {:.6f}\n", names[i].name, b.tokens,
                                  b.loss / b.tokens)
                    : fmt::format("  {:<12} {:>12} tokens\n", names[i].name, 0);
    }
    if (!o.logits.empty())
      s += fmt::format("logits: {} [{}, {}] float32\n", o.logits, dr->logits_rows, l.mc.vocab);
  }
  if (!pk.empty()) {
    s += fmt::format("passkey retrieval ({} digits, seed {}, {} samples each):\n", l.digits,
                     l.seed, o.passkey_samples);
    for (const PasskeyResult& p : pk)
      s += fmt::format(
          "  length {:>8}  depth {:<7} digit accuracy {:.3f}  key accuracy {:.3f}  answer loss "
          "{:.4f}\n",
          p.seq_len, p.depth.text, p.digit_accuracy, p.key_accuracy, p.answer_loss);
  }
  return s;
}

int evaluate_and_write(const EvalOpts& o, Loaded& l, Evaluator& ev, int ranks) {
  std::optional<DataResult> dr;
  if (l.has_data) dr = eval_dataset(l, o, ev);
  std::vector<PasskeyResult> pk;
  if (!l.depths.empty()) pk = eval_passkey(l, o, ev);
  if (!ev.lead()) return kExitOk;
  const std::string text = report(l, o, dr ? &*dr : nullptr, pk, ranks);
  gen::write_output(o.out, text);
  return kExitOk;
}

}  // namespace

void check_inputs(const EvalOpts& o) {
  (void)load(o, true);
}

int run_alone(const EvalOpts& o) {
  Loaded l = load(o, o.quiet);
  std::string err;
  auto backend = kernels::create_backend(o.backend, o.threads, &err);
  if (!backend)
    throw InputError(fmt::format("--backend {}: cannot create the {} backend: {}", o.backend,
                                 o.backend, err));
  Evaluator ev(l.mc, l.params, backend.get(), nullptr);
  return evaluate_and_write(o, l, ev, 1);
}

int run_rank(const EvalOpts& o, const Identity& id) {
  Loaded l = load(o, id.rank != 0 || o.quiet);
  std::string err;
  // The ring's transports move host buffers: the cpu backend (as generate's prefill).
  auto backend = kernels::create_backend("cpu", o.threads, &err);
  if (!backend) throw InputError("cannot create the cpu backend: " + err);
  gen::RingOptions ro;
  ro.rank = id.rank;
  ro.ranks = id.world;
  ro.rendezvous = id.rendezvous;
  ro.transport = o.transport;
  ro.bootstrap_timeout_ms = o.timeout_s * 1000;
  ro.timeout_ms = o.timeout_s * 1000;
  ro.wire = l.mc.dtype == spec::DType::kBf16 ? kernels::DType::kBF16 : kernels::DType::kF32;
  std::optional<gen::GenerateRing> ring;
  try {
    ring.emplace(backend.get(), ro);
  } catch (const transport::TransportError& e) {
    throw InputError(fmt::format("rank {} of {}: transport: {}", id.rank, id.world, e.what()));
  }
  const std::string who = fmt::format("ringctl eval: rank {} of {}", id.rank, id.world);
  std::optional<Evaluator> ev;
  return cp::run_then_exit_on_error(who, kExitFailed, [&] {
    ev.emplace(l.mc, l.params, backend.get(), &*ring);
    const int rc = evaluate_and_write(o, l, *ev, id.world);
    ring->shutdown();
    return rc;
  });
}

}  // namespace ring::eval
