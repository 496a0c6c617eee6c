// ringctl generate --checkpoint DIR PROMPT_FILE...: text generation from a checkpoint's weights
// over the paged, tiered KV cache (worker/generate/, docs/generation.md).
//
// The model config comes from --spec (the whole spec: model section, and data.tokenizer for a
// SentencePiece model) or else from the checkpoint's layout record (format 2), which records the
// shapes but not rope_theta, norm_eps or RoPE scaling: the spec defaults are used then and a note
// says so. Each prompt file is one sequence: its bytes are the token ids of a byte model (vocab
// >= 256, no tokenizer), or it is encoded with the tokenizer (BOS first when the model has one).
// All prompts are prefilled (pages of a common prefix are stored once) and decoded together, one
// batch step per token. Output: the generated text of each prompt (bytes for byte models), or
// with --json one object with the tokens, text and per-token timing of each prompt and the
// cache's tier statistics.
//
// Over P ranks (docs/generation.md, "Generation over several ranks"): --ranks P starts P local
// processes of this command (a fresh rendezvous directory; each rank dies with the launcher, and
// when one fails the others are stopped), each with --rank R --world P --rendezvous DIR; under
// srun (SLURM_PROCID, SLURM_STEP_NUM_TASKS > 1) every task is one rank and --rendezvous names a
// directory all tasks reach. The prompts are prefilled with ring attention across the ranks, the
// cache stays sharded, each decode step exchanges only the partial (o, lse) of every layer, and
// rank 0's sampled tokens are every rank's; rank 0 writes the output.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/ctl_common.h"
#include "common/contract/layout.h"
#include "common/proc/reap.h"
#include "common/proc/spawn.h"
#include "common/spec/parse.h"
#include "daemon/checkpoint/checkpoint.h"
#include "kernels/backend.h"
#include "worker/data/errors.h"
#include "worker/data/tokenizer.h"
#include "worker/generate/generator.h"
#include "worker/generate/ring_generate.h"
#include "worker/generate/sampling.h"
#include "worker/ring/ring_rank.h"

namespace ring::cli {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

struct GenerateOpts {
  std::string checkpoint;
  std::vector<std::string> prompts;
  std::string out;
  bool json = false;
  int64_t max_tokens = 64;
  double temperature = 0.0;
  double top_p = 1.0;
  uint64_t seed = 0;
  int64_t page_tokens = 1024;
  std::string fast_bytes = "256MiB";
  std::string host_bytes = "0";
  std::string disk_dir;
  int64_t window = -1;
  std::string spec;
  int threads = 0;
  std::string backend = "cpu";
  double approximate = 0.0;
  bool host_int8 = false;
  // Several ranks: --ranks P launches P local ranks; a rank has --rank/--world/--rendezvous
  // (or SLURM_PROCID / SLURM_STEP_NUM_TASKS under srun).
  int ranks = 1;
  std::string split = "zigzag";
  int rank = -1, world = 0;
  std::string rendezvous;
  std::string transport = "ucx";
  int timeout_s = 600;
  // Cache flags given on the command line (they override the spec's generate section).
  bool has_page_tokens = false, has_fast = false, has_host = false, has_disk = false,
       has_window = false;
};

// A usage error naming the flag.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};
// An input that cannot be used (checkpoint, prompt, spec): exit 1.
struct InputError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

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
    throw UsageError(fmt::format("{} '{}': expected a size such as 4096, 512MiB or 2G", flag, text));
  }
  if (unit.empty() || unit == "B") {
    mult = 1;
  } else {
    const char u = static_cast<char>(std::toupper(static_cast<unsigned char>(unit[0])));
    const std::string rest = unit.substr(1);
    if (!(rest.empty() || rest == "B" || rest == "iB"))
      throw UsageError(fmt::format("{} '{}': unknown unit '{}' (K, M, G, T, e.g. 512MiB)", flag,
                                   text, unit));
    switch (u) {
      case 'K': mult = 1024.0; break;
      case 'M': mult = 1024.0 * 1024; break;
      case 'G': mult = 1024.0 * 1024 * 1024; break;
      case 'T': mult = 1024.0 * 1024 * 1024 * 1024; break;
      default:
        throw UsageError(fmt::format("{} '{}': unknown unit '{}' (K, M, G, T, e.g. 512MiB)", flag,
                                     text, unit));
    }
  }
  const double bytes = v * mult;
  if (!(bytes >= 0) || bytes > 9.0e18)
    throw UsageError(fmt::format("{} '{}': must be a size >= 0", flag, text));
  return static_cast<int64_t>(bytes);
}

