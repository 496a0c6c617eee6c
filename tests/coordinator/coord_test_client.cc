// A ringctl stand-in for the process tests: runs one client call, optionally as another user.
//
//   coord_test_client ENDPOINT [--as-uid UID] submit FILE | cancel JOB | restart JOB |
//                     status JOB | [--curve SERVER_PUB_FILE CLIENT_KEY_FILE]
//
// Prints "ok <json>" or "error <code>: <message>". Exit: 0 ok, 3 refused (RemoteError),
// 4 connect error, 5 timeout, 2 usage.
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <iostream>
#include <sstream>

#include "coordinator/client.h"
#include "coordinator/security.h"

using namespace ring::coord;

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.size() < 3) return 2;
  ClientOptions o{args[0], std::chrono::milliseconds(3000), "", "", ""};
  size_t i = 1;
  uid_t as = static_cast<uid_t>(-1);
  std::string server_pub_file, client_key_file;
  while (i < args.size() && args[i].rfind("--", 0) == 0) {
    if (args[i] == "--as-uid") {
      as = static_cast<uid_t>(std::stoul(args[i + 1]));
      i += 2;
    } else if (args[i] == "--curve") {
      server_pub_file = args[i + 1];  // a file: Z85 has shell metacharacters
      client_key_file = args[i + 2];
      i += 3;
    } else {
      return 2;
    }
  }
  if (i + 1 >= args.size()) return 2;
  std::string cmd = args[i], arg = args[i + 1];
  std::string spec;
  if (cmd == "submit") {
    std::ifstream f(arg);
    std::stringstream ss;
    ss << f.rdbuf();
    spec = ss.str();
  }
  if (as != static_cast<uid_t>(-1)) {
    if (setgid(as) != 0 || setuid(as) != 0) {
      std::perror("setuid");
      return 2;
    }
  }
  try {
    if (!server_pub_file.empty()) {  // read as the user we now are
      o.server_public_key = read_public_key(server_pub_file);
      auto k = read_key_file(client_key_file);
      o.client_public_key = k.public_key;
      o.client_secret_key = k.secret_key;
    }
    Client c(o);
    if (cmd == "submit") {
      auto r = c.submit(spec);
      std::cout << "ok " << ring::protocol::encode(r) << "\n";
    } else if (cmd == "cancel") {
      std::cout << "ok " << ring::protocol::encode(c.cancel(std::stoll(arg))) << "\n";
    } else if (cmd == "restart") {
      std::cout << "ok " << ring::protocol::encode(c.restart(std::stoll(arg))) << "\n";
    } else if (cmd == "status") {
      std::cout << "ok "
                << ring::protocol::encode(
                       ring::protocol::StatusReply{0, {c.status(std::stoll(arg))}})
                << "\n";
    } else {
      return 2;
    }
    return 0;
  } catch (const RemoteError& e) {
    std::cout << "error " << e.code() << ": " << e.what() << "\n";
    return 3;
  } catch (const ConnectError& e) {
    std::cout << "error connect: " << e.what() << "\n";
    return 4;
  } catch (const TimeoutError& e) {
    std::cout << "error timeout: " << e.what() << "\n";
    return 5;
  } catch (const std::exception& e) {
    std::cout << "error other: " << e.what() << "\n";
    return 6;
  }
}
