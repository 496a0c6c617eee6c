// worker/generate/generate_run.h: loading, generating and writing, for `ringctl generate` and
// `ring-worker --generate`.
#include "worker/generate/generate_run.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/contract/layout.h"
#include "common/files/atomic_write.h"
#include "common/files/read_file.h"
#include "common/contract/timeline.h"
#include "common/spec/parse.h"
#include "common/checkpoint/checkpoint.h"
#include "common/checkpoint/model.h"
#include "kernels/backend.h"
#include "worker/data/errors.h"
#include "worker/generate/ring_generate.h"
#include "worker/ring/ring_rank.h"

namespace ring::gen {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr int kExitOk = 0;
constexpr int kExitFailed = 1;

}  // namespace

// "256MiB", "1G", "4096", "1.5GiB": bytes (K/M/G/T, with or without "iB"/"B", powers of 1024).
int64_t parse_size(const std::string& flag, const std::string& text) {
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  std::string unit = text.substr(used);
  double mult = 1;
  if (used == 0) {
    throw UsageError(
        fmt::format("{} '{}': expected a size such as 4096, 512MiB or 2G", flag, text));
  }
  if (unit.empty() || unit == "B") {
    mult = 1;
  } else {
    const char u = static_cast<char>(std::toupper(static_cast<unsigned char>(unit[0])));
    const std::string rest = unit.substr(1);
    if (!(rest.empty() || rest == "B" || rest == "iB"))
      throw UsageError(
          fmt::format("{} '{}': unknown unit '{}' (K, M, G, T, e.g. 512MiB)", flag, text, unit));
    switch (u) {
      case 'K':
        mult = 1024.0;
        break;
      case 'M':
        mult = 1024.0 * 1024;
        break;
      case 'G':
        mult = 1024.0 * 1024 * 1024;
        break;
      case 'T':
        mult = 1024.0 * 1024 * 1024 * 1024;
        break;
      default:
        throw UsageError(
            fmt::format("{} '{}': unknown unit '{}' (K, M, G, T, e.g. 512MiB)", flag, text, unit));
    }
  }
  const double bytes = v * mult;
  if (!(bytes >= 0) || bytes > 9.0e18)
    throw UsageError(fmt::format("{} '{}': must be a size >= 0", flag, text));
  return static_cast<int64_t>(bytes);
}

// The model config a checkpoint records (ckpt::read_checkpoint_model: its shape and, record 2,
// its settings); with a spec, the spec's model section where the checkpoint records no settings.
contract::ModelConfig model_of_checkpoint(const std::string& path,
                                                 const contract::ModelConfig* spec_mc,
                                                 const std::string& spec_path, bool quiet) {
  ckpt::CheckpointModel cm;
  try {
    cm = ckpt::read_checkpoint_model(path);
  } catch (const ckpt::CheckpointError& e) {
    if (spec_mc != nullptr) return *spec_mc;  // format 1: the spec says the model
    throw InputError(fmt::format("--checkpoint {}: {}", path, e.what()));
  }
  if (spec_mc == nullptr) {
    if (!cm.settings && !quiet)
      std::cerr << "note: the checkpoint records the model's shape only (written before its "
                   "settings were recorded): rope_theta 10000, norm_eps 1e-5 and no RoPE "
                   "scaling (the spec defaults) are assumed (--spec names the training spec)\n";
    return cm.config;
  }
  // The shape must be the checkpoint's; its settings win over the spec's where it records them.
  const nlohmann::json have = contract::model_record(cm.config);
  const nlohmann::json want = contract::model_record(*spec_mc);
  for (const char* k : {"layers", "d_model", "heads", "kv_heads", "head_dim", "mlp", "mlp_hidden",
                        "vocab", "tie_embeddings"})
    if (have.at(k) != want.at(k))
      throw InputError(fmt::format("--spec {}: model.{} is {} but the checkpoint {} has {}",
                                   spec_path, k, want.at(k).dump(), cm.step_dir,
                                   have.at(k).dump()));
  if (!cm.settings) return *spec_mc;
  for (auto it = have.begin(); it != have.end() && !quiet; ++it) {
    const nlohmann::json said = want.value(it.key(), nlohmann::json());
    if (it.key() != "max_positions" && it.key() != "dtype" && said != *it)
      std::cerr << fmt::format("note: model.{} {} of the checkpoint is used (--spec {} says {})\n",
                               it.key(), it->dump(), spec_path, said.dump());
  }
  return cm.config;
}

