// Cross-field rules of the job spec: checked after every key parsed cleanly. Each rule has one
// line of documentation (docs/spec-reference.md is generated from it) and a check.
#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/plan/plan.h"
#include "common/spec/keys.h"
#include "common/spec/parse.h"

namespace ring::spec {
namespace {

struct Ctx {
  const JobSpec& s;
  const SourceMap& src;
  std::vector<Diagnostic>& out;
  const LoadOptions& options;
  RuleScope scope = RuleScope::kSpec;  // of the rule being checked

  void error(const std::string& key, std::string msg) {
    // A runtime limit of a design that is only planned (`ringctl plan --what-if`): a warning.
    const bool limit = scope != RuleScope::kSpec;
    const auto sev = limit && !options.runtime_limits_are_errors ? Diagnostic::Severity::kWarning
                                                                 : Diagnostic::Severity::kError;
    out.push_back({sev, src.file, src.at(key), key, std::move(msg)});
  }
  void warning(const std::string& key, std::string msg) {
    out.push_back({Diagnostic::Severity::kWarning, src.file, src.at(key), key, std::move(msg)});
  }
  bool given(const std::string& key) const { return src.keys.count(key) > 0; }
};

// The ids of a Hugging Face tokenizer.json (worker/data/tokenizer.h: a ".json" name or a first
// non-blank '{'): the largest id of model.vocab and added_tokens, plus one. nullopt when the file
// is not one; whether its parts are supported is checked when the worker loads it.
bool looks_like_tokenizer_json(const std::string& path) {
  if (path.ends_with(".json")) return true;
  struct stat st;  // only a regular file is read (never a FIFO)
  if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return false;
  std::ifstream in(path, std::ios::binary);
  char ch;
  while (in.get(ch))
    if (!std::isspace(static_cast<unsigned char>(ch))) return ch == '{';
  return false;
}

std::optional<int64_t> tokenizer_json_ids(const std::string& path, std::string& why) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    why = std::strerror(errno);
    return std::nullopt;
  }
  try {
    const auto j = nlohmann::json::parse(in);
    int64_t n = 0;
    if (j.contains("model") && j["model"].contains("vocab") && j["model"]["vocab"].is_object())
      for (const auto& [k, v] : j["model"]["vocab"].items())
        if (v.is_number_integer()) n = std::max<int64_t>(n, v.get<int64_t>() + 1);
    if (j.contains("added_tokens") && j["added_tokens"].is_array())
      for (const auto& t : j["added_tokens"])
        if (t.is_object() && t.contains("id") && t["id"].is_number_integer())
          n = std::max<int64_t>(n, t["id"].get<int64_t>() + 1);
    if (n == 0) {
      why = "a tokenizer.json without model.vocab";
      return std::nullopt;
    }
    return n;
  } catch (const nlohmann::json::exception& e) {
    why = std::string("not valid JSON: ") + e.what();
    return std::nullopt;
  }
}

