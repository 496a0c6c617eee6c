#include "cli/local_state.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>

#include "coordinator/queries.h"
#include "coordinator/security.h"
#include "coordinator/store.h"

namespace ring::cli {

namespace proto = ring::protocol;

namespace {

// The state directory lists `endpoint` among those it was served at.
bool served_at(const std::string& state_dir, const std::string& endpoint) {
  std::ifstream f(state_dir + "/" + coord::kEndpointsFile);
  for (std::string line; std::getline(f, line);)
    if (line == endpoint) return true;
  return false;
}

bool read_only_request(const proto::Message& m) {
  return std::holds_alternative<proto::StatusRequest>(m) ||
         std::holds_alternative<proto::EventsRequest>(m) ||
         std::holds_alternative<proto::StepsRequest>(m) ||
         std::holds_alternative<proto::NodesRequest>(m);
}

}  // namespace

coord::ClientOptions with_local_state(coord::ClientOptions o, std::string state_dir) {
  const std::string endpoint = o.endpoint.empty() ? coord::default_endpoint() : o.endpoint;
  if (state_dir.empty()) state_dir = coord::default_state_dir();
  // One read-only connection per client, opened on first use; the note is printed once.
  auto store = std::make_shared<std::unique_ptr<coord::Store>>();
  o.when_unreachable = [endpoint, state_dir,
                        store](const proto::Message& request) -> std::optional<proto::Message> {
    if (!read_only_request(request)) return std::nullopt;
    const std::string db = state_dir + "/coord.db";
    if (!*store) {
      if (!served_at(state_dir, endpoint) || !std::filesystem::exists(db)) return std::nullopt;
      try {
        *store = std::make_unique<coord::Store>(
            db, coord::Store::Options{.synchronous_full = false, .read_only = true});
      } catch (const std::exception& e) {
        std::cerr << "ringctl: no coordinator answers at " << endpoint << ", and its state " << db
                  << " cannot be read: " << e.what() << "\n";
        return std::nullopt;
      }
      std::cerr << "ringctl: no coordinator answers at " << endpoint
                << "; answering from the state it left in " << db << " (read-only)\n";
    }
    try {
      return coord::answer_read_only(**store, request);
    } catch (const coord::Refused& e) {
      // The client turns it into a RemoteError (not_found: exit 5), as from a coordinator.
      return proto::ErrorReply{0, e.code, e.what(), e.field};
    }
  };
  return o;
}

}  // namespace ring::cli