// The cache options that do not depend on the model, checked before anything is loaded: a
// fast tier that cannot hold the sliding window, a disk tier this process cannot write.
static void check_cache_options(const gen::CacheConfig& c) {
  if (c.fast_bytes == 0 && c.window != 0)
    throw UsageError(
        "--fast-bytes (generate.fast_gb) 0: the fast tier holds the sliding window (--window, "
        "default one page per layer and KV head), so it cannot be empty; give a size such as "
        "256MiB (or --window 0 for no window)");
  if (c.disk_dir.empty()) return;
  std::error_code ec;
  if (!fs::is_directory(c.disk_dir, ec))
    throw UsageError(
        fmt::format("--disk-dir (generate.disk_dir) {}: not a directory", c.disk_dir));
  if (::access(c.disk_dir.c_str(), W_OK | X_OK) != 0)
    throw UsageError(fmt::format(
        "--disk-dir (generate.disk_dir) {}: not writable by this process ({}); the disk tier "
        "writes its pages there",
        c.disk_dir, std::strerror(errno)));
}

// --dtype: "" (the model's own), fp32 or bf16; a usage error otherwise.
static std::optional<spec::DType> dtype_flag(const std::string& v) {
  if (v.empty()) return std::nullopt;
  if (v == "fp32") return spec::DType::kFp32;
  if (v == "bf16") return spec::DType::kBf16;
  if (v == "fp16")
    throw UsageError(
        "--dtype fp16: not supported; generation computes in fp32 or bf16 (bf16 has fp32's "
        "range; docs/precision.md)");
  throw UsageError(fmt::format("--dtype '{}': fp32 or bf16", v));
}

static std::string read_file(const std::string& path) {
  try {
    return files::read_regular_file(path);
  } catch (const files::ReadError& e) {
    throw InputError(std::string("prompt ") + e.what());
  }
}

// The cache's messages name its settings; here they are flags.
std::string as_flags(std::string m) {
  const std::pair<const char*, const char*> names[] = {
      {"fast_bytes", "--fast-bytes (generate.fast_gb)"},
      {"host_bytes", "--host-bytes (generate.host_gb)"},
      {"disk_dir", "--disk-dir (generate.disk_dir)"},
      {"page_tokens", "--page-tokens (generate.page_tokens)"},
      {"lower window", "lower --window (generate.window)"}};
  for (const auto& [from, to] : names) {
    for (size_t at = m.find(from); at != std::string::npos; at = m.find(from, at + 1)) {
      m.replace(at, std::strlen(from), to);
      at += std::strlen(to) - 1;
    }
  }
  return m;
}

void write_output(const std::string& out, const std::string& text) {
  if (out.empty()) {
    std::cout << text << std::flush;
    return;
  }
  try {
    files::write_file_atomic(out, text, 0600);
  } catch (const files::AtomicWriteError& e) {
    throw InputError(fmt::format("-o {}: {}", out, e.what()));
  }
}

std::vector<float> load_checkpoint_weights(const std::string& path,
                                           const contract::ModelConfig& mc) {
  // Weights: master/<param> of the checkpoint, by name.
  const contract::ParamLayout pl(mc);
  std::vector<float> params(static_cast<size_t>(pl.total()), 0.f);
  std::vector<ckpt::LoadTarget> targets;
  for (const auto& v : pl.views()) {
    ckpt::LoadTarget t{"master/" + v.name, ckpt::DType::kF32, v.shape, params.data() + v.offset};
    t.flat_name = "master";
    t.flat_offset = v.offset;
    targets.push_back(std::move(t));
  }
  try {
    ckpt::load_from_path(path, 0, 1, targets);
  } catch (const ckpt::CheckpointError& e) {
    throw InputError(fmt::format("--checkpoint {}: {}", path, e.what()));
  }
  return params;
}

