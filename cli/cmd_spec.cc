// The subcommands that work on a spec alone, without a coordinator:
//
//   ringctl validate FILE... [--json] [--set K=V]...   every error: file:line:col, key, rule
//   ringctl plan FILE [--json] [--check] [--set K=V]... memory, communication and fit
//   ringctl plan --search FILE [--nodes N] [--gpu T] [--topology S] [--write OUT] the fastest
//                 layout that fits (cli/plan_search.h, sim/search.h)
//   ringctl init [--template NAME] [-o FILE] [--force] a commented starting spec
//
// validate and plan check a spec as run and submit do: every rule, this build's limits as errors,
// `--what-if` making them warnings; `-` reads standard input, only when given.
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <iostream>

#include "cli/commands.h"
#include "cli/plan_search.h"
#include "cli/templates.h"
#include "common/plan/plan.h"

namespace ring::cli {

namespace {

void print_diagnostics(const spec::LoadResult& r, bool color) {
  using Severity = spec::Diagnostic::Severity;
  for (const auto& d : r.diagnostics) {
    std::string s = d.str();
    if (color) {
      const char* c = d.severity == Severity::kError ? "\033[31m" : "\033[33m";
      auto pos = s.find(d.severity == Severity::kError ? ": error:" : ": warning:");
      if (pos != std::string::npos) s = s.substr(0, pos + 2) + c + s.substr(pos + 2);
      auto end = s.find(':', pos + 2 + 5);
      if (end != std::string::npos) s.insert(end, "\033[0m");
    }
    std::cerr << s << "\n";
  }
}

bool stderr_color() {
  const char* nc = std::getenv("NO_COLOR");
  return isatty(STDERR_FILENO) && !(nc && *nc);
}

// What ringctl checks a spec with: every rule (ringd's included); with --what-if the limits of
// this build are warnings, to size a design it cannot run yet.
spec::LoadOptions load_options(bool what_if, const SetFlags& set) {
  auto o = spec::job_spec_options();
  o.allow_stdin = true;
  o.runtime_limits_are_errors = !what_if;
  o.overrides = set.overrides();
  return o;
}

// One diagnostic for validate --json: where, which key, which rule.
nlohmann::json diagnostic_json(const spec::Diagnostic& d) {
  auto opt = [](int v) { return v > 0 ? nlohmann::json(v) : nlohmann::json(nullptr); };
  return {{"file", d.file},
          {"line", opt(d.where.line)},
          {"column", opt(d.where.column)},
          {"key", d.key},
          {"rule", d.message}};
}

struct ValidateOpts {
  std::vector<std::string> files;
  bool quiet = false;
  bool what_if = false;
  bool json = false;
  SetFlags set;
};

int run_validate(const ValidateOpts& o) {
  int stdin_uses = 0;
  for (const auto& f : o.files) stdin_uses += f == "-";
  if (stdin_uses > 1) {
    std::cerr << "ringctl validate: '-' (standard input) may be given once\n";
    return kExitUsage;
  }
  const bool color = stderr_color();
  int bad = 0;
  nlohmann::json files = nlohmann::json::array();
  for (const auto& f : o.files) {
    auto r = spec::load_spec_file(f, load_options(o.what_if, o.set));
    const std::string shown = f == "-" ? "<stdin>" : f;
    bad += !r.ok();
    if (o.json) {
      nlohmann::json errors = nlohmann::json::array(), warnings = nlohmann::json::array();
      for (const auto& d : r.diagnostics)
        (d.severity == spec::Diagnostic::Severity::kError ? errors : warnings)
            .push_back(diagnostic_json(d));
      nlohmann::json one{
          {"file", shown}, {"ok", r.ok()}, {"errors", errors}, {"warnings", warnings}};
      if (r.ok())
        one["job"] = {{"name", r.spec->job.name},
                      {"layers", r.spec->model.layers},
                      {"d_model", r.spec->model.d_model},
                      {"seq_len", r.spec->data.seq_len},
                      {"workers", r.spec->resolved.total_workers}};
      files.push_back(std::move(one));
      continue;
    }
    print_diagnostics(r, color);
    if (!r.ok()) {
      std::cerr << shown << ": " << r.error_count() << " error(s)\n";
    } else if (!o.quiet) {
      if (r.spec->job.kind == spec::JobKind::kGenerate)
        std::cout << shown << ": ok (" << r.spec->job.name << ": generate, " << r.spec->model.layers
                  << " layers, d_model " << r.spec->model.d_model << ", "
                  << r.spec->generate.prompts.size() << " prompt(s), "
                  << r.spec->resolved.total_workers << " ranks)\n";
      else
        std::cout << shown << ": ok (" << r.spec->job.name << ": " << r.spec->model.layers
                  << " layers, d_model " << r.spec->model.d_model << ", seq_len "
                  << r.spec->data.seq_len << ", " << r.spec->resolved.total_workers
                  << " workers)\n";
    }
  }
  if (o.json) {
    std::cout << nlohmann::json{{"ok", bad == 0},
                                {"valid", o.files.size() - bad},
                                {"invalid", bad},
                                {"overrides", o.set.args},
                                {"files", files}}
                     .dump(2)
              << "\n";
  } else if (o.files.size() > 1 && !o.quiet) {
    std::cout << o.files.size() - bad << " valid, " << bad << " invalid\n";
  }
  return bad ? kExitFailed : kExitOk;
}

struct PlanOpts {
  std::string file;
  bool json = false;
  bool check = false;
  bool what_if = false;
  SetFlags set;
  bool search = false;
  PlanSearchOpts search_opts;  // --search's own flags (cluster, --write, ...)
};

int run_plan(PlanOpts o) {
  if (o.search) {
    if (o.check) {
      std::cerr << "ringctl plan: --check and --search: the search keeps only layouts that fit; "
                   "check the written spec with `ringctl plan --check FILE`\n";
      return kExitUsage;
    }
    o.search_opts.file = o.file;
    o.search_opts.json = o.json;
    o.search_opts.what_if = o.what_if;
    o.search_opts.set = o.set;
    return run_plan_search(o.search_opts);
  }
  const auto& so = o.search_opts;
  const PlanSearchOpts defaults;
  const ClusterFlags cd;
  for (const auto& [used, flag] : std::vector<std::pair<bool, const char*>>{
           {so.nodes != 0, "--nodes"},
           {so.cluster.gpu != cd.gpu, "--gpu"},
           {so.cluster.topology != cd.topology, "--topology"},
           {!so.cluster.calibration.empty(), "--calibration"},
           {so.cluster.node_bw_gb != cd.node_bw_gb, "--node-bw"},
           {!so.write.empty(), "--write"},
           {so.top != defaults.top, "--top"},
           {so.simulate_top != defaults.simulate_top, "--simulate-top"},
           {so.max_micro_batches != defaults.max_micro_batches, "--max-micro-batches"},
           {so.sequences != defaults.sequences, "--sequences"},
           {so.exhaustive, "--exhaustive"},
           {so.expand != defaults.expand, "--expand"}})
    if (used) {
      std::cerr << "ringctl plan: " << flag << " is a flag of --search (ringctl plan --search FILE "
                << flag << " ...)\n";
      return kExitUsage;
    }
  auto r = spec::load_spec_file(o.file, load_options(o.what_if, o.set));
  print_diagnostics(r, stderr_color());
  if (!r.ok()) {
    std::cerr << o.file << ": " << r.error_count() << " error(s); fix them before planning"
              << " (`--what-if` plans a design that only breaks this build's limits)\n";
    return kExitFailed;
  }
  if (o.what_if && !r.diagnostics.empty())
    std::cerr << o.file
              << ": planned with --what-if: any 'not supported by this build' above is a "
                 "spec that `ringctl run` and `submit` refuse\n";
  if (r.spec->job.kind == spec::JobKind::kGenerate) {
    std::cerr << o.file
              << ": job.kind is generate: ringctl plan sizes training (weights, gradients, "
                 "optimizer state, activations); a generate job holds the model and its KV "
                 "cache on each rank (docs/generation.md)\n";
    return kExitFailed;
  }
  auto p = plan::make_plan(*r.spec);
  if (o.json)
    std::cout << plan::to_json(p, *r.spec).dump(2) << "\n";
  else
    std::cout << plan::to_text(p, *r.spec);
  return o.check && !p.fits() ? kExitNoFit : kExitOk;
}

struct InitOpts {
  std::string name;
  std::string output = "-";
  bool force = false;
};

std::vector<std::string> template_names() {
  std::vector<std::string> names;
  for (const auto& t : spec_templates()) names.push_back(t.name);
  return names;
}

// Writes the template to -o FILE: a new file, or with --force over a regular file (never through a
// symbolic link, never onto a directory or device).
int write_template(const InitOpts& o, const std::string& text) {
  struct stat st {};
  if (::lstat(o.output.c_str(), &st) == 0) {
    if (!o.force) {
      std::cerr << "ringctl init: " << o.output
                << " exists; choose another -o FILE, or --force to overwrite it\n";
      return kExitFailed;
    }
    if (!S_ISREG(st.st_mode)) {
      std::cerr << "ringctl init: " << o.output
                << " is not a regular file (a link, directory or device); --force overwrites "
                   "regular files only\n";
      return kExitFailed;
    }
  }
  const mode_t umask_now = ::umask(0);
  ::umask(umask_now);
  try {
    write_file_as(o.output, text, 0666 & ~umask_now);
  } catch (const std::exception& e) {
    std::cerr << "ringctl init: " << e.what() << "\n";
    return kExitFailed;
  }
  return kExitOk;
}

int run_init(const InitOpts& o) {
  const SpecTemplate* t = nullptr;
  for (const auto& c : spec_templates())
    if (c.name == o.name) t = &c;
  if (!t) {  // the flag's rule names it first; this keeps the lookup honest
    std::cerr << "ringctl init: unknown template '" << printable(o.name) << "'\n";
    return kExitUsage;
  }
  std::string text = "# A starting spec from `ringctl init --template " + t->name + "` (" +
                     t->source +
                     ").\n# Every key, its default and its range: docs/spec-reference.md. Check "
                     "an edit with `ringctl validate FILE`;\n# try a value without editing with "
                     "`--set SECTION.KEY=VALUE` (validate, plan, run, submit).\n" +
                     t->text;
  if (o.output == "-") {
    std::cout << text << std::flush;
    return kExitOk;
  }
  if (int rc = write_template(o, text); rc != kExitOk) return rc;
  std::cerr << "wrote " << o.output << " (template " << t->name << "); next: ringctl validate "
            << o.output << (t->name == "llama7b-1m" ? " --what-if" : "") << "\n";
  return kExitOk;
}

}  // namespace

Subcommand add_validate(CLI::App& app) {
  auto o = std::make_shared<ValidateOpts>();
  auto* s = app.add_subcommand(
      "validate", "Check job specs: print every error (file:line:col, key, rule); exit 1 if any");
  s->add_option("files", o->files, "Spec files (YAML, regular files); - reads standard input")
      ->required();
  s->add_flag("-q,--quiet", o->quiet, "Print errors only");
  s->add_flag("--what-if", o->what_if,
              "Report what this build cannot run (bf16, ...) as warnings");
  s->add_flag("--json", o->json,
              "Machine-readable result on stdout: ok, and per file its errors and warnings "
              "(file, line, column, key, rule)");
  o->set.add_to(s);
  return {s, [o] { return run_validate(*o); }};
}

Subcommand add_plan(CLI::App& app) {
  auto o = std::make_shared<PlanOpts>();
  auto* s = app.add_subcommand(
      "plan", "Memory per worker and node, communication per step, and fit, from the spec");
  s->add_option("file", o->file, "Spec file (YAML, a regular file); - reads standard input")
      ->required();
  s->add_flag("--json", o->json, "Machine-readable output");
  s->add_flag("--check", o->check,
              "Exit " + std::to_string(kExitNoFit) + " when the job does not fit its resources");
  s->add_flag("--what-if", o->what_if,
              "Plan a design this build cannot run yet (bf16, ...): its limits "
              "become warnings");
  o->set.add_to(s);
  auto& so = o->search_opts;
  s->add_flag("--search", o->search,
              "Find the fastest layout that fits: head ranks x ring, data replicas, "
              "micro-batches, shard mode, recompute, top-k or dense; prints the best five "
              "(simulated, as ringctl simulate; docs/planning.md, \"Layout search\")");
  s->add_option("--nodes", so.nodes, "--search: nodes of the cluster (default: resources.nodes)")
      ->type_name("N")
      ->check(flags::integer_in(1, 1000000));
  so.cluster.add_to(s, false);
  s->add_option("--write", so.write,
                "--search: write the best layout's spec to FILE (this spec with the changed "
                "keys, checked to validate)")
      ->type_name("FILE");
  s->add_option("--top", so.top, "--search: layouts printed")
      ->capture_default_str()
      ->check(flags::integer_in(1, 1000));
  s->add_option("--simulate-top", so.simulate_top,
                "--search: families of layouts simulated as ringctl simulate would, after the "
                "shallow screen")
      ->capture_default_str()
      ->check(flags::integer_in(1, 100000));
  s->add_option("--max-micro-batches", so.max_micro_batches,
                "--search: micro-batches tried: 1, 2, 4, ... up to N")
      ->capture_default_str()
      ->check(flags::integer_in(1, 1024));
  s->add_option("--sequences", so.sequences,
                "--search: keep data_replicas x micro_batches (sequences per step) at N")
      ->type_name("N")
      ->check(flags::integer_in(1, 1000000));
  s->add_option("--expand", so.expand,
                "--search: the simulations' expansion, as ringctl simulate --expand (auto, full, "
                "reduced)")
      ->capture_default_str()
      ->check(choice_of({"auto", "full", "reduced"}, "expansion"));
  s->add_flag("--exhaustive", so.exhaustive,
              "--search: simulate every layout that fits (no screen; slow on large clusters)");
  return {s, [o] { return run_plan(*o); }};
}

Subcommand add_init(CLI::App& app) {
  auto o = std::make_shared<InitOpts>();
  o->name = spec_templates().front().name;
  std::string list;
  for (const auto& t : spec_templates()) list += "\n  " + t.name + ": " + t.description;
  auto* s = app.add_subcommand("init", "Write a commented starting spec (a template)");
  s->footer("Templates:" + list + "\n");
  s->add_option("-t,--template", o->name, "The template (listed below)")
      ->type_name("NAME")
      ->capture_default_str()
      ->check(CLI::Validator(
          [](std::string& v) -> std::string {
            auto names = template_names();
            if (std::find(names.begin(), names.end(), v) != names.end()) return "";
            auto c = closest(v, names);
            std::string all;
            for (const auto& n : names) all += (all.empty() ? "" : ", ") + n;
            return "unknown template '" + printable(v) + "'" +
                   (c.empty() ? "" : "; did you mean '" + c + "'?") + " (templates: " + all + ")";
          },
          "", "TEMPLATE"));
  s->add_option("-o,--output", o->output, "Write to FILE (- or none: standard output)")
      ->type_name("FILE");
  s->add_flag("--force", o->force, "Overwrite FILE if it exists (a regular file only)");
  return {s, [o] { return run_init(*o); }};
}

}  // namespace ring::cli
