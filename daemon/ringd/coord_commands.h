// What ring-coord's messages ask of the attempt: a command (stop, roll_back, checkpoint_now), the
// job's state in a `registered` answer, an error reply, each turned into an attempt::Event for
// attempt::next (or refused at once: a command for another job). Pure: no I/O, no link.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "common/protocol/protocol.h"
#include "daemon/ringd/attempt.h"

namespace ring::ringd {

struct CoordInput {
  std::optional<attempt::Event> event;  // for attempt::next
  std::optional<std::string> refusal;   // acknowledge `command_id` with ok false, this reason
  std::string note;                     // ringd's log line about it ("" for none)
  std::optional<nlohmann::json> report; // a command: the fields of ringd's "command" event
  int64_t command_id = 0;               // a command: its id (the ack's)
};

// `job`: the job this ringd serves; `state`: the attempt's state now; `has_checkpointer`:
// checkpoint.dir is set (checkpoint_now is refused otherwise).
CoordInput interpret(const protocol::Message& m, int64_t job, const attempt::State& state,
                     bool has_checkpointer);

}  // namespace ring::ringd