Inputs load_inputs(const GenerateOpts& o, bool quiet) {
  Inputs in;
  gen::GeneratorOptions& go = in.go;
  go.threads = o.threads;
  go.cache.page_tokens = o.page_tokens;
  go.cache.fast_bytes = parse_size("--fast-bytes", o.fast_bytes);
  go.cache.host_bytes = parse_size("--host-bytes", o.host_bytes);
  go.cache.disk_dir = o.disk_dir;
  go.cache.window = o.window;
  go.approximate = o.approximate;
  go.cache.host_int8 = o.host_int8;
  in.sp = gen::SamplingParams{o.temperature, o.top_p, o.seed};
  if (o.prompts.empty()) throw UsageError("at least one PROMPT_FILE is required");
  const std::optional<spec::DType> dtype = dtype_flag(o.dtype);

  contract::ModelConfig& mc = in.mc;
  std::unique_ptr<data::Tokenizer>& tok = in.tok;
  if (!o.spec.empty()) {
    // The rules of a spec ring-worker runs alone, not ringd's: only the model, data.tokenizer
    // and generate sections are used here (a passkey spec trained with offload none is fine).
    auto r = spec::load_spec_file(o.spec);
    if (!quiet || !r.ok())
      for (const auto& d : r.diagnostics) std::cerr << d.str() << "\n";
    if (!r.ok()) throw InputError(fmt::format("--spec {}: {} error(s)", o.spec, r.error_count()));
    // The spec's generate section, where no flag says otherwise.
    const spec::GenerateSection& gs = r.spec->generate;
    if (!o.has_page_tokens) go.cache.page_tokens = gs.page_tokens;
    if (!o.has_fast) go.cache.fast_bytes = static_cast<int64_t>(gs.fast_gb * 1e9);
    if (!o.has_host) go.cache.host_bytes = static_cast<int64_t>(gs.host_gb * 1e9);
    if (!o.has_disk) go.cache.disk_dir = gs.disk_dir;
    if (!o.has_window) go.cache.window = gs.window;
    contract::ModelConfig spec_mc;
    try {
      spec_mc = contract::ModelConfig::from_spec(*r.spec);
    } catch (const contract::ModelError& e) {
      throw InputError(fmt::format("--spec {}: {}", o.spec, e.what()));
    }
    check_cache_options(go.cache);
    mc = model_of_checkpoint(o.checkpoint, &spec_mc, o.spec, quiet);
    if (!r.spec->data.tokenizer.empty()) {
      try {
        tok = data::Tokenizer::load(r.spec->data.tokenizer);
      } catch (const data::DataError& e) {
        throw InputError(fmt::format("--spec {}: data.tokenizer: {}", o.spec, e.what()));
      }
    }
  } else {
    check_cache_options(go.cache);
    mc = model_of_checkpoint(o.checkpoint, nullptr, "", quiet);
  }
  // What the generation computes in (docs/generation.md, "bf16"): the model's dtype as read above
  // (the checkpoint's record; the spec's model.dtype for a checkpoint that records no settings),
  // unless --dtype says otherwise. bf16: the model's bf16 forward and bf16 KV pages.
  if (dtype) mc.dtype = *dtype;
  if (mc.dtype == spec::DType::kFp16)
    throw InputError(
        "model.dtype fp16: generation computes in fp32 or bf16 (--dtype chooses one; "
        "docs/precision.md)");
  if (!tok && mc.vocab < 256)
    throw InputError(fmt::format(
        "the model's vocab is {} and no tokenizer is given: byte prompts need vocab >= 256 "
        "(--spec with data.tokenizer for a SentencePiece model)",
        mc.vocab));

  in.params = load_checkpoint_weights(o.checkpoint, mc);

  // Prompts.
  std::vector<std::vector<int32_t>>& ids = in.ids;
  for (const auto& f : o.prompts) {
    const std::string text = read_file(f);
    std::vector<int32_t> p;
    if (tok) {
      if (tok->bos_id() >= 0) p.push_back(tok->bos_id());
      tok->encode(text, p);
    } else {
      for (unsigned char ch : text) p.push_back(ch);
    }
    if (p.empty()) throw InputError(fmt::format("prompt {}: is empty (no tokens)", f));
    ids.push_back(std::move(p));
  }
  return in;
}

