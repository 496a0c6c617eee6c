// Who is speaking to ring-coord. Connections are authenticated by ZAP (RFC 27): ipc:// peers come
// in with the NULL mechanism and are known by their socket credentials (SO_PEERCRED, read per
// message); tcp:// peers must use CURVE with a public key listed in <state_dir>/curve/clients,
// which gives them that line's uid. Messages are then handled as that uid (never a uid a message
// claims).
//
//   ZapDecision d = zap_decide(request_frames, clients_file);   // {"200", "OK", "1000"}
//   std::optional<uint32_t> uid = sender_uid(body, /*curve=*/false);
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <zmq.hpp>

namespace ring::coord {

// A ZAP reply: status code ("200" admitted, "400" refused, "500" malformed request), text, and
// the user id libzmq attaches to the connection's messages (the uid, for CURVE).
struct ZapDecision {
  std::string status;
  std::string text;
  std::string user;
};

// The decision for one ZAP request (its frames: version, request id, domain, address, identity,
// mechanism, credentials...). The clients file is read on every CURVE handshake, so an edit takes
// effect without a restart; one that became unsafe (security.h) admits no one.
ZapDecision zap_decide(const std::vector<std::string>& request, const std::string& clients_file);

// Answers one pending request on the ZAP socket (inproc://zeromq.zap.01), if any.
void serve_zap(zmq::socket_t& zap, const std::string& clients_file);

// The uid a message came from: the User-Id ZAP gave a CURVE connection, or the peer credentials
// of an ipc connection. nullopt: unknown (the message is refused).
std::optional<uint32_t> sender_uid(const zmq::message_t& body, bool curve);

}  // namespace ring::coord
