// ringd's control server: the Unix socket its workers connect to. It accepts connections, reads
// bounded lines, parses each into an contract::control::WorkerMessage (the one parser both ends
// share) and hands it on; it writes ringd's messages through a queue per connection (one
// async_write at a time, bounded), so that a worker that stops reading never blocks the event loop.
// What a message means is the caller's business (Handlers); a line that breaks the protocol closes
// its connection and is reported with the rule it broke.
#pragma once

#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>  // before asio: Boost 1.74 awaitable.hpp uses std::exchange unincluded
#include <vector>

#include <boost/asio.hpp>
#include <nlohmann/json.hpp>

#include "common/contract/control.h"

namespace ring::ringd {

// A control message that breaks the protocol (a second hello, a message before hello): thrown by
// a message handler; the message names the rule.
class ProtocolError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct ControlConn {
  explicit ControlConn(boost::asio::io_context& io, size_t max_line) : sock(io), buf(max_line) {}
  boost::asio::local::stream_protocol::socket sock;
  boost::asio::streambuf buf;
  int local = -1;  // the worker's local rank once its hello is accepted; -1 before
  // Lines waiting to be written, the first one being written when `writing`.
  std::deque<std::string> out;
  size_t out_bytes = 0;
  bool writing = false;
  bool close_after = false;  // close once the queue is written (a refusal)
};
using ConnPtr = std::shared_ptr<ControlConn>;

class ControlServer {
 public:
  // A worker's control messages are JSON lines of a few hundred bytes (the loader cursor is the
  // largest part); a line longer than this is a protocol error, not a reason to grow a buffer.
  static constexpr size_t kMaxLine = 1 << 20;
  // ringd -> worker bytes waiting to be written; a worker that stops reading fails past this.
  static constexpr size_t kMaxQueued = 16 << 20;

  struct Handlers {
    // One parsed line. May throw ProtocolError (or ControlError) to refuse it.
    std::function<void(const ConnPtr&, const contract::control::WorkerMessage&)> on_message;
    // The connection broke the protocol (`what`: the rule); it is closed and forgotten already.
    std::function<void(const ConnPtr&, const std::string& what)> on_protocol_error;
  };

  ControlServer(boost::asio::io_context& io, Handlers handlers, size_t max_line = kMaxLine,
                size_t max_queued = kMaxQueued)
      : io_(io), acceptor_(io), handlers_(std::move(handlers)), max_line_(max_line),
        max_queued_(max_queued) {}

  // Binds `path` (which must not exist), listens and accepts until stop(). Throws on failure.
  void listen(const std::string& path);
  // No more accepting or reading (the daemon exits); connections stay open until close_all().
  void stop();
  // Queues `m` to the connection of local rank `local` (none: dropped).
  void send(int local, const nlohmann::json& m);
  // Queues `m` to `c`; past max_queued bytes the connection fails ("does not read ...").
  void write(const ConnPtr& c, const nlohmann::json& m);
  // Closes every connection (the attempt ended).
  void close_all();
  // The peer's credentials (SO_PEERCRED): false when the kernel gives none.
  static bool peer(const ConnPtr& c, pid_t* pid, uid_t* uid);
  size_t connections() const { return conns_.size(); }

 private:
  void accept();
  void read(const ConnPtr& c);
  void on_line(const ConnPtr& c, const std::string& line);
  void write_next(const ConnPtr& c);
  void fail(const ConnPtr& c, const std::string& what);
  void forget(const ConnPtr& c);

  boost::asio::io_context& io_;
  boost::asio::local::stream_protocol::acceptor acceptor_;
  Handlers handlers_;
  size_t max_line_, max_queued_;
  bool stopped_ = false;
  std::vector<ConnPtr> conns_;
};

}  // namespace ring::ringd