// Sums of every rank's cache statistics (one rank: its own).
struct CacheTotals {
  gen::CacheStats cs;
  gen::DecodeStats ds;
};

static CacheTotals cache_totals(gen::Generator& g, gen::GenerateRing* ring) {
  CacheTotals t{g.cache().stats(), g.decode_stats()};
  if (ring == nullptr) return t;
  const gen::CacheStats& c = t.cs;
  const gen::DecodeStats& d = t.ds;
  constexpr int kN = 15;
  const int64_t mine[kN] = {c.pages,      c.shared_hits,         c.fast_pages,      c.host_pages,
                            c.disk_pages, c.fast_capacity_bytes, c.fast_peak_bytes, c.host_bytes,
                            c.disk_bytes, c.promotions,          d.fast_tasks,      d.host_tasks,
                            d.disk_tasks, d.shared_tasks,        d.skipped_tasks};
  std::vector<int64_t> all(static_cast<size_t>(kN * ring->ranks()));
  ring->all_gather(mine, all.data(), sizeof(mine));
  int64_t sum[kN] = {};
  for (int r = 0; r < ring->ranks(); ++r)
    for (int i = 0; i < kN; ++i) sum[i] += all[static_cast<size_t>(r * kN + i)];
  t.cs.pages = sum[0];
  t.cs.shared_hits = sum[1];
  t.cs.fast_pages = sum[2];
  t.cs.host_pages = sum[3];
  t.cs.disk_pages = sum[4];
  t.cs.fast_capacity_bytes = sum[5];
  t.cs.fast_peak_bytes = sum[6];
  t.cs.host_bytes = sum[7];
  t.cs.disk_bytes = sum[8];
  t.cs.promotions = sum[9];
  t.ds.fast_tasks = sum[10];
  t.ds.host_tasks = sum[11];
  t.ds.disk_tasks = sum[12];
  t.ds.shared_tasks = sum[13];
  t.ds.skipped_tasks = sum[14];
  return t;
}