// The model config from the layout record of the checkpoint at path (a step directory or a
// checkpoint root: its newest complete step).
contract::ModelConfig config_from_checkpoint(const std::string& path) {
  std::error_code ec;
  std::optional<ckpt::Layout> layout;
  try {
    if (fs::exists(fs::path(path) / "checkpoint.json", ec)) {
      ckpt::CheckpointInfo info = ckpt::inspect_checkpoint(path, false);
      if (info.status != ckpt::Status::kComplete)
        throw InputError(fmt::format("--checkpoint {}: not a complete checkpoint: {}", path,
                                     info.problems.empty() ? "?" : info.problems.front()));
      layout = info.layout;
    } else {
      auto list = ckpt::list_checkpoints(path, false);
      if (list.empty()) throw InputError(fmt::format("--checkpoint {}: holds no checkpoint", path));
      bool found = false;
      for (auto it = list.rbegin(); it != list.rend() && !found; ++it)
        if (it->status == ckpt::Status::kComplete) {
          layout = it->layout;
          found = true;
        }
      if (!found)
        throw InputError(fmt::format("--checkpoint {}: holds no complete checkpoint", path));
    }
  } catch (const ckpt::CheckpointError& e) {
    throw InputError(fmt::format("--checkpoint {}: {}", path, e.what()));
  }
  if (!layout || !layout->model.is_object())
    throw InputError(fmt::format(
        "--checkpoint {}: records no model config (a format 1 checkpoint); give --spec with the "
        "spec it was trained with",
        path));
  const json& m = layout->model;
  contract::ModelConfig c;
  try {
    c.layers = m.at("layers");
    c.d_model = m.at("d_model");
    c.heads = m.at("heads");
    c.kv_heads = m.at("kv_heads");
    c.head_dim = m.at("head_dim");
    c.mlp_hidden = m.at("mlp_hidden");
    c.vocab = m.at("vocab");
    c.tie_embeddings = m.at("tie_embeddings");
    const std::string mlp = m.at("mlp");
    if (mlp == "swiglu") {
      c.mlp = spec::MlpKind::kSwiGLU;
    } else if (mlp == "gelu") {
      c.mlp = spec::MlpKind::kGelu;
    } else {
      throw InputError(fmt::format("--checkpoint {}: layout record: unknown mlp '{}'", path, mlp));
    }
    c.check();
  } catch (const json::exception& e) {
    throw InputError(fmt::format("--checkpoint {}: layout record: {}", path, e.what()));
  } catch (const contract::ModelError& e) {
    throw InputError(fmt::format("--checkpoint {}: layout record: {}", path, e.what()));
  }
  return c;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(fmt::format("prompt {}: cannot read: {}", path, std::strerror(errno)));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
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

// Everything a generation needs, checked: flags first (usage errors), then the inputs.
struct Inputs {
  gen::GeneratorOptions go;
  gen::SamplingParams sp;
  contract::ModelConfig mc;
  std::unique_ptr<data::Tokenizer> tok;
  std::vector<float> params;
  std::vector<std::vector<int32_t>> ids;
};

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
    try {
      mc = contract::ModelConfig::from_spec(*r.spec);
    } catch (const contract::ModelError& e) {
      throw InputError(fmt::format("--spec {}: {}", o.spec, e.what()));
    }
    if (!r.spec->data.tokenizer.empty()) {
      try {
        tok = data::Tokenizer::load(r.spec->data.tokenizer);
      } catch (const data::DataError& e) {
        throw InputError(fmt::format("--spec {}: data.tokenizer: {}", o.spec, e.what()));
      }
    }
  } else {
    mc = config_from_checkpoint(o.checkpoint);
    if (!quiet)
      std::cerr << "note: the model comes from the checkpoint's layout record; rope_theta 10000, "
                   "norm_eps 1e-5 and no RoPE scaling (the spec defaults) are assumed (--spec "
                   "names the training spec)\n";
  }
  if (!tok && mc.vocab < 256)
    throw InputError(fmt::format(
        "the model's vocab is {} and no tokenizer is given: byte prompts need vocab >= 256 "
        "(--spec with data.tokenizer for a SentencePiece model)",
        mc.vocab));

  // Weights: master/<param> of the checkpoint, by name.
  const contract::ParamLayout pl(mc);
  std::vector<float>& params = in.params;
  params.assign(static_cast<size_t>(pl.total()), 0.f);
  std::vector<ckpt::LoadTarget> targets;
  for (const auto& v : pl.views()) {
    ckpt::LoadTarget t{"master/" + v.name, ckpt::DType::kF32, v.shape, params.data() + v.offset};
    t.flat_name = "master";
    t.flat_offset = v.offset;
    targets.push_back(std::move(t));
  }
  try {
    ckpt::load_from_path(o.checkpoint, 0, 1, targets);
  } catch (const ckpt::CheckpointError& e) {
    throw InputError(fmt::format("--checkpoint {}: {}", o.checkpoint, e.what()));
  }

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

