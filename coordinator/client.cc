#include "coordinator/client.h"

#include <unistd.h>

#include <cerrno>

#include <zmq.hpp>

#include "coordinator/security.h"

namespace ring::coord {

namespace proto = ring::protocol;

// Replies (a status of every job) may be much larger than requests.
constexpr size_t kMaxReplyBytes = 64u << 20;

struct Client::Impl {
  ClientOptions opts;
  zmq::context_t ctx{1};
  zmq::socket_t sock{ctx, zmq::socket_type::dealer};
  int64_t next_id = 1;
  // Why the socket could not connect, when when_unreachable may answer instead.
  std::optional<ConnectError> unreachable;
  void connect();
};

Client::Client(ClientOptions opts) : impl_(std::make_unique<Impl>()) {
  if (opts.endpoint.empty()) opts.endpoint = default_endpoint();
  impl_->opts = std::move(opts);
  try {
    impl_->connect();
  } catch (const ConnectError& e) {
    if (!impl_->opts.when_unreachable) throw;
    impl_->unreachable = e;
  }
}

void Client::Impl::connect() {
  auto& s = sock;
  s.set(zmq::sockopt::linger, 0);
  s.set(zmq::sockopt::immediate, 1);  // do not queue requests to a peer that is not there
  if (opts.endpoint.rfind("ipc://", 0) == 0) {
    std::string path = opts.endpoint.substr(6);
    if (::access(path.c_str(), F_OK) != 0 && errno != EACCES)
      throw ConnectError("no coordinator at " + opts.endpoint + " (" + path +
                         " does not exist); start ring-coord or pass its endpoint");
    if (::access(path.c_str(), R_OK | W_OK) != 0)
      throw ConnectError("cannot use " + opts.endpoint +
                         ": permission denied (the coordinator runs in private mode as another "
                         "user; ask for --socket-mode shared or use your own coordinator)");
  } else if (opts.endpoint.rfind("tcp://", 0) == 0) {
    if (opts.server_public_key.size() != 40)
      throw ConnectError(
          "tcp endpoints need the coordinator's public key "
          "(<state_dir>/curve/server.pub on the coordinator host)");
    if (opts.client_public_key.size() != 40 || opts.client_secret_key.size() != 40)
      throw ConnectError("tcp endpoints need a client CURVE key pair");
    s.set(zmq::sockopt::curve_serverkey, opts.server_public_key);
    s.set(zmq::sockopt::curve_publickey, opts.client_public_key);
    s.set(zmq::sockopt::curve_secretkey, opts.client_secret_key);
  } else {
    throw ConnectError("unsupported endpoint '" + opts.endpoint +
                       "' (ipc://PATH or tcp://HOST:PORT)");
  }
  try {
    s.connect(opts.endpoint);
  } catch (const zmq::error_t& e) {
    throw ConnectError("cannot connect to " + opts.endpoint + ": " + e.what());
  }
}

Client::~Client() = default;

namespace {
int64_t id_of(const proto::Message& m) {
  return std::visit(
      [](const auto& x) -> int64_t {
        if constexpr (requires { x.id; })
          return x.id;
        else
          return -1;
      },
      m);
}
}  // namespace

proto::Message Client::call(proto::Message request) {
  int64_t id = impl_->next_id++;
  std::visit(
      [&](auto& m) {
        if constexpr (requires { m.id; }) m.id = id;
      },
      request);
  auto fallback = [&]() -> std::optional<proto::Message> {
    if (!impl_->opts.when_unreachable) return std::nullopt;
    auto reply = impl_->opts.when_unreachable(request);
    if (reply)
      if (auto* err = std::get_if<proto::ErrorReply>(&*reply))
        throw RemoteError(err->code, err->field, err->message);
    return reply;
  };
  if (impl_->unreachable) {
    if (auto reply = fallback()) return *reply;
    throw *impl_->unreachable;
  }
  try {
    return call_coordinator(request, id);
  } catch (const TimeoutError&) {
    if (auto reply = fallback()) return *reply;
    throw;
  }
}

proto::Message Client::call_coordinator(const proto::Message& request, int64_t id) {
  auto& s = impl_->sock;
  std::string wire = proto::encode(request);
  auto deadline = std::chrono::steady_clock::now() + impl_->opts.timeout;
  auto left = [&] {
    return std::max<int64_t>(0, std::chrono::duration_cast<std::chrono::milliseconds>(
                                    deadline - std::chrono::steady_clock::now())
                                    .count());
  };
  // zmq::poll throws on EINTR (a signal such as the Ctrl-C a caller handles): poll again until
  // the deadline.
  auto poll = [&](zmq::pollitem_t* item) {
    for (;;) {
      try {
        zmq::poll(item, 1, std::chrono::milliseconds(left()));
        return;
      } catch (const zmq::error_t& e) {
        if (e.num() != EINTR || left() == 0) throw;
      }
    }
  };
  // With ZMQ_IMMEDIATE the send would block until the connection is up: poll for POLLOUT.
  zmq::pollitem_t out{s.handle(), 0, ZMQ_POLLOUT, 0};
  poll(&out);
  if (!(out.revents & ZMQ_POLLOUT) || !s.send(zmq::buffer(wire), zmq::send_flags::dontwait))
    throw TimeoutError("could not reach the coordinator at " + impl_->opts.endpoint + " within " +
                       std::to_string(impl_->opts.timeout.count()) +
                       " ms (is ring-coord running? for tcp: is this client's key authorized?)");
  while (true) {
    zmq::pollitem_t in{s.handle(), 0, ZMQ_POLLIN, 0};
    poll(&in);
    if (!(in.revents & ZMQ_POLLIN))
      throw TimeoutError(std::string("no reply to '") + proto::type_name(request) + "' from " +
                         impl_->opts.endpoint + " within " +
                         std::to_string(impl_->opts.timeout.count()) + " ms");
    zmq::message_t msg;
    if (!s.recv(msg, zmq::recv_flags::dontwait)) continue;
    if (msg.size() > kMaxReplyBytes) throw ClientError("reply too large");
    proto::Message reply;
    try {
      // Replies may exceed the request limit: parse without the size check.
      auto j = nlohmann::json::parse(msg.to_string_view());
      reply = proto::from_json(j);
    } catch (const std::exception& e) {
      throw ClientError(std::string("malformed reply from the coordinator: ") + e.what());
    }
    int64_t rid = id_of(reply);
    if (auto* err = std::get_if<proto::ErrorReply>(&reply)) {
      if (rid == id || rid == 0) throw RemoteError(err->code, err->field, err->message);
      continue;
    }
    if (rid != id) continue;  // a late reply to an earlier, timed-out request
    return reply;
  }
}

namespace {
template <typename T>
T expect(proto::Message m, const char* what) {
  if (auto* r = std::get_if<T>(&m)) return std::move(*r);
  throw ClientError(std::string("unexpected reply '") + proto::type_name(m) + "' to " + what);
}
}  // namespace

proto::SubmitReply Client::submit(const std::string& spec, const std::string& name,
                                  const std::string& job_dir, std::optional<int64_t> steps) {
  if (spec.size() > proto::kMaxSpecBytes)
    throw ClientError("spec of " + std::to_string(spec.size()) + " bytes exceeds the " +
                      std::to_string(proto::kMaxSpecBytes) + "-byte limit");
  return expect<proto::SubmitReply>(call(proto::SubmitRequest{0, spec, name, job_dir, steps}),
                                    "submit");
}

std::vector<proto::JobInfo> Client::status() {
  return expect<proto::StatusReply>(call(proto::StatusRequest{0, std::nullopt}), "status").jobs;
}

proto::JobInfo Client::status(int64_t job) {
  auto r = expect<proto::StatusReply>(call(proto::StatusRequest{0, job}), "status");
  if (r.jobs.size() != 1) throw ClientError("status of job " + std::to_string(job) + ": no job");
  return r.jobs[0];
}

std::vector<proto::EventRecord> Client::events(int64_t job, int64_t after, int64_t limit) {
  return expect<proto::EventsReply>(call(proto::EventsRequest{0, job, after, limit}), "events")
      .events;
}

proto::OkReply Client::cancel(int64_t job) {
  return expect<proto::OkReply>(call(proto::CancelRequest{0, job}), "cancel");
}

proto::OkReply Client::restart(int64_t job, std::optional<int64_t> from_step) {
  return expect<proto::OkReply>(call(proto::RestartRequest{0, job, from_step, std::nullopt}),
                                "restart");
}

proto::OkReply Client::requeue(int64_t job) {
  return expect<proto::OkReply>(call(proto::RestartRequest{0, job, std::nullopt, true}),
                                "restart");
}

proto::OkReply Client::checkpoint(int64_t job) {
  return expect<proto::OkReply>(call(proto::CheckpointRequest{0, job}), "checkpoint");
}

proto::OkReply Client::slurm_job(const proto::SlurmJobRequest& request) {
  return expect<proto::OkReply>(call(request), "slurm_job");
}

std::vector<proto::StepRecord> Client::steps(int64_t job, int64_t after, int64_t limit) {
  return expect<proto::StepsReply>(call(proto::StepsRequest{0, job, after, limit, std::nullopt}),
                                   "steps")
      .steps;
}

std::vector<proto::RankStepRecord> Client::rank_steps(int64_t job, int64_t after, int64_t limit) {
  return expect<proto::StepsReply>(call(proto::StepsRequest{0, job, after, limit, true}), "steps")
      .ranks;
}

std::vector<proto::NodeInfo> Client::nodes() {
  return expect<proto::NodesReply>(call(proto::NodesRequest{0}), "nodes").nodes;
}

}  // namespace ring::coord