// Generates from every prompt with g (ring: a rank of a sharded generation, where rank 0's
// sampled tokens are every rank's) and writes the output (on rank 0 only).
static int generate_and_write(const GenerateOpts& o, Inputs& in, gen::Generator& g,
                              gen::GenerateRing* ring) {
  const gen::GeneratorOptions& go = in.go;
  const gen::SamplingParams& sp = in.sp;
  const contract::ModelConfig& mc = in.mc;
  const std::unique_ptr<data::Tokenizer>& tok = in.tok;
  const std::vector<std::vector<int32_t>>& ids = in.ids;
  using Clock = std::chrono::steady_clock;
  // Rank 0's choice of next token for each entry is every rank's (the logits are the same on
  // every rank; this keeps the ranks in step even where floating point differs between hosts).
  auto agree = [&](std::vector<int32_t>* t) {
    if (ring == nullptr || t->empty()) return;
    std::vector<int32_t> all(t->size() * static_cast<size_t>(ring->ranks()));
    ring->all_gather(t->data(), all.data(), t->size() * sizeof(int32_t));
    std::copy(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(t->size()), t->begin());
  };
  struct Out {
    std::vector<int32_t> tokens;
    std::vector<double> times;
    std::vector<double> bounds;  // approximate mode: skipped-mass bound per decode step
    double prefill_s = 0;
    bool done = false;
    int handle = -1;
    std::unique_ptr<gen::Sampler> sampler;
    int32_t next = 0;
  };
  std::vector<Out> outs(ids.size());
  std::vector<float> logits;
  for (size_t i = 0; i < ids.size(); ++i) {
    const auto t0 = Clock::now();
    outs[i].handle = g.prefill(ids[i], {}, &logits);
    outs[i].prefill_s = std::chrono::duration<double>(Clock::now() - t0).count();
    outs[i].sampler = std::make_unique<gen::Sampler>(sp, i);
    outs[i].next = outs[i].sampler->sample(logits.data(), mc.vocab);
    if (o.progress && (ring == nullptr || ring->rank() == 0))
      o.progress(
          fmt::format("prefill {}/{}: {} tokens in {:.3f} s ({:.0f} tokens/s)", i + 1, ids.size(),
                      ids[i].size(), outs[i].prefill_s,
                      static_cast<double>(ids[i].size()) / std::max(outs[i].prefill_s, 1e-9)));
  }
  const auto decode_t0 = Clock::now();
  int64_t decoded = 0;  // tokens sampled by decode steps, over the batch
  auto last_progress = decode_t0 - std::chrono::seconds(1);
  if (ring != nullptr) {
    std::vector<int32_t> first;
    for (const Out& x : outs) first.push_back(x.next);
    agree(&first);
    for (size_t i = 0; i < outs.size(); ++i) outs[i].next = first[i];
  }
  const int32_t eos = tok ? tok->eos_id() : -1;
  for (int64_t n = 0; n < o.max_tokens; ++n) {
    std::vector<int> seqs;
    std::vector<int32_t> next;
    std::vector<size_t> which;
    for (size_t i = 0; i < outs.size(); ++i) {
      Out& x = outs[i];
      if (x.done) continue;
      x.tokens.push_back(x.next);
      if (x.next == eos || n + 1 == o.max_tokens) {
        x.done = true;
        continue;
      }
      seqs.push_back(x.handle);
      next.push_back(x.next);
      which.push_back(i);
    }
    if (seqs.empty()) break;
    const int64_t step_t0 = contract::timeline::now_ns();
    gen::StepTiming t = g.step(seqs, next, &logits);
    std::vector<int32_t> chosen;
    for (size_t b = 0; b < which.size(); ++b) {
      Out& x = outs[which[b]];
      x.times.push_back(t.seconds);
      x.bounds.push_back(t.skipped_mass_bound[b]);
      x.next = x.sampler->sample(logits.data() + static_cast<int64_t>(b) * mc.vocab, mc.vocab);
      chosen.push_back(x.next);
    }
    if (ring != nullptr) {
      agree(&chosen);
      for (size_t b = 0; b < which.size(); ++b) outs[which[b]].next = chosen[b];
    }
    decoded += static_cast<int64_t>(which.size());
    // The decode step into the flight recorder (under ringd): progress, and its time sets the
    // hang deadline.
    if (contract::timeline::TimelineWriter* tl = contract::timeline::active()) {
      tl->set_step(n + 1);
      tl->record({.kind = contract::timeline::Phase::kDecode,
                  .step = n + 1,
                  .begin_ns = step_t0,
                  .end_ns = contract::timeline::now_ns()});
    }
    // At most one line a second (and the last step's).
    if (o.progress && (ring == nullptr || ring->rank() == 0) && o.progress_every > 0 &&
        (((n + 1) % o.progress_every == 0 &&
          Clock::now() - last_progress >= std::chrono::seconds(1)) ||
         n + 2 == o.max_tokens)) {
      last_progress = Clock::now();
      const double s = std::chrono::duration<double>(Clock::now() - decode_t0).count();
      o.progress(
          fmt::format("decode {}/{} tokens per prompt, {} prompt(s): {:.1f} tokens/s, "
                      "last step {:.2f} ms",
                      n + 2, o.max_tokens, which.size(),
                      static_cast<double>(decoded) / std::max(s, 1e-9), t.seconds * 1e3));
    }
  }
  const CacheTotals totals = cache_totals(g, ring);
  if (ring != nullptr && ring->rank() != 0) return kExitOk;  // rank 0 writes the output

  auto text_of = [&](const std::vector<int32_t>& t) {
    if (tok) return tok->decode(t);
    std::string s;
    for (int32_t id : t) s.push_back(static_cast<char>(id & 0xff));
    return s;
  };
  if (o.host_int8)
    std::cerr << "INT8 host-tier K/V (--host-int8): full pages in host memory are quantized; "
                 "results are not exact\n";
  if (o.approximate > 0) {
    // Labelled wherever it shows: here on stderr, in --json under "attention".
    double worst = 0;
    for (const auto& x : outs)
      for (double b : x.bounds) worst = std::max(worst, b);
    std::cerr << fmt::format(
        "APPROXIMATE attention (--approximate {}): {} page computations skipped; largest bound "
        "on the skipped softmax mass of a token: {:.3g}\n",
        o.approximate, totals.ds.skipped_tasks, worst);
  }
  std::string result;
  if (o.json) {
    json j;
    j["model"] = contract::model_record(mc);
    j["sampling"] = {{"temperature", sp.temperature}, {"top_p", sp.top_p}, {"seed", sp.seed}};
    j["attention"] = o.approximate > 0 ? json{{"mode", "approximate"}, {"threshold", o.approximate}}
                                       : json{{"mode", "exact"}};
    const char* kv = mc.dtype == spec::DType::kBf16 ? "bf16" : "fp32";
    j["dtype"] = kv;
    j["attention"]["kv"] = kv;
    j["attention"]["host_kv"] = o.host_int8 ? "int8 (not exact)" : kv;
    // Sharded: the cache's statistics are the sums over the ranks.
    if (ring != nullptr) j["ranks"] = {{"ranks", ring->ranks()}, {"split", o.split}};
    j["backend"] = o.backend;
    const gen::CacheStats& cs = totals.cs;
    const gen::DecodeStats& ds = totals.ds;
    j["cache"] = {{"page_tokens", go.cache.page_tokens},
                  {"pages", cs.pages},
                  {"shared_page_hits", cs.shared_hits},
                  {"fast_pages", cs.fast_pages},
                  {"host_pages", cs.host_pages},
                  {"disk_pages", cs.disk_pages},
                  {"fast_capacity_bytes", cs.fast_capacity_bytes},
                  {"fast_peak_bytes", cs.fast_peak_bytes},
                  {"host_bytes", cs.host_bytes},
                  {"disk_bytes", cs.disk_bytes},
                  {"promotions", cs.promotions},
                  {"page_tasks",
                   {{"fast", ds.fast_tasks},
                    {"host", ds.host_tasks},
                    {"disk", ds.disk_tasks},
                    {"shared", ds.shared_tasks},
                    {"skipped", ds.skipped_tasks}}}};
    j["prompts"] = json::array();
    for (size_t i = 0; i < outs.size(); ++i) {
      // The first token comes from the prefill's logits; each later one from a decode step.
      j["prompts"].push_back({{"file", o.prompts[i]},
                              {"prompt_tokens", ids[i].size()},
                              {"tokens", outs[i].tokens},
                              {"text", text_of(outs[i].tokens)},
                              {"prefill_s", outs[i].prefill_s},
                              {"step_s", outs[i].times}});
      if (o.approximate > 0) j["prompts"].back()["skipped_mass_bound"] = outs[i].bounds;
    }
    result = j.dump(2, ' ', false, json::error_handler_t::replace) + "\n";
  } else {
    for (size_t i = 0; i < outs.size(); ++i) {
      if (outs.size() > 1) result += fmt::format("==> {} <==\n", o.prompts[i]);
      result += text_of(outs[i].tokens);
      if (outs.size() > 1) result += "\n";
    }
  }
  write_output(o.out, result);
  return kExitOk;
}

