#include "worker/flags.h"

#include <CLI/CLI.hpp>

#include "common/cli/cli11_flags.h"
#include "common/log/log_flags.h"
#include "common/version.h"

namespace ring::worker {
namespace {

const char* kDescription =
    "ring-worker: trains the model of a job spec.\n"
    "  single process (default): the whole sequence on this process, AdamW in it\n"
    "  ring: --launch-local starts P = parallel.context_ranks x data_replicas ranks here\n"
    "        (fresh rendezvous dir) and waits for them; --rank R --world P --rendezvous DIR\n"
    "        runs one rank (ringd starts ranks that way, with --ringd and --local-rank)";

const char* kCommon = "Every mode";
const char* kSingleGroup = "Single process (without --rank or --launch-local)";
const char* kRingGroup = "Ring (--launch-local, or one rank: --rank R --world P --rendezvous DIR)";

}  // namespace

Flags parse_flags(int argc, char** argv) {
  Flags a;
  CLI::App app{kDescription, "ring-worker"};
  app.set_version_flag("--version", std::string("ring-worker ") + kVersion);
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  using flags::add_custom;
  using flags::add_integer;

  // Every mode.
  app.add_option("--spec", a.spec, "Job spec (YAML); validated, diagnostics printed (required)")
      ->type_name("FILE")
      ->group(kCommon);
  add_integer(app, "--steps", &a.steps, 1, int64_t{1} << 40,
              "Optimizer steps (default: train.steps)")
      ->group(kCommon);
  add_integer(app, "--threads", &a.threads, 0, 4096,
              "CPU threads (per rank) (default: resources.cpus_per_worker, 0 = all cores)")
      ->group(kCommon);
  add_custom(
      app, "--backend", [&](const std::string&, const std::string& v) { a.backend = v; },
      "Kernel backend (default: resources.backend)")
      ->type_name("NAME")
      ->group(kCommon);
  app.add_option("--log-json", a.log_json,
                 "Append one JSON object per logged step (and evaluation); rank 0 in the ring")
      ->type_name("FILE")
      ->group(kCommon);
  add_integer(app, "--max-corpus-mb", &a.max_corpus_mb, 1, 1 << 20,
              "Cap on the text corpus read into memory (default 256)")
      ->type_name("M")
      ->group(kCommon);
  log::add_log_flags(app, &a.log_format, &a.log_level, kCommon);

  // Single process.
  std::vector<CLI::Option*> single;
  auto in_single = [&](CLI::Option* o) { single.push_back(o->group(kSingleGroup)); };
  in_single(app.add_flag("--single-rank", a.single_rank,
                         "Run a spec with parallel.context_ranks > 1 or data_replicas > 1 "
                         "as ONE rank holding the whole sequence (required for such specs)"));
  in_single(add_custom(
                app, "--passkey-labels",
                [&](const std::string& flag, const std::string& v) {
                  if (v == "all") {
                    a.passkey_labels = data::PasskeyLabels::kAll;
                  } else if (v == "answer") {
                    a.passkey_labels = data::PasskeyLabels::kAnswer;
                  } else {
                    throw flags::FlagError(flag + ": expected all or answer, got '" + v + "'");
                  }
                },
                "Passkey source: all (language modelling on the whole sample, default) or "
                "answer (loss on the answer digits only)")
                ->type_name("all|answer"));
  in_single(add_integer(app, "--eval-every", &a.eval_every, 0, int64_t{1} << 40,
                        "Passkey source: evaluate retrieval every K steps (default: at "
                        "end)")
                ->type_name("K"));
  in_single(add_integer(app, "--eval-samples", &a.eval_samples, 1, 1 << 20,
                        "Passkey source: held-out samples per evaluation (default 32)"));
  in_single(app.add_option("--save-weights", a.save_weights,
                           "After the last step, write the trained weights as a checkpoint in "
                           "DIR (master/<param> tensors and the layout record, step = steps; "
                           "for ringctl generate / export, or model.init_from)")
                ->type_name("DIR"));
  in_single(add_integer(app, "--seqs-per-step", &a.seqs_per_step, 1, 1 << 20,
                        "Sequences per optimizer step, gradients accumulated (default 1)"));
  in_single(add_custom(
                app, "--passkey-curriculum",
                [&](const std::string& flag, const std::string& v) {
                  try {
                    a.curriculum = train::parse_passkey_curriculum(v);
                  } catch (const std::invalid_argument& e) {
                    throw flags::FlagError(flag + ": " + e.what());
                  }
                },
                "Passkey source: a length curriculum. Each stage in turn trains STEPS steps on "
                "LEN-token samples, SEQS per step (default --seqs-per-step); then data.seq_len "
                "for the remaining steps. Evaluation is always at data.seq_len.")
                ->type_name("LEN:STEPS[:SEQS][,...]"));

  // Ring.
  std::vector<CLI::Option*> ring;
  auto in_ring = [&](CLI::Option* o) { ring.push_back(o->group(kRingGroup)); };
  in_ring(app.add_flag("--launch-local", a.launch_local,
                       "Start the P ranks here (fresh rendezvous dir), wait for them"));
  CLI::Option* rank = add_integer(app, "--rank", &a.rank, 0, 65535, "Run rank R of P");
  in_ring(rank->type_name("R"));
  in_ring(add_integer(app, "--world", &a.world, 1, 65536,
                      "P: the number of ranks (must equal parallel.context_ranks x data_replicas)")
              ->type_name("P"));
  in_ring(app.add_option("--rendezvous", a.rendezvous,
                         "Directory unique to this ring attempt (file rendezvous)")
              ->type_name("DIR"));
  in_ring(app.add_option("--transport", a.transport, "Transport plugin (default ucx)")
              ->type_name("NAME"));
  in_ring(
      add_integer(app, "--stagger-us", &a.stagger_us, 0, 1000000, "Override parallel.stagger_us")
          ->type_name("US"));
  in_ring(add_integer(app, "--timeout-ms", &a.timeout_ms, 100, 3600000,
                      "Bound on every transfer and collective (default 60000)")
              ->type_name("MS"));
  in_ring(app.add_option("--ringd", a.ringd,
                         "Run under ringd: weights and optimizer live there; gradients go "
                         "to its shared memory bucket by bucket (spawned by ringd only)")
              ->type_name("SOCKET"));
  in_ring(add_integer(app, "--local-rank", &a.local_rank, 0, 65535,
                      "This rank's slot on its node (with --ringd)")
              ->type_name("L"));
  in_ring(app.add_option("--timeline", a.timeline,
                         "With --ringd or --generate: the phase timeline file ringd created for "
                         "this rank (spawned by ringd only)")
              ->type_name("FILE"));

  // Generation.
  const char* kGenGroup = "Generation (--generate)";
  app.add_flag("--generate", a.generate,
               "Generate text as the spec's generate section says (job.kind generate): rank 0 "
               "writes generate.output")
      ->group(kGenGroup);
  app.add_option("--output", a.output,
                 "With --generate: the output file (replaces "
                 "generate.output)")
      ->type_name("FILE")
      ->group(kGenGroup);

  flags::parse_or_exit(app, argc, argv);

  if (a.generate) {
    // Generation takes the ring's rank flags and nothing of training's.
    for (const CLI::Option* o : single)
      if (o->count() > 0) flags::usage_error(app, o->get_name() + " is not a flag of --generate");
    for (const char* f : {"--launch-local", "--ringd", "--local-rank", "--stagger-us", "--steps",
                          "--log-json"})
      if (app.count(f) > 0)
        flags::usage_error(app, std::string(f) + " is not a flag of --generate");
    if (a.spec.empty()) flags::usage_error(app, "--spec FILE is required");
    if (rank->count() > 0 && (a.world < 1 || a.rendezvous.empty()))
      flags::usage_error(app, "--generate --rank R needs --world P and --rendezvous DIR");
    if (rank->count() > 0 && a.rank >= a.world)
      flags::usage_error(app, "--rank " + std::to_string(a.rank) + " is not below --world " +
                                  std::to_string(a.world));
    if (rank->count() == 0 && (a.world > 1 || !a.rendezvous.empty()))
      flags::usage_error(app, "--world/--rendezvous need --rank R");
    a.mode = Mode::kGenerate;
    return a;
  }
  if (!a.output.empty()) flags::usage_error(app, "--output is a flag of --generate");

  a.mode = a.launch_local ? Mode::kLaunchLocal : rank->count() > 0 ? Mode::kRank : Mode::kSingle;
  const bool ring_mode = a.mode != Mode::kSingle;
  for (const CLI::Option* o : ring_mode ? single : ring) {
    if (o->count() == 0) continue;
    flags::usage_error(app, ring_mode ? o->get_name() +
                                            " is not a flag of the ring mode (--rank or "
                                            "--launch-local)"
                                      : o->get_name() +
                                            " is a flag of the ring mode: add "
                                            "--launch-local, or --rank R --world P "
                                            "--rendezvous DIR");
  }
  if (a.spec.empty()) flags::usage_error(app, "--spec FILE is required");
  if (!ring_mode) return a;
  if (a.launch_local && (a.rank >= 0 || !a.rendezvous.empty()))
    flags::usage_error(
        app, "--launch-local chooses ranks and the rendezvous itself: drop --rank/--rendezvous");
  if (!a.launch_local && (a.rank < 0 || a.world < 1 || a.rendezvous.empty()))
    flags::usage_error(
        app, "a rank needs --rank R, --world P and --rendezvous DIR (or use --launch-local)");
  if (!a.ringd.empty() && (a.launch_local || a.local_rank < 0))
    flags::usage_error(app,
                       "--ringd needs --local-rank L and a rank's flags (ringd spawns such ranks)");
  if (!a.timeline.empty() && a.ringd.empty())
    flags::usage_error(app, "--timeline needs --ringd (ringd creates the file)");
  if (!a.launch_local && a.rank >= a.world)
    flags::usage_error(app, "--rank " + std::to_string(a.rank) + " is not below --world " +
                                std::to_string(a.world));
  return a;
}

std::optional<spec::JobSpec> load_spec(const std::string& path) {
  auto lg = log::get("ring-worker");
  spec::LoadResult loaded = spec::load_spec_file(path);
  for (const auto& d : loaded.diagnostics) {
    const bool error = d.severity == spec::Diagnostic::Severity::kError;
    lg->log(error ? spdlog::level::err : spdlog::level::warn, "{}", d.str());
  }
  if (!loaded.ok()) {
    lg->error("{}: invalid spec ({} error(s))", path, loaded.error_count());
    return std::nullopt;
  }
  return *loaded.spec;
}

}  // namespace ring::worker