CacheTotals cache_totals(gen::Generator& g, gen::GenerateRing* ring) {
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
int generate_and_write(const GenerateOpts& o, Inputs& in, gen::Generator& g,
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
  }
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
    j["attention"]["host_kv"] = o.host_int8 ? "int8 (not exact)" : "fp32";
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
  if (o.out.empty()) {
    std::cout << result << std::flush;
  } else {
    const int fd =
        ::open(o.out.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0)
      throw InputError(fmt::format("-o {}: cannot create: {}", o.out, std::strerror(errno)));
    size_t off = 0;
    while (off < result.size()) {
      const ssize_t w = ::write(fd, result.data() + off, result.size() - off);
      if (w < 0) {
        if (errno == EINTR) continue;
        const std::string e = std::strerror(errno);
        ::close(fd);
        throw InputError(fmt::format("-o {}: write failed: {}", o.out, e));
      }
      off += static_cast<size_t>(w);
    }
    if (::close(fd) != 0) throw InputError(fmt::format("-o {}: close failed", o.out));
  }
  return kExitOk;
}

// This process's place among the ranks: world 1 when it runs alone.
struct Identity {
  int rank = 0, world = 1;
  std::string rendezvous;
};

int env_int(const char* name, int def) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return def;
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  if (*end != '\0' || x < 0 || x > 1 << 20)
    throw UsageError(fmt::format("environment {}='{}': expected a count", name, v));
  return static_cast<int>(x);
}

Identity identity(const GenerateOpts& o) {
  Identity id;
  if (o.rank >= 0 || o.world > 0) {
    if (o.rank < 0 || o.world < 1 || o.rank >= o.world)
      throw UsageError(fmt::format(
          "--rank {} --world {}: a rank needs both, with 0 <= --rank < --world", o.rank, o.world));
    if (o.rendezvous.empty()) throw UsageError("--rank/--world need --rendezvous DIR");
    id = {o.rank, o.world, o.rendezvous};
  } else if (const int tasks = env_int("SLURM_STEP_NUM_TASKS", 1); tasks > 1) {
    // Under srun: every task of the step is one rank.
    if (o.ranks > 1)
      throw UsageError(
          fmt::format("--ranks {} under srun with {} tasks: srun starts the ranks (drop --ranks)",
                      o.ranks, tasks));
    if (o.rendezvous.empty())
      throw UsageError(fmt::format(
          "under srun with {} tasks, --rendezvous DIR (a directory every task can reach, unique "
          "to this run) is required",
          tasks));
    const int procid = env_int("SLURM_PROCID", -1);
    if (procid < 0 || procid >= tasks)
      throw UsageError(
          fmt::format("under srun with {} tasks: SLURM_PROCID is missing or out of "
                      "range",
                      tasks));
    id = {procid, tasks, o.rendezvous};
  }
  return id;
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
  auto backend = kernels::create_backend("cpu", o.threads, &err);
  if (!backend) throw InputError("cannot create the cpu backend: " + err);
  gen::RingOptions ro;
  ro.rank = id.rank;
  ro.ranks = id.world;
  ro.rendezvous = id.rendezvous;
  ro.transport = o.transport;
  ro.bootstrap_timeout_ms = o.timeout_s * 1000;
  ro.timeout_ms = o.timeout_s * 1000;
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
  const std::string who = fmt::format("ringctl generate: rank {} of {}", id.rank, id.world);
  return cp::run_then_exit_on_error(who, kExitFailed, [&] {
    g.emplace(in.mc, in.params.data(), backend.get(), in.go);
    const int rc = generate_and_write(o, in, *g, &*ring);
    ring->shutdown();
    return rc;
  });
}