// Every prompt can be cut over the ranks (before any rank joins the others).
void check_split(const GenerateOpts& o, const Inputs& in, int world) {
  const int64_t need = o.split == "zigzag" ? 2LL * world : world;
  for (size_t i = 0; i < in.ids.size(); ++i)
    if (static_cast<int64_t>(in.ids[i].size()) < need)
      throw InputError(fmt::format(
          "prompt {}: {} tokens cannot be cut over {} ranks (the {} split needs at least {})",
          o.prompts[i], in.ids[i].size(), world, o.split, need));
}

// One rank of a sharded generation.
int run_rank(const GenerateOpts& o, const Identity& id) {
  Inputs in = load_inputs(o, id.rank != 0);
  check_split(o, in, id.world);
  std::string err;
  // The prefill runs on the cpu backend (the ring's transports move host buffers); a device
  // backend holds this rank's fast tier and runs the decode step's dense layers (generator.h).
  auto backend = kernels::create_backend("cpu", o.threads, &err);
  if (!backend) throw InputError("cannot create the cpu backend: " + err);
  std::unique_ptr<kernels::Backend> device;
  if (o.backend != "cpu") {
    device = kernels::create_backend(o.backend, o.threads, &err);
    if (!device)
      throw InputError(fmt::format("--backend {}: rank {} of {}: cannot create the {} backend: {}",
                                   o.backend, id.rank, id.world, o.backend, err));
    in.go.device = device.get();
  }
  if (o.head_ranks > 1) {
    const int64_t u = o.head_ranks, kv = in.mc.kv_heads;
    if (id.world % u != 0 || in.mc.heads % u != 0 || (kv % u != 0 && u % kv != 0))
      throw InputError(fmt::format(
          "head ranks {} (parallel.head_ranks / --head-ranks) must divide the {} ranks and the "
          "model's {} heads, and divide its {} K/V heads or be a multiple of them",
          u, id.world, in.mc.heads, kv));
  }
  gen::RingOptions ro;
  ro.rank = id.rank;
  ro.ranks = id.world;
  ro.rendezvous = id.rendezvous;
  ro.transport = o.transport;
  ro.bootstrap_timeout_ms = o.timeout_s * 1000;
  ro.timeout_ms = o.timeout_s * 1000;
  // A bf16 model's prefill sends its (bf16) K/V blocks in bf16: exact, half the bytes.
  ro.wire = in.mc.dtype == spec::DType::kBf16 ? kernels::DType::kBF16 : kernels::DType::kF32;
  ro.head_ranks = o.head_ranks;
  std::optional<gen::GenerateRing> ring;
  try {
    ring.emplace(backend.get(), ro);
  } catch (const transport::TransportError& e) {
    throw InputError(fmt::format("rank {} of {}: transport: {}", id.rank, id.world, e.what()));
  }
  in.go.shard = ring->shard(o.split == "contiguous" ? spec::CausalBalance::kContiguous
                                                    : spec::CausalBalance::kZigzag);
  // From here on transfers may be in flight: an error ends the process at once (ring_rank.h).
  std::optional<gen::Generator> g;
  const std::string who = fmt::format("{}: rank {} of {}", o.program, id.rank, id.world);
  return cp::run_then_exit_on_error(who, kExitFailed, [&] {
    g.emplace(in.mc, in.params.data(), backend.get(), in.go);
    const int rc = generate_and_write(o, in, *g, &*ring);
    ring->shutdown();
    return rc;
  });
}

int run_alone(const GenerateOpts& o) {
  Inputs in = load_inputs(o, false);
  std::string err;
  auto backend = kernels::create_backend(o.backend, o.threads, &err);
  if (!backend)
    throw InputError(fmt::format("--backend {}: cannot create the {} backend: {}", o.backend,
                                 o.backend, err));
  Generator g(in.mc, in.params.data(), backend.get(), in.go);
  return generate_and_write(o, in, g, nullptr);
}

}  // namespace ring::gen
