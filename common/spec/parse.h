// Parsing and validation of job specs.
//
//   auto r = ring::spec::load_spec_file("configs/examples/tiny.yaml");
//   for (const auto& d : r.diagnostics) std::cerr << d.str() << "\n";
//   if (r.ok()) use(*r.spec);
//
// Parsing never throws and never aborts on bad input: every problem becomes a Diagnostic naming
// file:line:column, the key path, the value and the rule broken. All problems are reported, not
// just the first.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/spec/spec.h"

namespace ring::spec {

struct Location {
  int line = 0;    // 1-based; 0 when unknown
  int column = 0;  // 1-based; 0 when unknown
};

struct Diagnostic {
  enum class Severity { kError, kWarning };
  Severity severity = Severity::kError;
  std::string file;
  Location where;
  std::string key;  // key path ("model.heads"); empty for file-level problems
  std::string message;

  // "file:line:col: error: model.heads: ..." (the format `ringctl validate` prints).
  std::string str() const;
};

// Where each key that appeared in the file was written (its value's position).
struct SourceMap {
  std::string file;
  std::map<std::string, Location> keys;
  std::map<std::string, Location> sections;
  // Keys a --set override gave, with the override as written ("train.steps=5"): they have no
  // position in the file, and their diagnostics name the override instead.
  std::map<std::string, std::string> overrides;
  Location at(const std::string& key) const;
};

// One `--set KEY=VALUE` of ringctl validate/plan/run/submit: KEY a key path of the table
// ("train.steps"), VALUE YAML as it would be written after "KEY:" in the file ("5", "true",
// "[0, 1]", "'text'"). Applied to the parsed file before any check, so the key table and every
// rule judge it like a key of the file.
struct Override {
  std::string key;
  std::string value;
  std::string arg() const { return key + "=" + value; }
};
// Splits "KEY=VALUE" at the first '='; nullopt when there is no '=' or no KEY.
std::optional<Override> parse_override(std::string_view arg);

struct LoadResult {
  std::optional<JobSpec> spec;  // set when there are no errors (warnings allowed)
  // The text that was parsed (empty when the file could not be read): what a caller submits,
  // so that it is exactly what was validated, without opening the file again. With overrides,
  // the spec they made: the file's YAML with the overrides applied, under a comment that lists
  // them (the file's own comments are not kept); it reads back to the same spec.
  std::string text;
  std::vector<Diagnostic> diagnostics;
  SourceMap source;
  bool ok() const { return spec.has_value(); }
  size_t error_count() const;
};

// Specs larger than this are refused before parsing (a spec is a few kilobytes).
inline constexpr size_t kMaxSpecBytes = 1 << 20;

// Which rules apply beyond the spec's own (validate.cc has one table with a scope per rule).
struct LoadOptions {
  // The limits of this build's runtime (model.dtype fp32, one data replica, the 32-bit lazy
  // index, ...): errors by default, so that nothing validates that ringd or ring-worker would
  // refuse; warnings when a design is only planned (`ringctl plan --what-if`).
  bool runtime_limits_are_errors = true;
  // The rules of a job that ringd runs (`ringctl validate`, `plan`, `run`, `submit`):
  // optimizer.offload cpu. ring-worker's standalone modes (in-process AdamW) leave them out.
  bool ringd_job = false;
  // load_spec_file("-") reads standard input (`ringctl validate -`); otherwise "-" is a file name.
  bool allow_stdin = false;
  // --set overrides, applied in order (a later one for the same key wins).
  std::vector<Override> overrides;
};

// What ringctl checks a job spec with: every rule, runtime limits as errors.
inline LoadOptions job_spec_options() {
  LoadOptions o;
  o.ringd_job = true;
  return o;
}

// Parses, checks every key against the table, runs the cross-field rules and resolves derived
// values. `name` is used in diagnostics.
LoadResult load_spec_string(std::string_view text, const std::string& name,
                            const LoadOptions& options = {});
// Reads a regular file (or standard input for "-" when options.allow_stdin) and loads it. Anything
// else (a directory, FIFO, socket, device such as /dev/zero) is an error naming the file and its
// type, found without opening it, so a named pipe with no writer cannot hang the caller.
LoadResult load_spec_file(const std::string& path, const LoadOptions& options = {});

// Cross-field rules only (used by load_*; exposed for tests and for specs built in code).
std::vector<Diagnostic> validate_spec(const JobSpec& spec, const SourceMap& source,
                                      const LoadOptions& options = {});
// Fills spec.resolved from the optional keys; call on a valid spec.
void resolve_spec(JobSpec& spec);

// The data.paths entries that are not on this machine, each "data.paths[i] <path>: <why>" (a
// tokens dataset needs <prefix>.bin and <prefix>.idx). `ringctl validate` warns (the paths
// may exist only on the cluster's nodes); `ringctl run` and ringd, on the node itself, refuse
// to start: a worker would fail on them at every restart.
std::vector<std::string> missing_data_paths(const JobSpec& spec);

// One cross-field rule as documented in docs/spec-reference.md.
enum class RuleScope {
  kSpec,     // the spec contradicts itself
  kRuntime,  // this build's runtime (ringd, ring-worker) cannot run it
  kRingd,    // a job run by ringd (ringctl run/submit) cannot have it; ring-worker alone can
};
struct RuleDoc {
  std::string keys;
  std::string rule;
  RuleScope scope = RuleScope::kSpec;
};
const std::vector<RuleDoc>& cross_field_rules();

// The job.name rule: 1-64 characters from [A-Za-z0-9._-], starting with a letter or digit (it
// names a directory and appears in other users' `ringctl status`). Also for `--name`.
bool valid_job_name(std::string_view name);

// Closest key path to a misspelt one ("model.d_modle" -> "model.d_model"); empty if none is near.
std::string suggest_key(std::string_view section, std::string_view name);

// Markdown reference generated from the key table and the rules (docs/spec-reference.md).
std::string spec_reference_markdown();

}  // namespace ring::spec