// The command line of rank r of a local launch: the flags as given, and the rank's identity.
std::vector<std::string> rank_argv(const std::string& self, const GenerateOpts& o, int r, int world,
                                   const std::string& dir) {
  std::vector<std::string> a = {self, "generate", "--checkpoint", o.checkpoint};
  auto add = [&](const std::string& flag, const std::string& v) {
    a.push_back(flag);
    a.push_back(v);
  };
  if (!o.out.empty()) add("--output", o.out);
  if (o.json) a.push_back("--json");
  add("--max-tokens", std::to_string(o.max_tokens));
  add("--temperature", fmt::format("{:.17g}", o.temperature));
  add("--top-p", fmt::format("{:.17g}", o.top_p));
  add("--seed", std::to_string(o.seed));
  if (o.has_page_tokens) add("--page-tokens", std::to_string(o.page_tokens));
  if (o.has_fast) add("--fast-bytes", o.fast_bytes);
  if (o.has_host) add("--host-bytes", o.host_bytes);
  if (o.has_disk) add("--disk-dir", o.disk_dir);
  if (o.has_window) add("--window", std::to_string(o.window));
  if (!o.spec.empty()) add("--spec", o.spec);
  // Threads: the cores shared among the ranks unless given.
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  add("--threads", std::to_string(o.threads > 0 ? o.threads : std::max(1, cores / world)));
  if (o.host_int8) a.push_back("--host-int8");
  if (o.approximate > 0) add("--approximate", fmt::format("{:.17g}", o.approximate));
  add("--split", o.split);
  add("--transport", o.transport);
  add("--timeout", std::to_string(o.timeout_s));
  add("--rank", std::to_string(r));
  add("--world", std::to_string(world));
  add("--rendezvous", dir);
  a.push_back("--");
  for (const auto& p : o.prompts) a.push_back(p);
  return a;
}

