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
#include <string_view>
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
// ring-coord's state directory when --state-dir is not given: $RING_STATE_DIR, else
// $XDG_STATE_HOME/ringmaster, else ~/.local/state/ringmaster, else /var/lib/ringmaster. ringctl
// reads the state a stopped coordinator left there (cli/local_state.h).
std::string default_state_dir();
// In the state directory: the endpoints the state has been served at, one a line.
inline constexpr const char* kEndpointsFile = "endpoints";

// Creates `dir` if missing (mode 0700 private, 0711 shared) and checks it: a real directory (not
// a symlink), owned by our euid, and not accessible to group/others (private) or not writable by
// them (shared). Throws SecurityError naming the path, the owner or mode found and the fix.
void prepare_socket_dir(const std::string& dir, SocketMode mode);

// Checks a file holding a secret: a regular file (not a symlink), owned by us, mode without
// group/other bits. Throws SecurityError naming the path and the rule.
void check_secret_file(const std::string& path);

// Creates the state directory 0700 if missing; refuses (SecurityError naming the path and the
// rule, as ssh does) one that is a symlink, not a directory, not ours, or has any group/other
// mode bit: it holds every job's spec and the CURVE secret key.
void prepare_state_dir(const std::string& dir);

// Opens (creating 0600, never following a symlink) a private file in the state directory and
// checks it as check_secret_file does. Returns the descriptor.
int open_private_file(const std::string& path, const std::string& what);

// check_secret_file for a file that may not exist yet (SQLite's -wal and -shm).
void check_private_file_if_present(const std::string& path, const std::string& what);

// The CURVE clients file, when present: a regular file, ours, not writable by group or others
// (whoever may write it may authorize a key as any uid).
void check_clients_file(const std::string& path);

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

// <z85 public key> -> uid, from a clients file; missing file: empty. Throws SecurityError when
// check_clients_file refuses the file.
struct AuthorizedClient {
  std::string public_key;
  uint32_t uid = 0;
};
std::vector<AuthorizedClient> read_authorized_clients(const std::string& path);

// The uid in a libzmq ipc "Peer-Address" ("...:uid:gid:pid"); nullopt if absent.
std::optional<uint32_t> uid_from_peer_address(const char* peer_address);

// The user name of a uid ("uid:1234" when unknown).
std::string user_name(uint32_t uid);

// `s` made safe for one log line: control characters (newline, carriage return, tab, escape,
// DEL, ...) become \n, \r, \t or \xHH and a backslash becomes \\, so that text a peer sent
// can neither end our line nor start a forged one, nor drive the terminal. Other bytes (UTF-8)
// are kept.
std::string escape_for_log(std::string_view s);

}  // namespace ring::coord
