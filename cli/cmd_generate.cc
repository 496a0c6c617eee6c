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
// The loading, generating and writing is worker/generate/generate_run.h (also what a generate
// job's `ring-worker --generate` runs); this file is the command line and the local launcher.
//
// Over P ranks (docs/generation.md, "Generation over several ranks"): --ranks P starts P local
// processes of this command (a fresh rendezvous directory; each rank dies with the launcher, and
// when one fails the others are stopped), each with --rank R --world P --rendezvous DIR; under
// srun (SLURM_PROCID, SLURM_STEP_NUM_TASKS > 1; the launcher and the rank's identity are
// cli/rank_launch.h, shared with `ringctl eval`) every task is one rank and --rendezvous names a
// directory all tasks reach. The prompts are prefilled with ring attention across the ranks, the
// cache stays sharded, each decode step exchanges only the partial (o, lse) of every layer, and
// rank 0's sampled tokens are every rank's; rank 0 writes the output.
#include <algorithm>
#include <iostream>
#include <memory>
#include <optional>
#include <thread>

#include <fmt/format.h>

#include "cli/commands.h"
#include "cli/ctl_common.h"
#include "cli/rank_launch.h"
#include "worker/generate/generate_run.h"

namespace ring::cli {
namespace {

using gen::GenerateOpts;
using gen::Identity;
using gen::InputError;
using gen::Inputs;
using gen::UsageError;

Identity identity(const GenerateOpts& o) {
  return rank_identity(RankFlags{o.ranks, o.rank, o.world, o.rendezvous});
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
  add("--backend", o.backend);
  // Threads: the cores shared among the ranks unless given.
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  add("--threads", std::to_string(o.threads > 0 ? o.threads : std::max(1, cores / world)));
  if (o.host_int8) a.push_back("--host-int8");
  if (!o.dtype.empty()) add("--dtype", o.dtype);
  if (o.approximate > 0) add("--approximate", fmt::format("{:.17g}", o.approximate));
  add("--split", o.split);
  if (o.head_ranks > 1) add("--head-ranks", std::to_string(o.head_ranks));
  add("--transport", o.transport);
  add("--timeout", std::to_string(o.timeout_s));
  add("--rank", std::to_string(r));
  add("--world", std::to_string(world));
  add("--rendezvous", dir);
  a.push_back("--");
  for (const auto& p : o.prompts) a.push_back(p);
  return a;
}

// --ranks P: starts P ranks of this command on this host and waits for them (cli/rank_launch.h).
int launch_ranks(const GenerateOpts& o) {
  // The inputs once here, so that a bad flag or file is reported once (the ranks load them too).
  gen::check_split(o, gen::load_inputs(o, true), o.ranks);
  return launch_local_ranks("generate", "gen", o.ranks,
                            [&o](const std::string& self, int r, const std::string& dir) {
                              return rank_argv(self, o, r, o.ranks, dir);
                            });
}

int run_generate(const GenerateOpts& o) {
  if (o.split != "zigzag" && o.split != "contiguous")
    throw UsageError(fmt::format("--split '{}': zigzag or contiguous", o.split));
  const int world = o.world > 0 ? o.world : o.ranks;
  if (o.head_ranks > 1 && world % o.head_ranks != 0)
    throw UsageError(fmt::format("--head-ranks {} must divide the {} ranks (--ranks)",
                                 o.head_ranks, world));
  const Identity id = identity(o);
  if (id.world > 1) {
    // A rank's threads: --threads, else srun's CPUs per task (-c), else every core.
    GenerateOpts ro = o;
    if (ro.threads == 0) ro.threads = env_int("SLURM_CPUS_PER_TASK", 0);
    return gen::run_rank(ro, id);
  }
  if (o.ranks > 1) return launch_ranks(o);
  return gen::run_alone(o);
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
                 "Fast tier size (default 256MiB; K, M, G, T suffixes); it holds the --window, "
                 "so 0 only with --window 0");
  sc->add_option("--host-bytes", o->host_bytes,
                 "Host tier limit (default 0: no limit); beyond it pages go to --disk-dir");
  sc->add_option("--disk-dir", o->disk_dir,
                 "Directory for the disk tier (a private file, removed at exit)")
      ->check(CLI::ExistingDirectory);
  sc->add_option("--window", o->window,
                 "Most recent tokens always in the fast tier (default: one page; 0: none)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 40));
  sc->add_option("--spec", o->spec,
                 "The training spec: data.tokenizer, and its generate section sets the cache where "
                 "no flag does; the model is the checkpoint's (its shape must match the spec's; "
                 "the spec's settings are used only for a checkpoint that does not record them)")
      ->check(CLI::ExistingFile);
  sc->add_option("--threads", o->threads, "CPU threads (default 0: all cores)")
      ->check(CLI::Range(0, 4096));
  sc->add_option("--backend", o->backend,
                 "Kernel backend: cpu (default) or cuda (the fast tier in GPU memory, its "
                 "attention and the decode step's layers on the GPU; the prefill too in one "
                 "process, on the cpu backend over several ranks)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  sc->add_option("--dtype", o->dtype,
                 "Compute in fp32 or bf16 (bf16: the model's bf16 forward and bf16 KV pages, half "
                 "the cache bytes). Default: the model's dtype as the checkpoint records it (the "
                 "spec's model.dtype where it records none; else fp32)");
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
  sc->add_option("--head-ranks", o->head_ranks,
                 "Two-level prefill: groups of U ranks split the heads by an all-to-all and the "
                 "ring runs over the groups (parallel.head_ranks; U divides --ranks and the "
                 "heads; default 1: one ring)")
      ->check(CLI::Range(1, 4096));
  add_rank_placement_flags(sc, "a sharded generation", {&o->rank, &o->world, &o->rendezvous, &o->transport,
                                      &o->timeout_s});
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
              std::cerr << "ringctl generate: " << gen::as_flags(e.what()) << "\n";
              return kExitFailed;
            } catch (const contract::ModelError& e) {
              std::cerr << "ringctl generate: " << e.what() << "\n";
              return kExitFailed;
            }
          }};
}

}  // namespace ring::cli