// --ranks P: starts P ranks of this command on this host and waits for them. When one fails the
// others are stopped (SIGTERM, SIGKILL 5 s later); SIGINT/SIGTERM/SIGHUP are passed on. Exits
// with the first failure's status.
int launch_ranks(const GenerateOpts& o) {
  // The inputs once here, so that a bad flag or file is reported once (the ranks load them too).
  check_split(o, load_inputs(o, true), o.ranks);
  std::string tmpl = fs::temp_directory_path().string() + "/ring-gen-rdv-XXXXXX";
  if (!::mkdtemp(tmpl.data()))
    throw InputError(fmt::format("mkdtemp {}: {}", tmpl, std::strerror(errno)));
  const std::string dir = tmpl;
  std::error_code ec;
  const std::string self = fs::read_symlink("/proc/self/exe", ec).string();
  sigset_t handled, old;
  sigemptyset(&handled);
  for (int sig : {SIGCHLD, SIGINT, SIGTERM, SIGHUP}) sigaddset(&handled, sig);
  sigprocmask(SIG_BLOCK, &handled, &old);
  std::vector<pid_t> pids(static_cast<size_t>(o.ranks), -1);
  int exit_code = 0;
  for (int r = 0; r < o.ranks && exit_code == 0; ++r) {
    proc::SpawnOptions so;
    so.argv = rank_argv(ec ? std::string("/proc/self/exe") : self, o, r, o.ranks, dir);
    so.death_signal = SIGKILL;  // no orphans, even if the launcher is SIGKILLed
    const proc::Spawned child = proc::spawn(so);
    if (!child) {
      std::cerr << fmt::format("ringctl generate: rank {}: {}\n", r, child.error);
      exit_code = kExitFailed;
    } else {
      pids[static_cast<size_t>(r)] = child.pid;
    }
  }
  using Clock = std::chrono::steady_clock;
  std::optional<Clock::time_point> kill_at;
  auto signal_all = [&](int sig) {
    for (pid_t p : pids)
      if (p > 0) ::kill(p, sig);
  };
  if (exit_code != 0) {
    signal_all(SIGKILL);
    kill_at = Clock::now();
  }
  int running = 0;
  for (pid_t p : pids) running += p > 0;
  while (running > 0) {
    timespec ts{0, 200 * 1000 * 1000};
    siginfo_t info;
    const int sig = sigtimedwait(&handled, &info, &ts);
    if (sig == SIGINT || sig == SIGTERM || sig == SIGHUP) {
      if (exit_code == 0) exit_code = 128 + sig;
      signal_all(SIGTERM);
      if (!kill_at) kill_at = Clock::now() + std::chrono::seconds(5);
    }
    for (size_t r = 0; r < pids.size(); ++r) {
      if (pids[r] <= 0) continue;
      int st = 0;
      if (::waitpid(pids[r], &st, WNOHANG) != pids[r]) continue;
      pids[r] = -1;
      --running;
      const bool ok = WIFEXITED(st) && WEXITSTATUS(st) == 0;
      if (!ok && exit_code == 0) {
        exit_code = WIFEXITED(st) ? WEXITSTATUS(st) : kExitFailed;
        std::cerr << fmt::format(
            "ringctl generate: rank {} {}{}\n", r, proc::describe_status(st),
            running > 0 ? fmt::format("; stopping the other {}", running) : std::string());
        signal_all(SIGTERM);
        kill_at = Clock::now() + std::chrono::seconds(5);
      }
    }
    if (kill_at && Clock::now() >= *kill_at && running > 0) {
      signal_all(SIGKILL);
      kill_at = Clock::now() + std::chrono::hours(1);
    }
  }
  sigprocmask(SIG_SETMASK, &old, nullptr);
  fs::remove_all(dir, ec);
  return exit_code;
}

int run_generate(const GenerateOpts& o) {
  if (o.split != "zigzag" && o.split != "contiguous")
    throw UsageError(fmt::format("--split '{}': zigzag or contiguous", o.split));
  const Identity id = identity(o);
  if (o.backend != "cpu" && (id.world > 1 || o.ranks > 1))
    throw UsageError(fmt::format(
        "--backend {}: generation over several ranks runs on the cpu backend (the device fast "
        "tier runs in one process)",
        o.backend));
  if (id.world > 1) {
    // A rank's threads: --threads, else srun's CPUs per task (-c), else every core.
    GenerateOpts ro = o;
    if (ro.threads == 0) ro.threads = env_int("SLURM_CPUS_PER_TASK", 0);
    return run_rank(ro, id);
  }
  if (o.ranks > 1) return launch_ranks(o);
  Inputs in = load_inputs(o, false);
  std::string err;
  auto backend = kernels::create_backend(o.backend, o.threads, &err);
  if (!backend)
    throw InputError(fmt::format("--backend {}: cannot create the {} backend: {}", o.backend,
                                 o.backend, err));
  gen::Generator g(in.mc, in.params.data(), backend.get(), in.go);
  return generate_and_write(o, in, g, nullptr);
}

}  // namespace