// Pieces in a SentencePiece model file: the entries of ModelProto field 1 (`repeated
// SentencePiece pieces = 1`), counted by walking the protobuf wire format, so that the spec
// library needs no SentencePiece. nullopt with `why` set when the file is not such a model.
std::optional<int64_t> sentencepiece_pieces(const std::string& path, std::string& why) {
  // Only a regular file of plausible size is read (never a FIFO or /dev/zero).
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    why = std::strerror(errno);
    return std::nullopt;
  }
  if (!S_ISREG(st.st_mode) || st.st_size > (int64_t{1} << 30)) {
    why = "not a regular file of at most 1 GiB";
    return std::nullopt;
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    why = std::strerror(errno);
    return std::nullopt;
  }
  std::string b((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  size_t i = 0;
  auto varint = [&](uint64_t& v) {
    v = 0;
    for (int shift = 0; shift < 64 && i < b.size(); shift += 7) {
      auto byte = static_cast<uint8_t>(b[i++]);
      v |= uint64_t{byte & 0x7fu} << shift;
      if ((byte & 0x80) == 0) return true;
    }
    return false;
  };
  int64_t pieces = 0;
  while (i < b.size()) {
    uint64_t key, v;
    if (!varint(key)) break;
    const uint64_t wire = key & 7;
    if (wire == 0) {
      if (!varint(v)) break;
    } else if (wire == 1 || wire == 5) {
      i += wire == 1 ? 8 : 4;
    } else if (wire == 2) {
      if (!varint(v) || v > b.size() - std::min(i, b.size())) {
        i = b.size() + 1;
        break;
      }
      i += v;
      if (key >> 3 == 1) ++pieces;
    } else {
      i = b.size() + 1;
      break;
    }
  }
  if (i != b.size() || pieces == 0) {
    why = "not a SentencePiece model (no pieces, or not protobuf)";
    return std::nullopt;
  }
  return pieces;
}

struct Rule {
  RuleDoc doc;
  std::function<void(Ctx&)> check;
};

// The planner's flat layout of the model (common/plan), for a spec whose keys parsed.
plan::FlatLayout resolved_layout(const JobSpec& s) {
  JobSpec r = s;
  resolve_spec(r);
  return plan::flat_layout(r);
}

// Parses a Slurm time limit into seconds: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS.
std::optional<int64_t> slurm_time_seconds(const std::string& t) {
  std::vector<int64_t> f;  // the colon-separated fields after an optional "D-"
  int64_t days = -1;
  std::string rest = t;
  if (auto dash = t.find('-'); dash != std::string::npos) {
    std::string d = t.substr(0, dash);
    if (d.empty() || d.size() > 6 || !std::all_of(d.begin(), d.end(), ::isdigit))
      return std::nullopt;
    days = std::stoll(d);
    rest = t.substr(dash + 1);
  }
  size_t i = 0;
  while (true) {
    size_t colon = rest.find(':', i);
    std::string part = rest.substr(i, colon == std::string::npos ? std::string::npos : colon - i);
    if (part.empty() || part.size() > 6 || !std::all_of(part.begin(), part.end(), ::isdigit))
      return std::nullopt;
    f.push_back(std::stoll(part));
    if (colon == std::string::npos) break;
    i = colon + 1;
  }
  if (f.size() > 3) return std::nullopt;
  if (days >= 0) {  // D-HH[:MM[:SS]]
    int64_t hh = f[0], mm = f.size() > 1 ? f[1] : 0, ss = f.size() > 2 ? f[2] : 0;
    if (hh > 23 || mm > 59 || ss > 59) return std::nullopt;
    return ((days * 24 + hh) * 60 + mm) * 60 + ss;
  }
  if (f.size() == 3) {  // HH:MM:SS
    if (f[1] > 59 || f[2] > 59) return std::nullopt;
    return (f[0] * 60 + f[1]) * 60 + f[2];
  }
  if (f.size() == 2) {  // MM:SS
    if (f[1] > 59) return std::nullopt;
    return f[0] * 60 + f[1];
  }
  return f[0] * 60;  // MM
}

// sbatch options ringmaster renders itself, with the spec key that sets each.
const std::vector<std::pair<std::string, std::string>>& managed_sbatch_options() {
  static const std::vector<std::pair<std::string, std::string>> m = {
      {"--nodes", "resources.nodes"},          {"-N", "resources.nodes"},
      {"--ntasks-per-node", "(one ringd per node)"},
      {"--ntasks", "(one ringd per node)"},    {"-n", "(one ringd per node)"},
      {"--gpus-per-node", "resources.gpus_per_node"},
      {"--gres", "resources.gpus_per_node"},   {"--partition", "slurm.partition"},
      {"-p", "slurm.partition"},               {"--account", "slurm.account"},
      {"-A", "slurm.account"},                 {"--time", "slurm.time"},
      {"-t", "slurm.time"},                    {"--qos", "slurm.qos"},
      {"-q", "slurm.qos"},                     {"--constraint", "slurm.constraint"},
      {"-C", "slurm.constraint"},              {"--requeue", "slurm.requeue"},
      {"--no-requeue", "slurm.requeue"},       {"--signal", "slurm.signal_before_s"},
      {"--job-name", "job.name"},              {"-J", "job.name"},
      {"--cpus-per-task", "resources.cpus_per_worker"},
      {"-c", "resources.cpus_per_worker"},
  };
  return m;
}

bool has_space_or_control(const std::string& s) {
  return std::any_of(s.begin(), s.end(), [](unsigned char c) { return c <= 0x20 || c == 0x7f; });
}

const std::vector<Rule>& rules() {
  static const std::vector<Rule> r = {
      {{"job.name", "1-64 characters from [A-Za-z0-9._-], starting with a letter or digit."},
       [](Ctx& c) {
         if (!valid_job_name(c.s.job.name))
           c.error("job.name",
                   fmt::format("'{}' is not a valid job name: use 1-64 characters from "
                               "[A-Za-z0-9._-], starting with a letter or digit",
                               c.s.job.name.substr(0, 80)));
       }},
      {{"job.kind, generate.checkpoint, generate.prompts",
        "generate: generate.checkpoint and at least one of generate.prompts are given (and "
        "generate.* of what to generate is used by generate jobs only)."},
       [](Ctx& c) {
         const auto& g = c.s.generate;
         if (c.s.job.kind != JobKind::kGenerate) {
           for (const char* k : {"generate.checkpoint", "generate.prompts", "generate.output",
                                 "generate.json", "generate.max_new_tokens", "generate.temperature",
                                 "generate.top_p", "generate.seed", "generate.hang_deadline_s"})
             if (c.given(k))
               c.warning(k, fmt::format("ignored: job.kind is train ({} is read by job.kind "
                                        "generate only)",
                                        k));
           return;
         }
         if (g.checkpoint.empty())
           c.error(c.given("generate.checkpoint") ? "generate.checkpoint" : "job.kind",
                   "job.kind generate needs generate.checkpoint: the checkpoint directory whose "
                   "weights generate");
         if (g.prompts.empty())
           c.error(c.given("generate.prompts") ? "generate.prompts" : "job.kind",
                   "job.kind generate needs generate.prompts: at least one prompt file");
         for (const std::string& p : g.prompts)
           if (p.empty()) c.error("generate.prompts", "an empty file name");
         if (g.top_p < 1.0 && g.temperature == 0.0)
           c.warning("generate.top_p", "ignored: generate.temperature is 0 (greedy)");
         if (c.given("checkpoint.dir") || c.given("checkpoint.every_steps"))
           c.warning("checkpoint.dir",
                     "ignored: a generate job writes no checkpoints (it reads "
                     "generate.checkpoint)");
       }},
      {{"job.kind, parallel.data_replicas",
        "generate: one ring of parallel.context_ranks ranks (data_replicas 1, shard none); "
        "resources.backend cuda puts each rank's fast tier in its GPU's memory."},
       [](Ctx& c) {
         if (c.s.job.kind != JobKind::kGenerate) return;
         if (c.s.parallel.data_replicas != 1)
           c.error("parallel.data_replicas",
                   fmt::format("job.kind generate runs one ring of parallel.context_ranks ranks; "
                               "data_replicas must be 1 (got {})",
                               c.s.parallel.data_replicas));
         if (c.s.parallel.shard != ShardMode::kNone)
           c.error("parallel.shard",
                   fmt::format("job.kind generate: every rank holds the whole model; shard must "
                               "be none (got {})",
                               to_string(c.s.parallel.shard)));
       }},
      {{"parallel.head_ranks, parallel.context_ranks, resources.workers_per_node, model.heads, "
        "model.kv_heads",
        "head_ranks divides context_ranks (the ring has context_ranks / head_ranks groups), "
        "workers_per_node (a group sits inside one node) and model.heads; it divides "
        "model.kv_heads or is a multiple of it (K/V heads are then replicated)."},
       [](Ctx& c) {
         const int64_t u = c.s.parallel.head_ranks;
         if (u <= 1) return;
         const auto& m = c.s.model;
         const int64_t kv = m.kv_heads.value_or(m.heads);
         if (c.s.parallel.context_ranks % u != 0)
           c.error("parallel.head_ranks",
                   fmt::format("head_ranks ({}) must divide parallel.context_ranks ({}): the "
                               "ring runs over context_ranks / head_ranks groups",
                               u, c.s.parallel.context_ranks));
         if (c.s.resources.workers_per_node % u != 0)
           c.error("parallel.head_ranks",
                   fmt::format("head_ranks ({}) must divide resources.workers_per_node ({}): a "
                               "head group's all-to-all runs inside one node",
                               u, c.s.resources.workers_per_node));
         if (m.heads % u != 0)
           c.error("parallel.head_ranks",
                   fmt::format("head_ranks ({}) must divide model.heads ({}): each rank of a "
                               "group computes heads / head_ranks query heads",
                               u, m.heads));
         else if (kv % u != 0 && u % kv != 0)
           c.error("parallel.head_ranks",
                   fmt::format("head_ranks ({}) must divide model.kv_heads ({}) or be a "
                               "multiple of it (each K/V head is then replicated on head_ranks "
                               "/ kv_heads ranks)",
                               u, kv));
       }},
      {{"model.heads, model.kv_heads", "heads must be a multiple of kv_heads."},
       [](Ctx& c) {
         const auto& m = c.s.model;
         if (m.kv_heads && m.heads % *m.kv_heads != 0)
           c.error("model.kv_heads",
                   fmt::format("model.heads ({}) must be a multiple of model.kv_heads ({})",
                               m.heads, *m.kv_heads));
       }},
      {{"model.d_model, model.heads, model.head_dim",
        "Without head_dim, d_model must be divisible by heads (head_dim = d_model / heads)."},
       [](Ctx& c) {
         const auto& m = c.s.model;
         if (!m.head_dim && m.d_model % m.heads != 0)
           c.error("model.d_model",
                   fmt::format("model.d_model ({}) is not divisible by model.heads ({}): set "
                               "model.head_dim or change one of them",
                               m.d_model, m.heads));
       }},
      {{"model.head_dim", "head_dim (given or derived) must be even: RoPE rotates pairs."},
       [](Ctx& c) {
         const auto& m = c.s.model;
         int64_t hd = m.head_dim ? *m.head_dim : (m.heads ? m.d_model / m.heads : 0);
         if (hd % 2 != 0)
           c.error(m.head_dim ? "model.head_dim" : "model.d_model",
                   fmt::format("head_dim {} is odd; RoPE needs an even head size", hd));
       }},
      {{"model.rope_scaling, model.rope_original_context",
        "llama3 and yarn scaling need rope_original_context (the context the model was trained "
        "with); llama3 needs rope_high_freq_factor > rope_low_freq_factor, yarn rope_beta_fast > "
        "rope_beta_slow."},
       [](Ctx& c) {
         const auto& m = c.s.model;
         const bool banded =
             m.rope_scaling == RopeScaling::kLlama3 || m.rope_scaling == RopeScaling::kYarn;
         if (banded && m.rope_original_context <= 0)
           c.error("model.rope_scaling",
                   fmt::format("model.rope_scaling {} needs model.rope_original_context (the "
                               "context the model was trained with, "
                               "original_max_position_embeddings)",
                               to_string(m.rope_scaling)));
         if (m.rope_scaling == RopeScaling::kLlama3 &&
             !(m.rope_high_freq_factor > m.rope_low_freq_factor))
           c.error("model.rope_high_freq_factor",
                   fmt::format("model.rope_high_freq_factor ({:g}) must be larger than "
                               "model.rope_low_freq_factor ({:g})",
                               m.rope_high_freq_factor, m.rope_low_freq_factor));
         if (m.rope_scaling == RopeScaling::kYarn && !(m.rope_beta_fast > m.rope_beta_slow))
           c.error("model.rope_beta_fast",
                   fmt::format("model.rope_beta_fast ({:g}) must be larger than "
                               "model.rope_beta_slow ({:g})",
                               m.rope_beta_fast, m.rope_beta_slow));
         if (m.rope_scaling == RopeScaling::kNone && m.rope_scaling_factor != 1.0)
           c.warning("model.rope_scaling_factor", "ignored: model.rope_scaling is none");
       }},
      {{"model.init_from",
        "An absolute path; a path missing here is a warning (it may exist only on the cluster); "
        "the job cannot start without it."},
       [](Ctx& c) {
         const std::string& p = c.s.model.init_from;
         if (p.empty()) return;
         if (p.front() != '/') {
           c.error("model.init_from",
                   fmt::format("model.init_from '{}' must be an absolute path", p));
           return;
         }
         std::error_code ec;
         if (!std::filesystem::exists(p, ec))
           c.warning("model.init_from",
                     fmt::format("{} does not exist here; the job cannot start without it", p));
       }},
      {{"model.vocab, data.source, data.tokenizer",
        "Byte-level text and chat (no data.tokenizer) and passkey need vocab >= 256; with "
        "data.tokenizer (text and chat sources) vocab >= the tokenizer's piece count "
        "(SentencePiece) or largest id + 1 (tokenizer.json), read from the file (which must "
        "exist); "
        "tokens: vocab >= the vocab in each .idx header that exists."},
       [](Ctx& c) {
         const auto& d = c.s.data;
         const bool tokenized =
             (d.source == DataSource::kText || d.source == DataSource::kChat) &&
             !d.tokenizer.empty();
         if (d.source == DataSource::kTokens) {
           // The vocab recorded in each dataset's .idx header (docs/data.md), when the file is
           // here; the worker checks every id against model.vocab when it opens the data.
           for (const auto& path : d.paths) {
             std::string prefix = path;
             if (prefix.size() > 4 && (prefix.ends_with(".bin") || prefix.ends_with(".idx")))
               prefix.resize(prefix.size() - 4);
             std::ifstream idx(prefix + ".idx", std::ios::binary);
             char h[40] = {};
             if (!idx.read(h, sizeof h) || std::memcmp(h, "RINGTOK\0", 8) != 0) continue;
             uint64_t vocab = 0;
             std::memcpy(&vocab, h + 32, 8);
             if (vocab > static_cast<uint64_t>(c.s.model.vocab))
               c.error("model.vocab",
                       fmt::format("model.vocab ({}) is below the vocab {} recorded in '{}.idx'",
                                   c.s.model.vocab, vocab, prefix));
           }
           return;
         }
         if (!tokenized) {
           if (c.s.model.vocab < 256)
             c.error("model.vocab",
                     fmt::format("model.vocab ({}) is below 256; the {} source produces byte "
                                 "tokens 0..255",
                                 c.s.model.vocab, to_string(d.source)));
           return;
         }
         std::string why;
         const bool json = looks_like_tokenizer_json(d.tokenizer);
         auto pieces = json ? tokenizer_json_ids(d.tokenizer, why)
                            : sentencepiece_pieces(d.tokenizer, why);
         if (!pieces) {
           c.error("data.tokenizer",
                   fmt::format("cannot read the {} '{}': {}",
                               json ? "tokenizer.json" : "SentencePiece model", d.tokenizer, why));
         } else if (c.s.model.vocab < *pieces) {
           c.error("model.vocab",
                   fmt::format("model.vocab ({}) is below the {} pieces of data.tokenizer '{}'",
                               c.s.model.vocab, *pieces, d.tokenizer));
         }
       }},
      {{"data.tokenizer, data.source",
        "data.tokenizer is read by the text and chat sources only."},
       [](Ctx& c) {
         if (!c.s.data.tokenizer.empty() && c.s.data.source != DataSource::kText &&
             c.s.data.source != DataSource::kChat)
           c.warning("data.tokenizer",
                     fmt::format("ignored: data.source is {}", to_string(c.s.data.source)));
       }},
      {{"data.chat_template, data.source, data.tokenizer",
        "The chat source needs data.chat_template (llama3, chatml or a template file); the "
        "built-in templates need data.tokenizer (their special tokens); other sources ignore "
        "it."},
       [](Ctx& c) {
         const auto& d = c.s.data;
         if (d.source != DataSource::kChat) {
           if (!d.chat_template.empty())
             c.warning("data.chat_template",
                       fmt::format("ignored: data.source is {}", to_string(d.source)));
           return;
         }
         const bool builtin = d.chat_template == "llama3" || d.chat_template == "chatml";
         std::error_code ec;
         if (d.chat_template.empty())
           c.error("data.chat_template",
                   "data.source is chat but data.chat_template is not set: llama3, chatml or the "
                   "path of a YAML template file (docs/data.md)");
         else if (builtin && d.tokenizer.empty())
           c.error("data.chat_template",
                   fmt::format("the {} template needs data.tokenizer: its special tokens are ids "
                               "of the tokenizer, and byte-level data has none",
                               d.chat_template));
         else if (!builtin && !std::filesystem::is_regular_file(d.chat_template, ec))
           c.warning("data.chat_template",
                     fmt::format("'{}' is neither llama3 nor chatml and is not a file here; "
                                 "every node must have it",
                                 d.chat_template));
       }},
      {{"model.recompute_policy",
        "selective needs model.recompute: true (the policy says what a recompute re-runs)."},
       [](Ctx& c) {
         if (!c.s.model.recompute && c.s.model.recompute_policy == RecomputePolicy::kSelective)
           c.error("model.recompute_policy",
                   "selective needs model.recompute: true (without recompute every activation "
                   "is kept and nothing is re-run)");
       }},
      {{"model.dtype", "fp32 or bf16 (mixed precision, docs/precision.md); fp16 is refused."},
       [](Ctx& c) {
         if (c.s.model.dtype == DType::kFp16)
           c.error("model.dtype",
                   "fp16 is not supported; use bf16 (bf16 compute, fp32 accumulation and master "
                   "weights: docs/precision.md) or fp32");
       }},
      {{"data.source, data.paths",
        "The text, tokens and chat sources need at least one path; paths are ignored by the "
        "passkey source."},
       [](Ctx& c) {
         const auto& d = c.s.data;
         if (d.source == DataSource::kText && d.paths.empty())
           c.error("data.paths",
                   "data.source is text but data.paths is empty: list files or directories "
                   "of text (e.g. /usr/share/doc)");
         if (d.source == DataSource::kTokens && d.paths.empty())
           c.error("data.paths",
                   "data.source is tokens but data.paths is empty: list token datasets "
                   "(<name>.bin + <name>.idx, see ringctl tokenize)");
         if (d.source == DataSource::kChat && d.paths.empty())
           c.error("data.paths",
                   "data.source is chat but data.paths is empty: list JSONL files of "
                   "conversations (or directories of *.jsonl)");
         if (d.source == DataSource::kPasskey && !d.paths.empty())
           c.warning("data.paths", "ignored: data.source is passkey (synthetic data)");
         for (size_t i = 0; i < d.paths.size(); ++i)
           if (d.paths[i].empty()) c.error("data.paths", fmt::format("item {} is empty", i));
         if (d.source != DataSource::kPasskey)
           for (const std::string& m : missing_data_paths(c.s))
             c.warning("data.paths", m + "; every node must have it (ringctl run and ringd "
                                         "refuse to start without it)");
       }},
      {{"data.seq_len, parallel.context_ranks, parallel.causal_balance",
        "zigzag: seq_len divisible by 2 x context_ranks; contiguous: by context_ranks."},
       [](Ctx& c) {
         int64_t p = c.s.parallel.context_ranks;
         bool zig = c.s.parallel.causal_balance == CausalBalance::kZigzag;
         int64_t div = zig ? 2 * p : p;
         if (c.s.data.seq_len % div != 0)
           c.error("data.seq_len",
                   fmt::format("data.seq_len ({}) must be divisible by {} ({}causal_balance {} "
                               "with {} context ranks)",
                               c.s.data.seq_len, div, zig ? "2 x ranks for " : "",
                               to_string(c.s.parallel.causal_balance), p));
       }},
      {{"data.min_doc_len, data.max_doc_len, data.seq_len",
        "min_doc_len <= seq_len; max_doc_len (when not 0) >= min_doc_len."},
       [](Ctx& c) {
         const auto& d = c.s.data;
         if (d.min_doc_len > d.seq_len)
           c.error("data.min_doc_len",
                   fmt::format("data.min_doc_len ({}) is larger than data.seq_len ({})",
                               d.min_doc_len, d.seq_len));
         if (d.max_doc_len != 0 && d.max_doc_len < d.min_doc_len)
           c.error("data.max_doc_len",
                   fmt::format("data.max_doc_len ({}) is smaller than data.min_doc_len ({})",
                               d.max_doc_len, d.min_doc_len));
       }},
      {{"data.source, data.seq_len, data.passkey_digits",
        "passkey needs seq_len >= 128 and room for the key: seq_len >= 16 x passkey_digits."},
       [](Ctx& c) {
         const auto& d = c.s.data;
         if (d.source != DataSource::kPasskey) return;
         int64_t need = std::max<int64_t>(128, 16 * d.passkey_digits);
         if (d.seq_len < need)
           c.error("data.seq_len",
                   fmt::format("data.seq_len ({}) is too short for the passkey task; need at "
                               "least {}",
                               d.seq_len, need));
       }},
      {{"parallel.context_ranks, parallel.data_replicas, resources.nodes, "
        "resources.workers_per_node",
        "context_ranks x data_replicas must equal nodes x workers_per_node (one worker per rank)."},
       [](Ctx& c) {
         const auto& p = c.s.parallel;
         const auto& r = c.s.resources;
         if (p.context_ranks * p.data_replicas != r.nodes * r.workers_per_node)
           c.error("parallel.context_ranks",
                   fmt::format("context_ranks ({}) x data_replicas ({}) = {} ranks, but "
                               "resources give nodes ({}) x workers_per_node ({}) = {} workers",
                               p.context_ranks, p.data_replicas,
                               p.context_ranks * p.data_replicas, r.nodes, r.workers_per_node,
                               r.nodes * r.workers_per_node));
       }},
      {{"parallel.shard, optimizer.offload, resources.nodes",
        "shard optimizer or full needs offload cpu (the shards are ringd's); warning: shard "
        "optimizer on one node shards nothing."},
       [](Ctx& c) {
         const auto& p = c.s.parallel;
         if (p.shard == ShardMode::kNone) return;
         if (c.s.optimizer.offload != Offload::kCpu)
           c.error("parallel.shard",
                   fmt::format("shard {} needs optimizer.offload: cpu (each node's ringd owns a "
                               "range of the optimizer state); offload is none",
                               to_string(p.shard)));
         else if (p.shard == ShardMode::kOptimizer && c.s.resources.nodes == 1)
           c.warning("parallel.shard",
                     "shard optimizer with resources.nodes 1: the one ringd owns every range "
                     "(nothing is sharded)");
       }},
      {{"parallel.ring_order, parallel.ring_order_list",
        "ring_order list needs ring_order_list, a permutation of 0 .. context_ranks-1; "
        "ring_order_list is only allowed with ring_order list."},
       [](Ctx& c) {
         const auto& p = c.s.parallel;
         if (p.ring_order != RingOrder::kList) {
           if (!p.ring_order_list.empty())
             c.error("parallel.ring_order_list",
                     fmt::format("given, but parallel.ring_order is {}; set ring_order: list "
                                 "or remove ring_order_list",
                                 to_string(p.ring_order)));
           return;
         }
         const auto& l = p.ring_order_list;
         if (static_cast<int64_t>(l.size()) != p.context_ranks) {
           c.error("parallel.ring_order_list",
                   fmt::format("has {} entries; ring_order list needs a permutation of the {} "
                               "context ranks",
                               l.size(), p.context_ranks));
           return;
         }
         std::set<int64_t> seen;
         for (int64_t v : l) {
           if (v < 0 || v >= p.context_ranks) {
             c.error("parallel.ring_order_list",
                     fmt::format("rank {} is out of range 0..{}", v, p.context_ranks - 1));
             return;
           }
           if (!seen.insert(v).second) {
             c.error("parallel.ring_order_list",
                     fmt::format("rank {} appears twice; expected a permutation", v));
             return;
           }
         }
       }},
      {{"optimizer.compression, optimizer.offload",
        "compression topk runs in ringd: it needs offload cpu."},
       [](Ctx& c) {
         const auto& o = c.s.optimizer;
         if (o.compression == Compression::kTopk && o.offload != Offload::kCpu)
           c.error("optimizer.compression",
                   "compression topk needs optimizer.offload cpu (ringd compresses the node "
                   "gradient)");
       }},
      {{"optimizer.update, optimizer.compression",
        "update lazy needs compression topk (it updates the selected coordinates only)."},
       [](Ctx& c) {
         const auto& o = c.s.optimizer;
         if (o.update == UpdateMode::kLazy && o.compression != Compression::kTopk)
           c.error("optimizer.update",
                   "update lazy needs optimizer.compression topk: lazy mode updates only the "
                   "coordinates top-k selects");
       }},
      {{"optimizer.compress_at, parallel.shard, optimizer.compression",
        "compress_at sender is refused with shard full (the workers' reduce-scatter already sums "
        "the job's gradient at each range's owner, so top-k can only select there); warning: "
        "compress_at sender without compression topk is ignored."},
       [](Ctx& c) {
         const auto& o = c.s.optimizer;
         if (o.compress_at != CompressAt::kSender) return;
         if (c.s.parallel.shard == ShardMode::kFull)
           c.error("optimizer.compress_at",
                   "compress_at sender cannot be used with parallel.shard full: the workers "
                   "reduce-scatter the gradient, so each range's summed gradient exists only at "
                   "its owner, where top-k selects; use compress_at: owner, or parallel.shard "
                   "none or optimizer");
         else if (o.compression != Compression::kTopk)
           c.warning("optimizer.compress_at", "ignored: optimizer.compression is none");
       }},
      {{"optimizer.warmup_steps, optimizer.compression, train.steps",
        "Warnings: warmup_steps without topk is ignored; warmup_steps >= steps means top-k "
        "never starts."},
       [](Ctx& c) {
         const auto& o = c.s.optimizer;
         if (o.compression != Compression::kTopk && o.warmup_steps > 0)
           c.warning("optimizer.warmup_steps", "ignored: optimizer.compression is none");
         if (o.compression == Compression::kTopk && o.warmup_steps >= c.s.train.steps)
           c.warning("optimizer.warmup_steps",
                     fmt::format("{} dense warm-up steps >= train.steps ({}): top-k never "
                                 "starts",
                                 o.warmup_steps, c.s.train.steps));
       }},
      {{"optimizer.min_lr, optimizer.lr", "min_lr <= lr."},
       [](Ctx& c) {
         if (c.s.optimizer.min_lr > c.s.optimizer.lr)
           c.error("optimizer.min_lr",
                   fmt::format("optimizer.min_lr ({:g}) is larger than optimizer.lr ({:g})",
                               c.s.optimizer.min_lr, c.s.optimizer.lr));
       }},
      {{"optimizer.lr_warmup_steps, train.steps", "lr_warmup_steps <= steps."},
       [](Ctx& c) {
         if (c.s.optimizer.lr_warmup_steps > c.s.train.steps)
           c.error("optimizer.lr_warmup_steps",
                   fmt::format("optimizer.lr_warmup_steps ({}) is more than train.steps ({})",
                               c.s.optimizer.lr_warmup_steps, c.s.train.steps));
       }},
      {{"checkpoint.every_steps, checkpoint.dir", "Periodic checkpoints need a directory."},
       [](Ctx& c) {
         if (c.s.checkpoint.every_steps > 0 && c.s.checkpoint.dir.empty())
           c.error("checkpoint.every_steps",
                   fmt::format("checkpoint.every_steps is {} but checkpoint.dir is empty",
                               c.s.checkpoint.every_steps));
       }},
      {{"resources.backend, resources.gpus_per_node, resources.workers_per_node",
        "backend cuda needs gpus_per_node >= workers_per_node (one GPU per worker)."},
       [](Ctx& c) {
         const auto& r = c.s.resources;
         if (r.backend == Backend::kCuda && r.gpus_per_node < r.workers_per_node)
           c.error("resources.gpus_per_node",
                   fmt::format("backend cuda needs a GPU per worker: gpus_per_node ({}) < "
                               "workers_per_node ({})",
                               r.gpus_per_node, r.workers_per_node));
         if (r.backend == Backend::kCpu && r.gpus_per_node > 0)
           c.warning("resources.gpus_per_node",
                     "GPUs are requested but resources.backend is cpu: they stay idle");
       }},
      {{"slurm.time, slurm.signal_before_s",
        "time in a Slurm format; signal_before_s shorter than the time limit."},
       [](Ctx& c) {
         const auto& s = c.s.slurm;
         if (s.time.empty()) return;
         auto secs = slurm_time_seconds(s.time);
         if (!secs) {
           c.error("slurm.time",
                   fmt::format("'{}' is not a Slurm time: use MM, MM:SS, HH:MM:SS, D-HH, "
                               "D-HH:MM or D-HH:MM:SS",
                               s.time.substr(0, 80)));
           return;
         }
         if (*secs == 0)
           c.error("slurm.time", "time limit is zero");
         else if (s.signal_before_s >= *secs)
           c.error("slurm.signal_before_s",
                   fmt::format("signal_before_s ({}) is not shorter than the time limit {} "
                               "({} s)",
                               s.signal_before_s, s.time, *secs));
       }},
      {{"slurm.partition, slurm.account, slurm.qos, slurm.constraint",
        "No spaces or control characters (they are written into the batch script)."},
       [](Ctx& c) {
         const auto& s = c.s.slurm;
         for (auto [key, v] : {std::pair{"slurm.partition", &s.partition},
                               std::pair{"slurm.account", &s.account},
                               std::pair{"slurm.qos", &s.qos}})
           if (has_space_or_control(*v))
             c.error(key, "contains spaces or control characters");
         for (unsigned char ch : s.constraint)
           if (ch < 0x20 || ch == 0x7f || ch == '\'' || ch == '"' || ch == '\\') {
             c.error("slurm.constraint", "contains quotes, backslashes or control characters");
             break;
           }
       }},
      {{"slurm.extra_sbatch",
        "Each item is one option starting with '-', on one line, and not one ringmaster "
        "sets from another key (--nodes, --time, --signal, ...)."},
       [](Ctx& c) {
         for (const auto& o : c.s.slurm.extra_sbatch) {
           if (o.empty() || o[0] != '-') {
             c.error("slurm.extra_sbatch",
                     fmt::format("item '{}' is not an sbatch option (must start with '-')",
                                 o.substr(0, 80)));
             continue;
           }
           if (o.find_first_of("\n\r") != std::string::npos) {
             c.error("slurm.extra_sbatch", "item contains a line break");
             continue;
           }
           std::string opt = o.substr(0, o.find_first_of("= "));
           if (opt.size() > 2 && opt[1] != '-') opt = opt.substr(0, 2);  // -N4 -> -N
           for (const auto& [name, key] : managed_sbatch_options())
             if (opt == name)
               c.error("slurm.extra_sbatch",
                       fmt::format("item '{}' sets {}, which ringmaster renders from {}",
                                   o.substr(0, 80), name, key));
         }
       }},
      {{"restart.backoff_s, restart.backoff_max_s", "backoff_s <= backoff_max_s."},
       [](Ctx& c) {
         if (c.s.restart.backoff_s > c.s.restart.backoff_max_s)
           c.error("restart.backoff_max_s",
                   fmt::format("restart.backoff_max_s ({:g}) is below restart.backoff_s ({:g})",
                               c.s.restart.backoff_max_s, c.s.restart.backoff_s));
       }},

      // ---- Limits of this build's runtime: what ringd and ring-worker refuse (or would get
      // wrong) at run time, refused here first so that `ringctl validate` and `plan` never pass
      // a spec that `run` or `submit` then refuses. Each names the code that sets the limit.
      {{"resources.backend, model.head_dim",
        "backend cuda: head_dim <= 128 (the CUDA attention kernel's tile).", RuleScope::kRuntime},
       [](Ctx& c) {
         const auto& m = c.s.model;
         int64_t hd = m.head_dim ? *m.head_dim : (m.heads ? m.d_model / m.heads : 0);
         if (c.s.resources.backend == Backend::kCuda && hd > 128)
           c.error(m.head_dim ? "model.head_dim" : "model.d_model",
                   fmt::format("not supported by this build: head_dim {} with backend cuda (the "
                               "CUDA attention kernel takes head_dim <= 128)",
                               hd));
       }},
      {{"optimizer.offload",
        "offload cpu: ringd owns the optimizer (offload none is for "
        "ring-worker alone).",
        RuleScope::kRingd},
       [](Ctx& c) {
         if (c.s.optimizer.offload != Offload::kCpu)
           c.error("optimizer.offload",
                   "offload none is not run by ringd (ringctl run/submit): ringd keeps the "
                   "optimizer in host memory; use offload: cpu (offload none is for "
                   "`ring-worker --spec` alone)");
       }},
      {{"model.*, optimizer.offload",
        "offload cpu: every gradient bucket (one transformer block, or the embedding) below "
        "2^32 floats (ringd's optimizer indexes a bucket with 32 bits).",
        RuleScope::kRingd},
       [](Ctx& c) {
         if (c.s.optimizer.offload != Offload::kCpu) return;
         const auto f = resolved_layout(c.s);
         constexpr int64_t kMax = (int64_t{1} << 32) - 1;
         if (f.largest_bucket > kMax)
           c.error("model.d_model",
                   fmt::format("not supported by this build: gradient bucket {} has {} floats; "
                               "ringd's optimizer takes at most 2^32-1 = {} per bucket",
                               f.largest_bucket_name, f.largest_bucket, kMax));
       }},
  };
  return r;
}

std::string md_cell(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '|') out += '\\';
    out += c;
  }
  return out;
}

