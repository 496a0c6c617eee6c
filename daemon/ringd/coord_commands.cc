#include "daemon/ringd/coord_commands.h"

#include <variant>

#include <fmt/format.h>

namespace ring::ringd {

namespace {

CoordInput command(const protocol::Command& c, int64_t job, bool has_checkpointer) {
  CoordInput in;
  in.command_id = c.id;
  const char* kind = protocol::to_string(c.command);
  if (c.job != job) {
    in.refusal = fmt::format("this ringd serves job {}, not {}", job, c.job);
    return in;
  }
  in.note = fmt::format("ring-coord: {} (attempt {}, step {}): {}", kind, c.attempt, c.step,
                        c.reason);
  in.report = nlohmann::json{{"command", kind}, {"id", c.id}, {"reason", c.reason}};
  attempt::Event e;
  e.text = c.reason;
  e.has_checkpointer = has_checkpointer;
  switch (c.command) {
    case protocol::CommandKind::kCheckpointNow:
      e.kind = attempt::EventKind::kCoordCheckpointNow;
      break;
    case protocol::CommandKind::kStop:
      e.kind = attempt::EventKind::kCoordStop;
      break;
    case protocol::CommandKind::kRollBack:
      e.kind = attempt::EventKind::kCoordRollBack;
      e.attempt = c.attempt;
      e.step = c.step;
      break;
  }
  in.event = e;
  return in;
}

}  // namespace

CoordInput interpret(const protocol::Message& m, int64_t job, const attempt::State& state,
                     bool has_checkpointer) {
  if (const auto* c = std::get_if<protocol::Command>(&m)) return command(*c, job, has_checkpointer);
  CoordInput in;
  if (const auto* r = std::get_if<protocol::Registered>(&m)) {
    // The job's state, asked for after the coordinator's stop; otherwise a re-registration.
    if (state.await != attempt::Await::kState) return in;
    for (const protocol::Assignment& a : r->jobs)
      if (a.job == job) {
        in.note = "ring-coord: the job is " + a.state;
        attempt::Event e;
        e.kind = attempt::EventKind::kCoordState;
        e.text = a.state;
        in.event = e;
        return in;
      }
  } else if (const auto* e = std::get_if<protocol::ErrorReply>(&m)) {
    in.note = fmt::format("ring-coord: {} ({}{}{})", e->message, e->code,
                          e->field.empty() ? "" : ", ", e->field);
  }
  return in;
}

}  // namespace ring::ringd
