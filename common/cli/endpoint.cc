#include "common/cli/endpoint.h"

#include <sys/un.h>

#include <cctype>

namespace ring::flags {

namespace {

// A value as a message shows it: quoted, control bytes as '?', at most 60 characters.
std::string quoted(std::string_view s) {
  std::string out = "'";
  for (unsigned char c : s.substr(0, 60)) out += c < 0x20 || c == 0x7f ? '?' : static_cast<char>(c);
  return out + (s.size() > 60 ? "...'" : "'");
}

}  // namespace

std::string endpoint_error(std::string_view ep, EndpointUse use) {
  const bool bind = use == EndpointUse::kBind;
  if (ep.rfind("ipc://", 0) == 0) {
    std::string_view path = ep.substr(6);
    if (path.empty() || path[0] != '/')
      return "ipc:// needs an absolute path (ipc:///DIR/coord.sock)";
    auto slash = path.rfind('/');
    if (slash + 1 == path.size() || (bind && slash == 0))  // bind: ring-coord prepares DIR
      return "ipc:// needs a socket file name in a directory (ipc:///DIR/coord.sock)";
    if (path.size() >= sizeof(sockaddr_un{}.sun_path))
      return "the socket path is " + std::to_string(path.size()) +
             " bytes; a Unix socket path takes at most " +
             std::to_string(sizeof(sockaddr_un{}.sun_path) - 1);
    for (char c : path)
      if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f)
        return "the socket path contains a control character";
    return "";
  }
  if (ep.rfind("tcp://", 0) == 0) {
    std::string_view hp = ep.substr(6);
    auto colon = hp.rfind(':');
    if (colon == std::string_view::npos) return "tcp:// needs HOST:PORT (tcp://login1:5555)";
    std::string_view host = hp.substr(0, colon), port = hp.substr(colon + 1);
    if (host.empty())
      return bind ? "tcp:// needs a host or interface before ':' (or *)"
                  : "tcp:// needs a host before ':' (tcp://login1:5555)";
    if (host.front() == '[' ? host.back() != ']' : host.find(':') != std::string_view::npos)
      return "an IPv6 address must be in brackets (tcp://[::1]:PORT)";
    for (char c : host)
      if (!std::isalnum(static_cast<unsigned char>(c)) &&
          std::string_view(".-_:[]%").find(c) == std::string_view::npos &&
          !(bind && c == '*'))
        return "the host " + quoted(host) + " contains " + quoted(std::string_view(&c, 1)) +
               (bind ? " (letters, digits, '.', '-', '_', ':', '[', ']', '%' or *)"
                     : " (letters, digits, '.', '-', '_', ':', '[', ']' or '%')");
    if (bind && port == "*") return "";
    bool digits = !port.empty() && port.size() <= 5 &&
                  port.find_first_not_of("0123456789") == std::string_view::npos;
    long n = digits ? std::stol(std::string(port)) : -1;
    if (bind ? !(digits && n <= 65535) : !(digits && n >= 1 && n <= 65535))
      return bind ? "port " + quoted(port) + " is not a TCP port (0..65535, 0 or * for any free port)"
                  : "port " + quoted(port) + " is not in 1..65535";
    return "";
  }
  return "expected ipc://PATH or tcp://HOST:PORT, got " + quoted(ep);
}

}  // namespace ring::flags
