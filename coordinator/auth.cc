#include "coordinator/auth.h"

#include <cstdlib>

#include <zmq_addon.hpp>

#include "coordinator/log.h"
#include "coordinator/security.h"

namespace ring::coord {

ZapDecision zap_decide(const std::vector<std::string>& req, const std::string& clients_file) {
  if (req.size() < 6) return {"500", "malformed ZAP request", ""};
  const std::string& mechanism = req[5];
  if (mechanism == "NULL") return {"200", "OK", ""};
  if (mechanism == "CURVE" && req.size() >= 7 && req[6].size() == 32) {
    char z85[41];
    zmq_z85_encode(z85, reinterpret_cast<const uint8_t*>(req[6].data()), 32);
    std::vector<AuthorizedClient> clients;
    try {
      clients = read_authorized_clients(clients_file);
    } catch (const SecurityError& e) {
      // Changed after we started: admit no one until it is fixed.
      logger()->error("refused CURVE client {}: {}", z85, e.what());
      return {"400", "clients file refused", ""};
    }
    for (const auto& c : clients)
      if (c.public_key == z85) return {"200", "OK", std::to_string(c.uid)};
    logger()->warn("refused CURVE client {} from {}: key not in {}", z85, req[3], clients_file);
    return {"400", "unknown client key", ""};
  }
  return {"400", "mechanism not allowed", ""};
}

void serve_zap(zmq::socket_t& zap, const std::string& clients_file) {
  std::vector<zmq::message_t> frames;
  if (!zmq::recv_multipart(zap, std::back_inserter(frames), zmq::recv_flags::dontwait)) return;
  std::vector<std::string> req;
  for (const auto& f : frames) req.push_back(f.to_string());
  ZapDecision d = zap_decide(req, clients_file);
  std::string ver = "1.0";
  std::string rid = req.size() > 1 ? req[1] : "";
  zap.send(zmq::buffer(ver), zmq::send_flags::sndmore);
  zap.send(zmq::buffer(rid), zmq::send_flags::sndmore);
  zap.send(zmq::buffer(d.status), zmq::send_flags::sndmore);
  zap.send(zmq::buffer(d.text), zmq::send_flags::sndmore);
  zap.send(zmq::buffer(d.user), zmq::send_flags::sndmore);
  zap.send(zmq::str_buffer(""), zmq::send_flags::none);
}

std::optional<uint32_t> sender_uid(const zmq::message_t& body, bool curve) {
  if (curve) {
    const char* u = zmq_msg_gets(body.handle(), "User-Id");
    if (u && *u) return static_cast<uint32_t>(std::strtoul(u, nullptr, 10));
    return std::nullopt;
  }
  return uid_from_peer_address(zmq_msg_gets(body.handle(), "Peer-Address"));
}

}  // namespace ring::coord
