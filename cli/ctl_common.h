// What the ringctl subcommands that talk to ring-coord share: the subcommand registration
// pattern, exit codes, the coordinator connection flags, error reporting that says what to do,
// and plain-text formatting (tables, ages, rates) that stays shell friendly.
//
//   Subcommand s = add_status(app);   // registers `status` with its flags
//   ... app.parse(argc, argv) ...
//   if (*s.app) return s.run();        // runs it; typed errors become exit codes
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include <CLI/CLI.hpp>

#include "cli/exit_codes.h"
#include "common/cli/cli11_flags.h"
#include "common/protocol/protocol.h"
#include "common/spec/parse.h"
#include "common/spec/spec.h"
#include "coordinator/client.h"

namespace ring::cli {

struct Subcommand {
  CLI::App* app = nullptr;
  std::function<int()> run;
};

// How to reach ring-coord: --coord (else $RING_COORD, else the default ipc endpoint), the
// request timeout, and for tcp:// the CURVE keys (--server-key: the coordinator's server.pub;
// --client-key: a key file "public <z85>\nsecret <z85>"; or $RING_COORD_SERVER_KEY and
// $RING_COORD_CLIENT_KEY).
struct CoordFlags {
  std::string endpoint;
  double timeout_s = 5;
  std::string server_key_file;
  std::string client_key_file;

  void add_to(CLI::App* app);
  // The endpoint after --coord / $RING_COORD / the default.
  std::string resolved_endpoint() const;
  coord::ClientOptions client_options() const;
};

// --set KEY=VALUE (repeatable) of validate, plan, run and submit: overrides applied to the spec
// before it is checked (common/spec/parse.h, Override). The flag checks the KEY=VALUE form; the
// key table and the rules judge KEY and VALUE when the spec loads.
struct SetFlags {
  std::vector<std::string> args;

  void add_to(CLI::App* app);
  std::vector<spec::Override> overrides() const;
};

// Writes `text` to `path` with exactly `mode` (a temp name beside it, then rename; never through a
// symbolic link). Throws std::runtime_error naming the file and the reason.
void write_file_as(const std::filesystem::path& path, const std::string& text, mode_t mode);

// Runs `body`, turning typed errors into a message on stderr and an exit code:
// ConnectError/TimeoutError -> kExitNoCoord (with what to do), RemoteError not_found ->
// kExitNotFound, permission_denied -> kExitDenied, invalid_state -> kExitInvalidState, others ->
// kExitFailed.
int guarded(const std::string& endpoint, const std::function<int()>& body);

// Stdout is a terminal and NO_COLOR is not set.
bool stdout_is_tty();
bool use_color();
// ANSI colour around text when use_color(), else the text.
std::string paint(const std::string& text, const char* ansi);
std::string state_color(const std::string& state);  // the state, painted by meaning

// Text from the coordinator (job names, reasons, event data, node names: other users and their
// daemons choose them) made safe for a terminal: control bytes (ESC, BEL, CR, newlines, DEL and
// the C1 controls U+0080..U+009F) become visible \xHH escapes, so no one can move the cursor,
// retitle the window or forge a line in someone else's `ringctl status`.
std::string printable(std::string_view s);

// "42s", "3m05s", "2h07m", "3d04h".
std::string format_duration(double seconds);
// "812", "12.3k", "4.56M".
std::string format_rate(double per_s);
// Local time "2026-11-29 14:03:07".
std::string format_time(double unix_s);
double now_unix();

// A plain table: columns padded to their widest cell, two spaces apart, no trailing blanks.
// Numbers are right-aligned for columns listed in `right`.
std::string format_table(const std::vector<std::string>& header,
                         const std::vector<std::vector<std::string>>& rows,
                         const std::vector<size_t>& right = {});

// Parses a job id argument ("7"); throws CLI::ValidationError naming the argument.
int64_t parse_job_id(const std::string& text);

// The job directory of `run` and `submit`: `given` (--job-dir) prepared and checked
// (common/cli/job_dir.h), refused with jobdir::JobDirError naming the holder when another job
// holds it (files/dir_lock.h); without --job-dir the default one of `name`, or, when a job holds
// that, the first free `<default>-2`, `-3`, ..., said on `note`.
std::string choose_job_dir(const std::string& given, const std::string& name, std::ostream& note);

// A job.kind generate spec's inputs as ringd's workers will open them (a relative path from the
// current directory, where ringd runs): "" when generate.checkpoint is a directory and every
// prompt a readable file, else what is wrong, naming the key and the path.
std::string generate_inputs_problem(const spec::JobSpec& s);

// A job.kind generate spec's relative generate.checkpoint and generate.prompts, made absolute
// from the current directory, appended to `overrides` (as --set would), so that the spec ring-coord
// records names them wherever ringd runs (the batch job of `submit` runs in the job directory).
// True when any was added.
bool absolute_generate_paths(const spec::JobSpec& s, std::vector<spec::Override>* overrides);

// Numeric flags and --coord use the rules every program shares (common/cli/cli11_flags.h:
// flags::seconds_in, flags::integer_in, flags::endpoint_rule).
// --name of run/submit: the job.name rule (common/spec: 1-64 of [A-Za-z0-9._-]).
CLI::Validator job_name_rule();

// The closest of `candidates` to `word` (edit distance at most 1 + size/3), or "".
std::string closest(const std::string& word, const std::vector<std::string>& candidates);

// Sleeps up to `seconds`, returning early (false) when SIGINT/SIGTERM arrived since
// install_stop_signals(). For --follow loops.
void install_stop_signals();
bool stop_requested();
bool sleep_unless_stopped(double seconds);

// JSON of a job as the coordinator reports it (the protocol's job_info object).
nlohmann::json job_json(const protocol::JobInfo& j);

}  // namespace ring::cli
