// Generation from a checkpoint as a program runs it: the options (the flags of `ringctl
// generate`, or a generate job's spec under ringd), the inputs loaded and checked (model config,
// weights, prompts), the batch generated in one process or as one rank of P, and the output
// written by rank 0 (text, or JSON with per-token timing). `ringctl generate` (cli/cmd_generate.cc)
// and `ring-worker --generate` (a generate job's worker under ringd) both run this one
// implementation (docs/generation.md).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/contract/model_config.h"
#include "worker/data/tokenizer.h"
#include "worker/generate/generator.h"
#include "worker/generate/sampling.h"

namespace ring::gen {

// What to generate and how.
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
  // cpu, or cuda: the fast tier in GPU memory and the decode step's dense layers on the GPU (in
  // one process the prefill too; over several ranks the prefill's ring attention runs on the cpu
  // backend, since the transports move host buffers).
  std::string backend = "cpu";
  double approximate = 0.0;
  bool host_int8 = false;
  // --dtype: what the generation computes in and its KV pages hold. "" : the model's own, the
  // dtype the checkpoint's model record holds (the spec's model.dtype for a checkpoint that
  // records no settings; fp32 without either); "fp32" or "bf16" overrides it; fp16 is refused
  // (docs/generation.md, docs/precision.md).
  std::string dtype;
  // Several ranks: --ranks P launches P local ranks; a rank has --rank/--world/--rendezvous
  // (or SLURM_PROCID / SLURM_STEP_NUM_TASKS under srun).
  int ranks = 1;
  std::string split = "zigzag";
  // Two-level prefill (parallel.head_ranks): groups of head_ranks ranks split the heads by an
  // all-to-all, the ring runs over the groups; it must divide the ranks and the heads.
  int head_ranks = 1;
  int rank = -1, world = 0;
  std::string rendezvous;
  std::string transport = "ucx";
  int timeout_s = 600;
  // Cache flags given on the command line (they override the spec's generate section).
  bool has_page_tokens = false, has_fast = false, has_host = false, has_disk = false,
       has_window = false;
  // Who speaks in error messages ("ringctl generate", "ring-worker").
  std::string program = "ringctl generate";
  // Rank 0's progress (a line per prompt prefilled, and after every `progress_every` decoded
  // tokens at most one a second, and the last), when set: a generate job's worker prints it for
  // ringd.
  std::function<void(const std::string&)> progress;
  int64_t progress_every = 16;
};

// A usage error naming the flag (exit 2).
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};
// An input that cannot be used (checkpoint, prompt, spec): exit 1.
struct InputError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// "256MiB", "1G", "4096", "1.5GiB": bytes (K/M/G/T, with or without "iB"/"B", powers of 1024).
int64_t parse_size(const std::string& flag, const std::string& text);

// The cache's messages name its settings; here they are flags (and their spec keys).
std::string as_flags(std::string m);

// Everything a generation needs, checked: flags first (usage errors), then the inputs.
struct Inputs {
  GeneratorOptions go;
  SamplingParams sp;
  contract::ModelConfig mc;
  std::unique_ptr<data::Tokenizer> tok;
  std::vector<float> params;
  std::vector<std::vector<int32_t>> ids;
};
// Loads the model config (the spec's, or the checkpoint's layout record), the weights and the
// prompts. `quiet`: no notes on stderr (ranks other than 0).
Inputs load_inputs(const GenerateOpts& o, bool quiet);

// The model a checkpoint records (ckpt::read_checkpoint_model: its shape and, record 2, its
// settings: RoPE, norm eps, dtype, max positions). With spec_mc (the model section of the spec
// at spec_path) the shapes must agree and the spec's settings are used only for a checkpoint
// that records none. InputError naming --checkpoint or --spec. `quiet`: no notes on stderr.
// `ringctl generate` and `ringctl eval` read the model this way.
contract::ModelConfig model_of_checkpoint(const std::string& path,
                                          const contract::ModelConfig* spec_mc,
                                          const std::string& spec_path, bool quiet);
// A command's report: to stdout when `out` is empty, else replaced whole in `out` (private
// temporary, fsync, rename: 0600 whatever was there, never through a link, an earlier file
// intact when the write fails). InputError naming -o.
void write_output(const std::string& out, const std::string& text);

// The checkpoint's master weights (master/<param>) in mc's flat layout; InputError naming
// --checkpoint.
std::vector<float> load_checkpoint_weights(const std::string& path,
                                           const contract::ModelConfig& mc);

// Every prompt can be cut over `world` ranks with o.split (before any rank joins the others);
// InputError naming the prompt and the rule otherwise.
void check_split(const GenerateOpts& o, const Inputs& in, int world);

// This process's place among the ranks: world 1 when it runs alone.
struct Identity {
  int rank = 0, world = 1;
  std::string rendezvous;
};

// Generates in this process alone and writes the output; 0 when done.
int run_alone(const GenerateOpts& o);
// Rank id.rank of a sharded generation over id.world ranks (the transport on id.rendezvous):
// ring-attention prefill, the cache sharded, rank 0 writes the output. Once the ranks are
// joined an error ends the process at once with status 1 (worker/ring/ring_rank.h).
int run_rank(const GenerateOpts& o, const Identity& id);

}  // namespace ring::gen
