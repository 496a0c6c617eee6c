// Endpoint security for ring-coord.
//
// ipc:// (default): the socket lives in a directory that we own and that no one else can write
// to; in the default private mode it is 0700 (only our user can connect), in shared mode 0711
// with a 0666 socket so other users can connect. The peer's uid is taken from the connection
// (SO_PEERCRED, which libzmq 4.3 appends to the "Peer-Address" metadata as ":uid:gid:pid"), never
// from a message field.
//
// tcp://: ZeroMQ CURVE. The server key pair is created on first start in <state_dir>/curve/
// (server.key 0600 with the secret key, server.pub 0644 with the public key that clients need).
// Clients present their own CURVE key; <state_dir>/curve/clients maps client public keys to uids
// ("<z85 public key> <uid> [comment]" per line); unknown keys are refused by the ZAP handler.
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace ring::coord {

class SecurityError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

enum class SocketMode { kPrivate, kShared };

// $XDG_RUNTIME_DIR/ringmaster when XDG_RUNTIME_DIR is set, else /tmp/ringmaster-<euid>.
std::string default_socket_dir();
// ipc://<default_socket_dir()>/coord.sock
std::string default_endpoint();

// Creates `dir` if missing (mode 0700 private, 0711 shared) and checks it: a real directory (not
// a symlink), owned by our euid, and not accessible to group/others (private) or not writable by
// them (shared). Throws SecurityError naming the path, the owner or mode found and the fix.
void prepare_socket_dir(const std::string& dir, SocketMode mode);

// Checks a file holding a secret: owned by us, mode without group/other bits.
void check_secret_file(const std::string& path);

struct CurveKeyPair {
  std::string public_key;  // Z85, 40 characters
  std::string secret_key;  // Z85, 40 characters
};
// Loads <dir>/server.key (creating dir 0700 and the pair on first use; server.key 0600,
// server.pub 0644).
CurveKeyPair load_or_create_curve_keys(const std::string& dir, const std::string& basename);
// Reads a key file written by load_or_create_curve_keys ("public <z85>\nsecret <z85>\n").
CurveKeyPair read_key_file(const std::string& path);
// Reads the public key file (<basename>.pub: one Z85 line).
std::string read_public_key(const std::string& path);

// <z85 public key> -> uid, from a clients file; missing file: empty.
struct AuthorizedClient {
  std::string public_key;
  uint32_t uid = 0;
};
std::vector<AuthorizedClient> read_authorized_clients(const std::string& path);

// The uid in a libzmq ipc "Peer-Address" ("...:uid:gid:pid"); nullopt if absent.
std::optional<uint32_t> uid_from_peer_address(const char* peer_address);

// The user name of a uid ("uid:1234" when unknown).
std::string user_name(uint32_t uid);

}  // namespace ring::coord