// A rule about training alone (the sequence length, the data stream, the steps, the
// optimizer): a generate job ignores those keys, so their rules are not checked for it.
bool training_only(const RuleDoc& d) {
  for (const char* p : {"data.seq_len", "data.min_doc_len", "data.source, data.paths",
                        "data.source, data.seq_len", "optimizer.", "train.", "model.*, optimizer"})
    if (d.keys.rfind(p, 0) == 0) return true;
  return false;
}

}  // namespace

bool valid_job_name(std::string_view n) {
  if (n.empty() || n.size() > 64 || !std::isalnum(static_cast<unsigned char>(n[0]))) return false;
  return std::all_of(n.begin(), n.end(), [](unsigned char c) {
    return std::isalnum(c) || c == '.' || c == '_' || c == '-';
  });
}

std::vector<Diagnostic> validate_spec(const JobSpec& spec, const SourceMap& source,
                                      const LoadOptions& options) {
  std::vector<Diagnostic> out;
  Ctx c{spec, source, out, options};
  for (const auto& r : rules()) {
    if (r.doc.scope == RuleScope::kRingd && !options.ringd_job) continue;
    if (spec.job.kind == JobKind::kGenerate && training_only(r.doc)) continue;
    c.scope = r.doc.scope;
    r.check(c);
  }
  return out;
}

