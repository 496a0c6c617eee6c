// `ringctl eval`: how good a checkpoint's model is on a dataset, in one process or as one rank
// of P (ring attention across the ranks, the launcher and rendezvous of `ringctl generate`):
//   - mean next-token loss (nats) and perplexity over the dataset's documents;
//   - loss by position bucket: the tokens whose position in their document (the context the
//     model sees before predicting the next token) is in [0, 1K), [1K, 4K), [4K, 16K),
//     [16K, 64K), [64K, 256K), [256K, 1M), [1M, ...);
//   - with --logits FILE, the logits of every scored token as .npy (float32, [T, vocab]);
//   - with --passkey DEPTHS, passkey retrieval at those depths and context lengths.
// docs/generation.md ("Evaluating a checkpoint") has the user's side.
//
// The dataset goes through the training loader (worker/data/loader.h) with pack false: one
// document (or a piece of at most --seq-len tokens: data.max_doc_len) per forward, its labels as
// the loader gives them (label -1: not scored, e.g. a chat prompt's masked tokens), documents in
// corpus order. The model and its settings come from the checkpoint's record
// (gen::model_of_checkpoint, as `ringctl generate` reads them); the weights are its masters.
//
// Passkey: the samples are the training evaluation's generator (data::make_passkey_sample,
// seed = the spec's data.seed + 1000003 as ring-worker's held-out evaluation, else --passkey-seed)
// and scored as train::evaluate_passkey scores them (greedy argmax of each answer digit,
// teacher-forced; the answer loss the model's mean over the answer digits). Depth d moves the
// sample's key line so that a fraction d of its filler comes before it (0: first, 1: just before
// the question); the depth `random` keeps the generator's own (random, in the first half): those
// are exactly the samples training evaluates, and the accuracy equals what it reported.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/contract/model_config.h"
#include "worker/data/passkey.h"
#include "worker/generate/generate_run.h"

namespace ring::eval {

using gen::Identity;
using gen::InputError;
using gen::UsageError;

struct EvalOpts {
  std::string checkpoint;
  // The dataset: the spec's data section (text or tokens; its tokenizer), or --data/--source/
  // --tokenizer (overriding the spec's).
  std::string spec;
  std::vector<std::string> data;
  std::string source;  // "" (the spec's, else text), text, tokens
  std::string tokenizer;
  int64_t seq_len = 0;   // longest document piece; 0: spec data.seq_len, else max_positions
  int64_t max_docs = 0;  // 0: every document
  std::string logits;    // .npy output
  // Passkey retrieval: depths ("0.1,0.5,0.9", "random"), context lengths.
  std::string passkey;
  std::string passkey_len;
  int64_t passkey_samples = 16;
  int64_t passkey_digits = 0;  // 0: the spec's data.passkey_digits, else 5
  int64_t passkey_seed = -1;   // -1: the spec's data.seed + 1000003, else 1000003
  bool json = false;
  std::string out;    // -o: the report here instead of stdout
  std::string dtype;  // "", fp32, bf16 (as generate's --dtype)
  int threads = 0;
  std::string backend = "cpu";
  // Ranks (cli/rank_launch.h).
  int ranks = 1;
  int rank = -1, world = 0;
  std::string rendezvous;
  std::string transport = "ucx";
  int timeout_s = 600;
  bool quiet = false;  // no progress on stderr
};

// One requested depth: a fraction in [0, 1], or the generator's own depth ("random").
struct PasskeyDepth {
  bool random = false;
  double depth = 0;
  std::string text;  // as given
};
// "0.1,0.5,0.9" or "10%,50%,random": UsageError naming --passkey and the bad item.
std::vector<PasskeyDepth> parse_depths(const std::string& text);
// "4096,16K": context lengths (K = 1024, M = 1024^2); UsageError naming `flag` and the item.
std::vector<int64_t> parse_lengths(const std::string& flag, const std::string& text);

// Sample `index` of the generator (options.labels: kAnswer for scoring) with its key line moved
// to `depth`: the same answer, filler and question; the key line starts after
// round(depth x filler bytes) bytes of filler. "random": the sample as generated.
data::PasskeySample passkey_at_depth(const data::PasskeyOptions& options, int64_t index,
                                     const PasskeyDepth& depth);

// The position buckets: [lo, hi) with hi -1 for the last (no bound).
struct BucketRange {
  int64_t lo = 0, hi = -1;
  std::string name;  // "[0, 1K)"
};
const std::vector<BucketRange>& position_buckets();

// Checks the flags and inputs without evaluating (the launcher, before it starts ranks).
void check_inputs(const EvalOpts& o);
// Evaluates in this process alone and writes the report; 0 when done.
int run_alone(const EvalOpts& o);
// Rank id.rank of id.world: every rank evaluates its share of each sequence with ring attention;
// rank 0 writes the report (and --logits). Once the ranks are joined an error ends the process.
int run_rank(const EvalOpts& o, const Identity& id);

}  // namespace ring::eval
