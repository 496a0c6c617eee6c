// ringctl eval --checkpoint DIR (--data PATH | --spec FILE) [--passkey DEPTHS]: how good a
// checkpoint's model is: mean loss and perplexity over a dataset's documents, loss by position
// bucket, the logits of its tokens as .npy, passkey retrieval at chosen depths
// (worker/eval/eval_run.h, docs/generation.md "Evaluating a checkpoint").
//
// Over P ranks (--ranks P, or srun's tasks) each sequence is cut over the ranks (zigzag) and its
// attention runs as a ring, with the launcher and rendezvous of `ringctl generate`
// (cli/rank_launch.h); rank 0 writes the report.
#include <algorithm>
#include <iostream>
#include <memory>
#include <thread>

#include <fmt/format.h>

#include "cli/commands.h"
#include "cli/ctl_common.h"
#include "cli/rank_launch.h"
#include "worker/eval/eval_run.h"

namespace ring::cli {
namespace {

using eval::EvalOpts;

// The command line of rank r of a local launch: the flags as given, and the rank's identity.
std::vector<std::string> rank_argv(const std::string& self, const EvalOpts& o, int r,
                                   const std::string& dir) {
  std::vector<std::string> a = {self, "eval", "--checkpoint", o.checkpoint};
  auto add = [&](const std::string& flag, const std::string& v) {
    a.push_back(flag);
    a.push_back(v);
  };
  if (!o.spec.empty()) add("--spec", o.spec);
  for (const auto& d : o.data) add("--data", d);
  if (!o.source.empty()) add("--source", o.source);
  if (!o.tokenizer.empty()) add("--tokenizer", o.tokenizer);
  if (o.seq_len > 0) add("--seq-len", std::to_string(o.seq_len));
  if (o.max_docs > 0) add("--max-docs", std::to_string(o.max_docs));
  if (!o.logits.empty()) add("--logits", o.logits);
  if (!o.passkey.empty()) add("--passkey", o.passkey);
  if (!o.passkey_len.empty()) add("--passkey-len", o.passkey_len);
  add("--passkey-samples", std::to_string(o.passkey_samples));
  if (o.passkey_digits > 0) add("--passkey-digits", std::to_string(o.passkey_digits));
  if (o.passkey_seed >= 0) add("--passkey-seed", std::to_string(o.passkey_seed));
  if (o.json) a.push_back("--json");
  if (!o.out.empty()) add("--output", o.out);
  if (!o.dtype.empty()) add("--dtype", o.dtype);
  if (o.quiet) a.push_back("--quiet");
  // Threads: the cores shared among the ranks unless given.
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  add("--threads", std::to_string(o.threads > 0 ? o.threads : std::max(1, cores / o.ranks)));
  add("--transport", o.transport);
  add("--timeout", std::to_string(o.timeout_s));
  add("--rank", std::to_string(r));
  add("--world", std::to_string(o.ranks));
  add("--rendezvous", dir);
  return a;
}

int run_eval(const EvalOpts& o) {
  const gen::Identity id = rank_identity(RankFlags{o.ranks, o.rank, o.world, o.rendezvous});
  if (id.world > 1) {
    if (o.backend != "cpu")
      throw gen::UsageError(fmt::format(
          "--backend {} over ranks: the ring's transports move host buffers; over ranks eval "
          "runs on the cpu backend",
          o.backend));
    EvalOpts ro = o;
    if (ro.threads == 0) ro.threads = env_int("SLURM_CPUS_PER_TASK", 0);
    return eval::run_rank(ro, id);
  }
  if (o.ranks > 1) {
    // The inputs once here, so that a bad flag or file is reported once (the ranks load them
    // too).
    eval::check_inputs(o);
    return launch_local_ranks("eval", "eval", o.ranks,
                              [&o](const std::string& self, int r, const std::string& dir) {
                                return rank_argv(self, o, r, dir);
                              });
  }
  return eval::run_alone(o);
}

}  // namespace

Subcommand add_eval(CLI::App& app) {
  auto* sc = app.add_subcommand(
      "eval",
      "Evaluate a checkpoint: mean loss and perplexity over a dataset, loss by position in the "
      "document, logits as .npy, passkey retrieval at chosen depths (docs/generation.md)");
  sc->footer(
      "Loss by position: the mean loss of the tokens whose position in their document (the "
      "tokens of context before them) is in [0, 1K), [1K, 4K), [4K, 16K), [16K, 64K), "
      "[64K, 256K), [256K, 1M) and [1M, ...) (K = 1024). Documents longer than --seq-len are "
      "cut into pieces, each evaluated from position 0. Passkey depth d: a fraction d of the "
      "sample's filler comes before the key line.");
  auto o = std::make_shared<EvalOpts>();
  sc->add_option("--checkpoint", o->checkpoint,
                 "A checkpoint directory (its newest complete step) or one step directory, "
                 "trained or made by `ringctl import`; the model and its settings are its record's")
      ->required();
  sc->add_option("--spec", o->spec,
                 "A spec whose data section is the dataset (text or tokens; its tokenizer), or "
                 "for --passkey a passkey spec (its seq_len, digits and held-out seed)")
      ->check(CLI::ExistingFile);
  sc->add_option("--data", o->data,
                 "The dataset: text files or directories (--source text), or token datasets "
                 "(--source tokens, .bin/.idx); with --spec, files of the spec's data.source "
                 "(text, tokens or chat JSONL, with its tokenizer and template); repeatable");
  sc->add_option("--source", o->source,
                 "text (default without --spec; bytes, or --tokenizer ids) or tokens")
      ->check(CLI::IsMember({"text", "tokens"}));
  sc->add_option("--tokenizer", o->tokenizer,
                 "SentencePiece model or tokenizer.json for --source text")
      ->check(CLI::ExistingFile);
  sc->add_option("--seq-len", o->seq_len,
                 "Longest document piece evaluated at once, in tokens (longer documents are cut; "
                 "default: the spec's data.seq_len, else the model's max_positions)")
      ->check(CLI::Range(int64_t{2}, int64_t{1} << 31));
  sc->add_option("--max-docs", o->max_docs, "Evaluate the first N documents only (default all)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
  sc->add_option("--logits", o->logits,
                 "Write the logits of every token of the evaluated documents (in corpus order) "
                 "to FILE as .npy: float32 [tokens, vocab]");
  sc->add_option("--passkey", o->passkey,
                 "Passkey retrieval at these depths: fractions of the context before the key "
                 "line (0.1,0.5,0.9 or 10%), or 'random' (the training evaluation's samples)");
  sc->add_option("--passkey-len", o->passkey_len,
                 "Context lengths of the passkey samples (4096,16K; default: a passkey spec's "
                 "seq_len)");
  sc->add_option("--passkey-samples", o->passkey_samples,
                 "Samples per depth and length (default 16)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  sc->add_option("--passkey-digits", o->passkey_digits,
                 "Digits of the pass key (default: the spec's data.passkey_digits, else 5)")
      ->check(CLI::Range(int64_t{1}, int64_t{32}));
  sc->add_option("--passkey-seed", o->passkey_seed,
                 "Seed of the samples (default: the spec's data.seed + 1000003, ring-worker's "
                 "held-out samples; else 1000003)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 62));
  sc->add_flag("--json", o->json, "One JSON object with everything (buckets, passkey, ...)");
  sc->add_option("-o,--output", o->out, "Write the report here (0600) instead of stdout");
  sc->add_flag("-q,--quiet", o->quiet, "No progress lines on stderr");
  sc->add_option("--dtype", o->dtype,
                 "Compute in fp32 or bf16 (default: the model's dtype as the checkpoint records "
                 "it)");
  sc->add_option("--threads", o->threads, "CPU threads (default 0: all cores)")
      ->check(CLI::Range(0, 4096));
  sc->add_option("--backend", o->backend, "Kernel backend: cpu (default) or cuda (one process)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  sc->add_option("--ranks", o->ranks,
                 "Evaluate over P local ranks: each sequence cut over them, attention as a ring "
                 "(default 1)")
      ->check(CLI::Range(1, 4096));
  add_rank_placement_flags(sc, "a sharded evaluation", {&o->rank, &o->world, &o->rendezvous, &o->transport,
                                      &o->timeout_s});
  return {sc, [o]() {
            try {
              return run_eval(*o);
            } catch (const gen::UsageError& e) {
              std::cerr << "ringctl eval: " << e.what() << "\n";
              return kExitUsage;
            } catch (const gen::InputError& e) {
              std::cerr << "ringctl eval: " << e.what() << "\n";
              return kExitFailed;
            } catch (const contract::ModelError& e) {
              std::cerr << "ringctl eval: " << e.what() << "\n";
              return kExitFailed;
            } catch (const std::runtime_error& e) {
              std::cerr << "ringctl eval: " << e.what() << "\n";
              return kExitFailed;
            }
          }};
}

}  // namespace ring::cli