const std::vector<RuleDoc>& cross_field_rules() {
  static const std::vector<RuleDoc> docs = [] {
    std::vector<RuleDoc> d;
    for (const auto& r : rules()) d.push_back(r.doc);
    return d;
  }();
  return docs;
}

void resolve_spec(JobSpec& s) {
  auto& m = s.model;
  s.resolved.kv_heads = m.kv_heads.value_or(m.heads);
  s.resolved.head_dim = m.head_dim.value_or(m.heads ? m.d_model / m.heads : 0);
  if (m.mlp_hidden) {
    s.resolved.mlp_hidden = *m.mlp_hidden;
  } else if (m.mlp == MlpKind::kSwiGLU) {
    int64_t h = (8 * m.d_model + 2) / 3;
    s.resolved.mlp_hidden = (h + 63) / 64 * 64;
  } else {
    s.resolved.mlp_hidden = 4 * m.d_model;
  }
  s.resolved.total_workers = s.resources.nodes * s.resources.workers_per_node;
}

std::string spec_reference_markdown() {
  std::string o =
      "# Job spec reference\n\n"
      "<!-- Generated from common/spec/keys.cc and common/spec/validate.cc by ring-spec-doc;\n"
      "     do not edit by hand. Regenerate: cmake --build build --target spec-doc -->\n\n"
      "A job spec is one YAML document: a mapping of sections to mappings of keys. Unknown "
      "keys (with a did-you-mean suggestion), duplicate keys and values of the wrong type or "
      "out of range are errors; `ringctl validate FILE...` prints every error as "
      "`file:line:column: error: key.path: message` and exits 1.\n\n"
      "Ranges are inclusive unless written with a parenthesis. Integers are decimal; an exact "
      "integer in exponent form (`1e6`) is accepted. Booleans are `true` or `false`. A quoted "
      "value is a string, never a number. A list of strings also accepts a single string.\n\n"
      "`ringctl validate`, `plan`, `run` and `submit` take `--set SECTION.KEY=VALUE` "
      "(repeatable): the key as if the file said `KEY: VALUE`, VALUE written in YAML (`5`, "
      "`true`, `[0, 1]`, `'text'`), checked by the same table and rules; a message about an "
      "overridden key ends with the override. `ringctl init --template NAME` writes a commented "
      "starting spec (one of configs/examples).\n\n";
  for (const auto& [sec, desc] : spec_sections()) {
    o += "## " + sec + "\n\n" + desc + "\n\n";
    o += "| key | type | default | allowed | description |\n|---|---|---|---|---|\n";
    for (const auto& k : spec_keys()) {
      if (k.section() != sec) continue;
      std::string range = range_text(k);
      o += fmt::format("| `{}` | {} | {} | {} | {} |\n", k.path, to_string(k.type),
                       md_cell(default_text(k)), md_cell(range.empty() ? "any" : range),
                       md_cell(k.description));
    }
    o += "\n";
  }
  o += "## Rules across keys\n\nChecked once every key has parsed cleanly.\n\n"
       "| keys | rule |\n|---|---|\n";
  for (const auto& r : cross_field_rules())
    if (r.scope == RuleScope::kSpec)
      o += fmt::format("| {} | {} |\n", md_cell(r.keys), md_cell(r.rule));
  o += "\n## Limits of this build\n\n"
       "What ringd and ring-worker cannot run yet. They are errors, so that `ringctl validate` "
       "and `ringctl plan` never pass a spec that `ringctl run` or `ringctl submit` would "
       "refuse; `ringctl plan --what-if` (and `validate --what-if`) reports them as warnings "
       "to size a design this build cannot run. Rules marked *ringd* apply to jobs run by ringd "
       "(everything ringctl checks), not to `ring-worker --spec` alone.\n\n"
       "| keys | limit |\n|---|---|\n";
  for (const auto& r : cross_field_rules())
    if (r.scope != RuleScope::kSpec)
      o += fmt::format("| {} | {}{} |\n", md_cell(r.keys),
                       r.scope == RuleScope::kRingd ? "*ringd*: " : "", md_cell(r.rule));
  return o;
}

std::vector<std::string> missing_data_paths(const JobSpec& spec) {
  std::vector<std::string> out;
  const DataSection& d = spec.data;
  if (d.source == DataSource::kPasskey) return out;
  for (size_t i = 0; i < d.paths.size(); ++i) {
    const std::string& p = d.paths[i];
    if (p.empty()) continue;
    std::error_code ec;
    if (d.source == DataSource::kTokens) {
      std::string prefix = p;
      if (prefix.size() > 4 && (prefix.ends_with(".bin") || prefix.ends_with(".idx")))
        prefix.resize(prefix.size() - 4);
      for (const char* ext : {".bin", ".idx"})
        if (!std::filesystem::is_regular_file(prefix + ext, ec))
          out.push_back(fmt::format("data.paths[{}] {}: {}{} does not exist", i, p, prefix, ext));
    } else if (!std::filesystem::exists(p, ec)) {
      out.push_back(fmt::format("data.paths[{}] {}: does not exist", i, p));
    }
  }
  return out;
}

}  // namespace ring::spec
