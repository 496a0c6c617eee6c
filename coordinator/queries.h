// The client requests that only read (status, events, steps, nodes), answered from the Store plus
// what only a running coordinator holds in memory (LiveView). ring-coord answers them this way,
// and so does ringctl from the state a stopped coordinator left (cli/local_state.h): one code
// path, one answer.
//
//   Store store(db_path, {.read_only = true});
//   auto reply = answer_read_only(store, protocol::StatusRequest{1, 7});   // status_reply
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/protocol/protocol.h"
#include "coordinator/store.h"

namespace ring::coord {

// A request or daemon message refused with an error reply (not a bug): code is one of
// protocol::code, field the offending field ("job").
struct Refused : std::runtime_error {
  Refused(std::string c, const std::string& m, std::string f = "")
      : std::runtime_error(m), code(std::move(c)), field(std::move(f)) {}
  std::string code;
  std::string field;
};

// What a running coordinator knows beyond the database: progress and step reports it has not
// flushed yet, and which nodes are up. Empty: the database as it was left.
struct LiveView {
  struct Progress {
    int64_t step = 0;
    double loss = 0, tokens_per_s = 0;
    double at = 0;  // when it arrived (Unix seconds)
  };
  struct Node {
    bool up = false;
    double last_unix = 0;  // last heartbeat
  };
  std::function<std::optional<Progress>(int64_t job)> progress;
  std::function<std::optional<Node>(uint32_t uid, const std::string& name)> node;
  const std::vector<protocol::StepReport>* unflushed_steps = nullptr;
};

protocol::JobInfo job_info(Store& store, const JobRow& j, const LiveView& live);

// Each throws Refused(not_found) for a job that does not exist.
protocol::StatusReply answer(Store& store, const protocol::StatusRequest& m, const LiveView& live);
protocol::EventsReply answer(Store& store, const protocol::EventsRequest& m);
protocol::StepsReply answer(Store& store, const protocol::StepsRequest& m, const LiveView& live);
protocol::NodesReply answer(Store& store, const protocol::NodesRequest& m, const LiveView& live);

// The reply to a read-only request; nullopt for any other message (only a running coordinator
// changes state). Throws Refused.
std::optional<protocol::Message> answer_read_only(Store& store, const protocol::Message& request,
                                                  const LiveView& live = {});

}  // namespace ring::coord
