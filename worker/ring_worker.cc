// ring-worker: trains a model from a job spec on this process alone (one rank, in-process AdamW).
//
//   ring-worker --spec configs/examples/tiny.yaml --single-rank --steps 100 --log-json run.jsonl
//
// The daemon-driven mode (a rank of a ring, optimizer in ringd) comes with issues 4 and 5; this
// binary already runs the same model, data and training step on one rank.
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

#include "common/cli/flags.h"
#include "common/spec/parse.h"
#include "kernels/backend.h"
#include "worker/data/errors.h"
#include "worker/data/loader.h"
#include "worker/data/passkey.h"
#include "worker/model/attention.h"
#include "worker/ring/ring_main.h"
#include "worker/train/passkey_curriculum.h"
#include "worker/train/passkey_eval.h"
#include "worker/train/trainer.h"

namespace {

constexpr int kExitUsage = 2;
constexpr int kExitRuntime = 1;

const char* kUsage =
    "usage: ring-worker --spec FILE [options]\n"
    "Trains the spec's model alone on this process (one rank, in-process AdamW).\n"
    "  --spec FILE           job spec (YAML); validated, diagnostics printed\n"
    "  --steps N             optimizer steps (default: train.steps)\n"
    "  --threads T           CPU threads (default: resources.cpus_per_worker, 0 = all cores)\n"
    "  --backend NAME        kernel backend (default: resources.backend)\n"
    "  --log-json FILE       append one JSON object per logged step (and per evaluation)\n"
    "  --single-rank         run a spec with parallel.context_ranks > 1 or data_replicas > 1\n"
    "                        as ONE rank holding the whole sequence (required for such specs)\n"
    "  --max-corpus-mb M     cap on the text corpus read into memory (default 256)\n"
    "  --passkey-labels L    passkey source: all (language modelling on the whole sample,\n"
    "                        default) or answer (loss on the answer digits only)\n"
    "  --eval-every K        passkey source: evaluate retrieval every K steps (default: at end)\n"
    "  --eval-samples N      passkey source: held-out samples per evaluation (default 32)\n"
    "  --seqs-per-step N     sequences per optimizer step, gradients accumulated (default 1)\n"
    "  --passkey-curriculum LEN:STEPS[:SEQS][,LEN:STEPS[:SEQS]...]\n"
    "                        passkey source: a length curriculum. Each stage in turn trains\n"
    "                        STEPS steps on LEN-token samples, SEQS per step (default\n"
    "                        --seqs-per-step); then data.seq_len for the remaining steps.\n"
    "                        Evaluation is always at data.seq_len.\n"
    "  --help\n";

struct Args {
  std::string spec;
  std::optional<int64_t> steps;
  std::optional<int> threads;
  std::optional<std::string> backend;
  std::string log_json;
  bool single_rank = false;
  int64_t max_corpus_mb = 256;
  ring::data::PasskeyLabels passkey_labels = ring::data::PasskeyLabels::kAll;
  int64_t eval_every = 0;
  int64_t eval_samples = 32;
  int64_t seqs_per_step = 1;
  std::vector<ring::train::PasskeyStage> curriculum;
};

[[noreturn]] void usage_error(const std::string& msg) {
  ring::flags::usage_exit("ring-worker", msg, kUsage, kExitUsage);
}

Args parse_args(int argc, char** argv) try {
  Args a;
  ring::flags::FlagSet fs(kUsage);
  fs.text("--spec", &a.spec)
      .integer("--steps", &a.steps, 1, int64_t{1} << 40)
      .integer("--threads", &a.threads, 0, 4096)
      .text("--backend", &a.backend)
      .text("--log-json", &a.log_json)
      .toggle("--single-rank", &a.single_rank)
      .integer("--max-corpus-mb", &a.max_corpus_mb, 1, 1 << 20)
      .custom("--passkey-labels",
              [&](const std::string& flag, const char* v) {
                if (std::strcmp(v, "all") == 0) {
                  a.passkey_labels = ring::data::PasskeyLabels::kAll;
                } else if (std::strcmp(v, "answer") == 0) {
                  a.passkey_labels = ring::data::PasskeyLabels::kAnswer;
                } else {
                  throw ring::flags::FlagError(flag + ": expected all or answer, got '" + v + "'");
                }
              })
      .integer("--eval-every", &a.eval_every, 0, int64_t{1} << 40)
      .integer("--eval-samples", &a.eval_samples, 1, 1 << 20)
      .integer("--seqs-per-step", &a.seqs_per_step, 1, 1 << 20)
      .custom("--passkey-curriculum", [&](const std::string& flag, const char* v) {
        try {
          a.curriculum = ring::train::parse_passkey_curriculum(v);
        } catch (const std::invalid_argument& e) {
          throw ring::flags::FlagError(flag + ": " + e.what());
        }
      });
  fs.parse(argc, argv);
  if (a.spec.empty()) usage_error("--spec FILE is required");
  return a;
} catch (const ring::flags::FlagError& e) {
  usage_error(e.what());
}

int run(const Args& args) {
  ring::spec::LoadResult loaded = ring::spec::load_spec_file(args.spec);
  for (const auto& d : loaded.diagnostics) std::cerr << d.str() << "\n";
  if (!loaded.ok()) {
    std::cerr << "ring-worker: " << args.spec << ": invalid spec (" << loaded.error_count()
              << " error(s))\n";
    return kExitUsage;
  }
  ring::spec::JobSpec spec = *loaded.spec;
  const int64_t ranks = spec.parallel.context_ranks * spec.parallel.data_replicas;
  if (ranks > 1 && !args.single_rank) {
    std::cerr << "ring-worker: the spec asks for parallel.context_ranks = "
              << spec.parallel.context_ranks << " and data_replicas = "
              << spec.parallel.data_replicas
              << "; alone, ring-worker trains one rank only. Pass --single-rank to train the "
                 "whole sequence on this one process.\n";
    return kExitUsage;
  }
  if (ranks > 1) {
    std::cerr << "ring-worker: note: --single-rank: context_ranks and data_replicas overridden "
                 "to 1; the whole "
              << spec.data.seq_len << "-token sequence runs on this process\n";
    spec.parallel.context_ranks = spec.parallel.data_replicas = 1;
  }
  if (spec.optimizer.offload == ring::spec::Offload::kCpu ||
      spec.optimizer.compression != ring::spec::Compression::kNone) {
    std::cerr << "ring-worker: note: standalone: AdamW runs in this process (optimizer.offload and "
                 "optimizer.compression apply under ringd)\n";
  }
  const int64_t steps = args.steps.value_or(spec.train.steps);
  if (!args.curriculum.empty() && spec.data.source != ring::spec::DataSource::kPasskey) {
    std::cerr << "ring-worker: --passkey-curriculum needs data.source: passkey\n";
    return kExitUsage;
  }
  const int threads =
      args.threads.value_or(static_cast<int>(spec.resources.cpus_per_worker));
  const std::string backend_name =
      args.backend.value_or(ring::spec::to_string(spec.resources.backend));
  std::string err;
  auto backend = ring::kernels::create_backend(backend_name, threads, &err);
  if (!backend) {
    std::cerr << "ring-worker: backend '" << backend_name << "': " << err << "\n";
    return kExitUsage;
  }

  ring::data::CorpusOptions corpus;
  corpus.max_total_bytes = args.max_corpus_mb << 20;
  std::unique_ptr<ring::data::SequenceSource> source =
      ring::data::make_source(spec.data, args.passkey_labels, corpus);

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
      std::cerr << "ring-worker: --log-json: cannot open " << args.log_json << "\n";
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
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // --rank / --launch-local: a rank of a context-parallel ring (worker/ring/ring_main.h).
  if (ring::cp::is_ring_invocation(argc, argv)) return ring::cp::ring_main(argc, argv);
  Args args = parse_args(argc, argv);
  try {
    return run(args);
  } catch (const ring::data::DataError& e) {
    std::cerr << "ring-worker: data: " << e.what() << "\n";
  } catch (const ring::model::ModelError& e) {
    std::cerr << "ring-worker: model: " << e.what() << "\n";
  } catch (const std::exception& e) {
    std::cerr << "ring-worker: " << e.what() << "\n";
  }
  return kExitRuntime;
}
