// The ZeroMQ control protocol (common/protocol): whatever the bytes, parse() returns a message or
// throws ProtocolError (never another exception, a crash or an out-of-bounds read), and every
// message it accepts re-encodes to bytes that parse to the same message (the JSON forms are
// equal, and encoding that again gives the same bytes).
#include <string>
#include <string_view>

#include "common/protocol/protocol.h"
#include "tests/fuzz/targets.h"

namespace ring::fuzz {

void protocol_input(const uint8_t* data, size_t size) {
  namespace p = ring::protocol;
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  const int64_t id = p::peek_request_id(bytes);
  if (id < 0) fail("protocol", "peek_request_id returned a negative id");
  (void)p::valid_node_name(bytes);
  p::Message m;
  try {
    m = p::parse(bytes);
  } catch (const p::ProtocolError& e) {
    if (e.code().empty())
      fail("protocol", std::string("ProtocolError without a code: ") + e.what());
    return;
  }
  const nlohmann::json j = p::to_json(m);
  const std::string wire = p::encode(m);
  p::Message again;
  try {
    again = p::parse(wire);
  } catch (const p::ProtocolError& e) {
    fail("protocol", std::string("a parsed message re-encodes to bytes that do not parse: ") +
                         e.what() + "\n  re-encoded: " + wire.substr(0, 2000));
  }
  if (again.index() != m.index() || p::type_name(again) != std::string(p::type_name(m)))
    fail("protocol", "the re-encoded message parses to another type: " + wire.substr(0, 2000));
  if (p::to_json(again) != j)
    fail("protocol", "the re-encoded message parses to another message:\n  first:  " +
                         j.dump().substr(0, 2000) +
                         "\n  second: " + p::to_json(again).dump().substr(0, 2000));
  if (p::encode(again) != wire) fail("protocol", "encoding is not stable: " + wire.substr(0, 2000));
}

}  // namespace ring::fuzz
