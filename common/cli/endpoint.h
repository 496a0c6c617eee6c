// The one rule for a coordinator endpoint, for every program that takes one: ringctl --coord and
// $RING_COORD, ringd --coord (connect), ring-coord --endpoint (bind). The SPANK plugin, which is C,
// has its own copy of the connect rule (plugins/slurm/ring_validate.h).
//
//   if (auto why = ring::flags::endpoint_error(ep, EndpointUse::kConnect); !why.empty()) ...
#pragma once

#include <string>
#include <string_view>

namespace ring::flags {

enum class EndpointUse {
  kConnect,  // tcp://HOST:PORT with PORT 1..65535
  kBind,     // also tcp://*:PORT, and PORT 0 or * for any free port
};

// "" when `ep` is ipc:///DIR/NAME (an absolute path to a socket file, in a directory other than /
// when binding, shorter than a Unix socket path may be, no control characters) or tcp://HOST:PORT (HOST: a name or an
// address, IPv6 in brackets); else what is wrong ("port '99999' is not in 1..65535").
std::string endpoint_error(std::string_view ep, EndpointUse use);

}  // namespace ring::flags
