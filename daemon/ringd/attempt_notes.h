// The words of the attempt's transitions: the log line and the event each attempt::Note says
// (attempt.h decides which note; the Daemon writes what this returns). Pure: the texts are tested
// here and grepped by the integration tests, so they change only on purpose.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "daemon/ringd/attempt.h"

namespace ring::ringd {

struct NoteFacts {
  int last_signal = 0;        // the stop signal that arrived last
  int64_t done_step = 0;      // the last completed step
  int64_t max_restarts = 0;   // the spec's restart.max_restarts
  int64_t restarts = 0;       // restarts so far
};

struct Words {
  std::string line;            // the log line ("": none)
  std::string event;           // the event's name ("": none), sent after the line
  nlohmann::json fields = nlohmann::json::object();  // its fields
  bool fatal = false;          // then the run fails with the action's text (announced as fatal)
};

Words words_of(const attempt::Action& a, const NoteFacts& f);

}  // namespace ring::ringd