Subcommand add_generate(CLI::App& app) {
  auto* sc = app.add_subcommand(
      "generate",
      "Generate text from a checkpoint's weights over a paged KV cache in tiers (fast pool, host, "
      "disk); exact attention (docs/generation.md)");
  auto o = std::make_shared<GenerateOpts>();
  sc->add_option("--checkpoint", o->checkpoint,
                 "A checkpoint directory (its newest complete step) or one step directory")
      ->required();
  sc->add_option("prompts", o->prompts, "Prompt files, one sequence each")->required();
  sc->add_option("-o,--output", o->out, "Write the output here (0600) instead of stdout");
  sc->add_flag("--json", o->json, "One JSON object: tokens, text, per-token timing, cache stats");
  sc->add_option("--max-tokens", o->max_tokens, "Tokens to generate per prompt (default 64)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 30));
  sc->add_option("--temperature", o->temperature, "0: greedy (default); > 0: sampling")
      ->check(CLI::Range(0.0, 1e6));
  sc->add_option("--top-p", o->top_p, "Nucleus sampling mass in (0, 1] (default 1)")
      ->check(CLI::Range(1e-9, 1.0));
  sc->add_option("--seed", o->seed, "Sampling seed (default 0): same seed, same tokens");
  sc->add_option("--page-tokens", o->page_tokens, "Tokens per KV page (default 1024)")
      ->check(CLI::Range(int64_t{16}, int64_t{1} << 20));
  sc->add_option("--fast-bytes", o->fast_bytes,
                 "Fast tier size (default 256MiB; K, M, G, T suffixes; 0: none)");
  sc->add_option("--host-bytes", o->host_bytes,
                 "Host tier limit (default 0: no limit); beyond it pages go to --disk-dir");
  sc->add_option("--disk-dir", o->disk_dir,
                 "Directory for the disk tier (a private file, removed at exit)")
      ->check(CLI::ExistingDirectory);
  sc->add_option("--window", o->window,
                 "Most recent tokens always in the fast tier (default: one page; 0: none)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 40));
  sc->add_option("--spec", o->spec,
                 "The training spec: model config (and data.tokenizer) instead of the "
                 "checkpoint's layout record; its generate section sets the cache where no flag "
                 "does")
      ->check(CLI::ExistingFile);
  sc->add_option("--threads", o->threads, "CPU threads (default 0: all cores)")
      ->check(CLI::Range(0, 4096));
  sc->add_option("--backend", o->backend,
                 "Kernel backend: cpu (default) or cuda (prefill, the decode step's layers and the "
                 "fast tier's attention on the GPU, the fast tier in GPU memory; one process)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  sc->add_flag("--host-int8", o->host_int8,
              "Store full host-tier pages as int8 (K per channel, V per token): about 0.29 of "
              "the bytes, NOT exact (labelled)");
  sc->add_option("--approximate", o->approximate,
                 "APPROXIMATE attention: skip pages whose bound on softmax share is below this "
                 "threshold in (0, 1); each token's bound on the skipped mass is reported "
                 "(default 0: exact)")
      ->check(CLI::Range(0.0, 0.999999));
  sc->add_option("--ranks", o->ranks,
                 "Generate over P local ranks: ring-attention prefill, the cache sharded over "
                 "the ranks, only (o, lse) partials exchanged per layer and token (default 1)")
      ->check(CLI::Range(1, 4096));
  sc->add_option("--split", o->split,
                 "How a prompt is cut over the ranks: zigzag (default) or contiguous");
  sc->add_option("--rank", o->rank, "This process is rank R of --world (set by --ranks)")
      ->check(CLI::Range(0, 1 << 20));
  sc->add_option("--world", o->world, "Ranks of a sharded generation (set by --ranks)")
      ->check(CLI::Range(1, 1 << 20));
  sc->add_option("--rendezvous", o->rendezvous,
                 "A directory every rank reaches, unique to the run (with --rank, or under srun)");
  sc->add_option("--transport", o->transport, "The ranks' transport plugin (default ucx)");
  sc->add_option("--timeout", o->timeout_s,
                 "Seconds a rank waits for the others at start and in each exchange (default 600)")
      ->check(CLI::Range(1, 86400));
  return {sc, [o, sc]() {
            o->has_page_tokens = sc->count("--page-tokens") > 0;
            o->has_fast = sc->count("--fast-bytes") > 0;
            o->has_host = sc->count("--host-bytes") > 0;
            o->has_disk = sc->count("--disk-dir") > 0;
            o->has_window = sc->count("--window") > 0;
            try {
              return run_generate(*o);
            } catch (const UsageError& e) {
              std::cerr << "ringctl generate: " << e.what() << "\n";
              return kExitUsage;
            } catch (const InputError& e) {
              std::cerr << "ringctl generate: " << e.what() << "\n";
              return kExitFailed;
            } catch (const gen::GenerateError& e) {
              std::cerr << "ringctl generate: " << as_flags(e.what()) << "\n";
              return kExitFailed;
            } catch (const contract::ModelError& e) {
              std::cerr << "ringctl generate: " << e.what() << "\n";
              return kExitFailed;
            }
          }};
}

}  // namespace ring::cli
