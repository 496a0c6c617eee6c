#include "coordinator/daemon_link.h"

#include <cerrno>

#include <zmq.hpp>

#include "coordinator/security.h"

namespace ring::coord {

namespace proto = ring::protocol;

struct DaemonLink::Impl {
  zmq::context_t ctx{1};
  zmq::socket_t sock{ctx, zmq::socket_type::dealer};
};

DaemonLink::DaemonLink(DaemonLinkOptions opts, proto::Register registration)
    : impl_(std::make_unique<Impl>()), reg_(std::move(registration)) {
  if (opts.endpoint.empty()) opts.endpoint = default_endpoint();
  auto& s = impl_->sock;
  s.set(zmq::sockopt::linger, 0);
  s.set(zmq::sockopt::sndhwm, 100000);
  s.set(zmq::sockopt::reconnect_ivl, 100);
  s.set(zmq::sockopt::reconnect_ivl_max, 2000);
  if (opts.endpoint.rfind("tcp://", 0) == 0) {
    s.set(zmq::sockopt::curve_serverkey, opts.server_public_key);
    s.set(zmq::sockopt::curve_publickey, opts.client_public_key);
    s.set(zmq::sockopt::curve_secretkey, opts.client_secret_key);
  }
  s.connect(opts.endpoint);
}

DaemonLink::~DaemonLink() = default;

void DaemonLink::send(const proto::Message& m) {
  std::string wire = proto::encode(m);
  (void)impl_->sock.send(zmq::buffer(wire), zmq::send_flags::dontwait);
}

void DaemonLink::register_now() {
  ++registrations_;
  send(reg_);
}

void DaemonLink::heartbeat(const std::vector<proto::JobProgress>& jobs) {
  send(proto::Heartbeat{reg_.node, ++seq_, jobs});
}

std::optional<proto::Message> DaemonLink::recv(std::chrono::milliseconds timeout) {
  zmq::pollitem_t in{impl_->sock.handle(), 0, ZMQ_POLLIN, 0};
  try {
    zmq::poll(&in, 1, timeout);
  } catch (const zmq::error_t& e) {
    if (e.num() == EINTR) return std::nullopt;  // a signal landed on this thread: nothing yet
    throw;
  }
  if (!(in.revents & ZMQ_POLLIN)) return std::nullopt;
  zmq::message_t msg;
  if (!impl_->sock.recv(msg, zmq::recv_flags::dontwait)) return std::nullopt;
  proto::Message m;
  try {
    m = proto::parse(msg.to_string_view());
  } catch (const proto::ProtocolError& e) {
    return proto::ErrorReply{0, e.code(), e.what(), e.field()};
  }
  if (auto* err = std::get_if<proto::ErrorReply>(&m))
    if (err->code == proto::code::kNotRegistered) register_now();
  return m;
}

}  // namespace ring::coord
