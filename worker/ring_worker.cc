// ring-worker: trains a model from a job spec on this process alone (one rank, in-process AdamW).
//
//   ring-worker --spec configs/examples/tiny.yaml --single-rank --steps 100 --log-json run.jsonl
//
// The same binary is also a rank of a ring driven by ringd (--rank/--world/--rendezvous, the
// optimizer in ringd) and the local launcher (--launch-local): worker/README.md.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/contract/timeline.h"
#include "common/log/log.h"
#include "common/spec/parse.h"
#include "kernels/backend.h"
#include "worker/data/errors.h"
#include "worker/data/loader.h"
#include "worker/data/passkey.h"
#include "worker/flags.h"
#include "worker/generate/generate_run.h"
#include "worker/model/attention.h"
#include "worker/ring/ring_main.h"
#include "worker/train/passkey_curriculum.h"
#include "worker/train/passkey_eval.h"
#include "worker/train/trainer.h"

namespace {

constexpr int kExitUsage = 2;
constexpr int kExitRuntime = 1;

using Args = ring::worker::Flags;

int run(const Args& args) {
  auto lg = ring::log::get("ring-worker");
  std::optional<ring::spec::JobSpec> loaded = ring::worker::load_spec(args.spec);
  if (!loaded) return kExitUsage;
  ring::spec::JobSpec spec = *loaded;
  const int64_t ranks = spec.parallel.context_ranks * spec.parallel.data_replicas;
  if (ranks > 1 && !args.single_rank) {
    lg->error("the spec asks for parallel.context_ranks = {} and data_replicas = {}; this mode "
              "trains one rank only. Run the ranks with --launch-local (or under ringd), or pass "
              "--single-rank to train the whole sequence on this one process.",
              spec.parallel.context_ranks, spec.parallel.data_replicas);
    return kExitUsage;
  }
  if (ranks > 1) {
    lg->info("note: --single-rank: context_ranks and data_replicas overridden to 1; the whole "
             "{}-token sequence runs on this process",
             spec.data.seq_len);
    spec.parallel.context_ranks = spec.parallel.data_replicas = 1;
  }
  if (spec.optimizer.offload == ring::spec::Offload::kCpu ||
      spec.optimizer.compression != ring::spec::Compression::kNone) {
    lg->info("note: standalone: AdamW runs in this process (optimizer.offload and "
             "optimizer.compression apply under ringd)");
  }
  const int64_t steps = args.steps.value_or(spec.train.steps);
  if (!args.curriculum.empty() && spec.data.source != ring::spec::DataSource::kPasskey) {
    lg->error("--passkey-curriculum needs data.source: passkey");
    return kExitUsage;
  }
  const int threads =
      args.threads.value_or(static_cast<int>(spec.resources.cpus_per_worker));
  const std::string backend_name =
      args.backend.value_or(ring::spec::to_string(spec.resources.backend));
  std::string err;
  auto backend = ring::kernels::create_backend(backend_name, threads, &err);
  if (!backend) {
    lg->error("backend '{}': {}", backend_name, err);
    return kExitUsage;
  }

  ring::data::CorpusOptions corpus;
  corpus.max_total_bytes = args.max_corpus_mb << 20;
  corpus.encode_threads = threads;
  std::unique_ptr<ring::data::SequenceSource> source =
      ring::data::make_source(spec.data, args.passkey_labels, corpus);
  ring::data::check_vocab(*source, spec.model.vocab);

  ring::model::LocalAttention attention(backend.get());
  ring::train::Trainer trainer(spec, backend.get(), &attention, steps);
  const auto& cfg = trainer.model().config();
  std::printf("ring-worker: %s | %s backend, %d threads | %lld layers, d_model %lld, heads %lld/%lld,"
              " %s, %lld parameters | seq_len %lld, %s data | %lld steps\n",
              spec.job.name.c_str(), backend->name(), threads, static_cast<long long>(cfg.layers),
              static_cast<long long>(cfg.d_model), static_cast<long long>(cfg.heads),
              static_cast<long long>(cfg.kv_heads), ring::spec::to_string(cfg.mlp),
              static_cast<long long>(trainer.model().layout().num_params()),
              static_cast<long long>(spec.data.seq_len), ring::spec::to_string(spec.data.source),
              static_cast<long long>(steps));
  std::fflush(stdout);

  std::ofstream log_json;
  if (!args.log_json.empty()) {
    log_json.open(args.log_json, std::ios::app);
    if (!log_json) {
      lg->error("--log-json: cannot open {}", args.log_json);
      return kExitUsage;
    }
  }
  const bool passkey = spec.data.source == ring::spec::DataSource::kPasskey;
  ring::data::PasskeyOptions eval_opts{spec.data.seq_len, spec.data.passkey_digits,
                                       spec.data.seed + 1000003, ring::data::PasskeyLabels::kAll};
  auto evaluate = [&](int64_t step) {
    ring::train::PasskeyAccuracy a =
        ring::train::evaluate_passkey(trainer.model(), eval_opts, args.eval_samples);
    std::printf("eval step %lld | passkey digit accuracy %.3f | key accuracy %.3f | answer loss "
                "%.4f | %lld held-out samples\n",
                static_cast<long long>(step), a.digit_accuracy, a.key_accuracy, a.answer_loss,
                static_cast<long long>(a.samples));
    std::fflush(stdout);
    if (log_json.is_open()) {
      log_json << nlohmann::json{{"eval_step", step},
                                 {"digit_accuracy", a.digit_accuracy},
                                 {"key_accuracy", a.key_accuracy},
                                 {"answer_loss", a.answer_loss},
                                 {"samples", a.samples}}
                      .dump()
               << std::endl;
    }
  };

  // Passkey: the samples of each step, through the length curriculum when there is one (without
  // stages, the stream of the passkey source). Text: --seqs-per-step sequences of the loader.
  std::optional<ring::train::PasskeyCurriculum> curriculum;
  if (passkey) {
    curriculum.emplace(ring::data::PasskeyOptions{spec.data.seq_len, spec.data.passkey_digits,
                                                  spec.data.seed, args.passkey_labels},
                       args.seqs_per_step, args.curriculum);
  }
  std::vector<ring::data::Sequence> seqs;
  double window_loss = 0, window_ms = 0;
  int64_t window_steps = 0, window_tokens = 0;
  for (int64_t s = 1; s <= steps; ++s) {
    if (curriculum) {
      if (!args.curriculum.empty() && curriculum->starts_stage(s)) {
        const ring::train::PasskeyStage st = curriculum->stage(s);
        std::printf("curriculum: from step %lld, seq_len %lld, %lld sample(s) per step\n",
                    static_cast<long long>(s), static_cast<long long>(st.seq_len),
                    static_cast<long long>(st.seqs));
        std::fflush(stdout);
      }
      seqs = curriculum->next_step(s);
    } else {
      seqs.resize(static_cast<size_t>(args.seqs_per_step));
      for (ring::data::Sequence& seq : seqs) seq = source->next_sequence();
    }
    ring::train::StepStats st = trainer.train_step(seqs);
    window_loss += st.loss;
    window_ms += st.step_ms;
    window_tokens += st.tokens;
    ++window_steps;
    if (s % spec.train.log_every == 0 || s == steps) {
      // Logged loss and throughput are means over the steps since the last log line.
      st.loss = window_loss / window_steps;
      st.step_ms = window_ms / window_steps;
      st.tokens_per_s = window_tokens * 1000.0 / window_ms;
      std::printf("%s\n", ring::train::format_step(st).c_str());
      std::fflush(stdout);
      if (log_json.is_open()) log_json << ring::train::step_json(st) << std::endl;
      window_loss = window_ms = 0;
      window_steps = window_tokens = 0;
    }
    if (passkey && args.eval_every > 0 && s % args.eval_every == 0 && s != steps) evaluate(s);
  }
  if (passkey) evaluate(steps);
  if (!args.save_weights.empty()) {
    const std::string path = trainer.save_weights(args.save_weights, {{"spec", args.spec}});
    std::printf("weights: %s\n", path.c_str());
    std::fflush(stdout);
  }
  return 0;
}

// --generate: the spec's generate section (job.kind generate), in this process alone or as one
// rank of a sharded generation; the generation itself is worker/generate/generate_run.h, the
// code `ringctl generate` runs. Progress lines ("generate: ...") go to stdout on rank 0: under
// ringd that is the worker's log, which ringd follows.
int run_generate(const Args& args) {
  auto lg = ring::log::get("ring-worker");
  std::optional<ring::spec::JobSpec> loaded = ring::worker::load_spec(args.spec);
  if (!loaded) return kExitUsage;
  const ring::spec::JobSpec& s = *loaded;
  if (s.job.kind != ring::spec::JobKind::kGenerate) {
    lg->error(
        "--generate: {} is a training spec (job.kind train); set job.kind: generate and "
        "the generate section",
        args.spec);
    return kExitUsage;
  }
  namespace gen = ring::gen;
  gen::GenerateOpts o;
  o.program = "ring-worker --generate";
  o.checkpoint = s.generate.checkpoint;
  o.prompts = s.generate.prompts;
  o.out = args.output.empty() ? s.generate.output : args.output;
  o.json = s.generate.json;
  o.max_tokens = s.generate.max_new_tokens;
  o.temperature = s.generate.temperature;
  o.top_p = s.generate.top_p;
  o.seed = static_cast<uint64_t>(s.generate.seed);
  o.spec = args.spec;  // the model, data.tokenizer and the cache keys of the generate section
  o.threads = args.threads.value_or(static_cast<int>(s.resources.cpus_per_worker));
  // resources.backend cuda: the fast tier in GPU memory (ringd gives each rank its GPU).
  o.backend = args.backend.value_or(ring::spec::to_string(s.resources.backend));
  o.split = ring::spec::to_string(s.parallel.causal_balance);
  o.head_ranks = static_cast<int>(s.parallel.head_ranks);
  o.transport = args.transport;
  o.timeout_s = std::max(1, args.timeout_ms / 1000);
  o.progress = [](const std::string& line) {
    std::printf("generate: %s\n", line.c_str());
    std::fflush(stdout);
  };
  const int world = args.rank >= 0 ? args.world : 1;
  // Under ringd: the flight recorder ringd reads to find a hung rank (its prefill layers, decode
  // steps and waits on the other ranks; generate_run.h).
  ring::contract::timeline::TimelineWriter timeline;
  if (!args.timeline.empty()) {
    const std::string e = timeline.open(args.timeline, std::max(0, args.rank), ::getpid());
    if (e.empty()) {
      ring::contract::timeline::set_active(&timeline);
    } else {
      lg->warn("no timeline (ringd cannot tell a hung rank from a slow one): {}", e);
    }
  }
  struct Unset {
    ~Unset() { ring::contract::timeline::set_active(nullptr); }
  } unset;
  std::printf(
      "ring-worker --generate: %s | rank %d of %d | %zu prompt(s), %lld new tokens, "
      "temperature %g, top_p %g, seed %lld | checkpoint %s | output %s\n",
      s.job.name.c_str(), std::max(0, args.rank), world, o.prompts.size(),
      static_cast<long long>(o.max_tokens), o.temperature, o.top_p, static_cast<long long>(o.seed),
      o.checkpoint.c_str(), o.out.empty() ? "stdout" : o.out.c_str());
  std::fflush(stdout);
  try {
    const int rc =
        world > 1 ? gen::run_rank(o, {args.rank, world, args.rendezvous}) : gen::run_alone(o);
    if (rc == 0 && (args.rank <= 0)) {
      std::printf("generate: done\n");
      std::fflush(stdout);
    }
    return rc;
  } catch (const gen::UsageError& e) {
    lg->error("{}", e.what());
    return kExitUsage;
  } catch (const gen::InputError& e) {
    lg->error("{}", e.what());
  } catch (const gen::GenerateError& e) {
    lg->error("{}", gen::as_flags(e.what()));
  } catch (const ring::contract::ModelError& e) {
    lg->error("{}", e.what());
  }
  return kExitRuntime;
}

}  // namespace

int main(int argc, char** argv) {
  const Args args = ring::worker::parse_flags(argc, argv);
  ring::log::setup("ring-worker", args.log_format, args.log_level);
  auto lg = ring::log::get("ring-worker");
  if (args.mode == ring::worker::Mode::kGenerate) {
    try {
      return run_generate(args);
    } catch (const std::exception& e) {
      lg->error("{}", e.what());
      return kExitRuntime;
    }
  }
  // --rank / --launch-local: a rank of a context-parallel ring (worker/ring/ring_main.h).
  if (args.mode != ring::worker::Mode::kSingle) return ring::cp::ring_main(args, argc, argv);
  try {
    return run(args);
  } catch (const ring::data::DataError& e) {
    lg->error("data: {}", e.what());
  } catch (const ring::model::ModelError& e) {
    lg->error("model: {}", e.what());
  } catch (const std::exception& e) {
    lg->error("{}", e.what());
  }
  return kExitRuntime;
}
