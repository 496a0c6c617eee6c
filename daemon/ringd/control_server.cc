#include "daemon/ringd/control_server.h"

#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>

#include <fmt/format.h>

namespace ring::ringd {

namespace asio = boost::asio;
using local_stream = asio::local::stream_protocol;
using json = nlohmann::json;

void ControlServer::listen(const std::string& path) {
  acceptor_.open(local_stream());
  acceptor_.bind(local_stream::endpoint(path));
  acceptor_.listen();
  accept();
}

void ControlServer::stop() {
  stopped_ = true;
  boost::system::error_code ec;
  acceptor_.close(ec);
}

void ControlServer::accept() {
  auto c = std::make_shared<ControlConn>(io_, max_line_);
  acceptor_.async_accept(c->sock, [this, c](const boost::system::error_code& e) {
    if (e || stopped_) return;
    conns_.push_back(c);
    read(c);
    accept();
  });
}

void ControlServer::read(const ConnPtr& c) {
  asio::async_read_until(
      c->sock, c->buf, '\n', [this, c](const boost::system::error_code& e, size_t n) {
        if (stopped_) return;
        if (e == asio::error::not_found) {  // max_line bytes and no newline
          fail(c, fmt::format("sent a control message longer than the {} byte limit", max_line_));
          return;
        }
        if (e) {
          forget(c);
          return;
        }
        std::string line(asio::buffers_begin(c->buf.data()),
                         asio::buffers_begin(c->buf.data()) + n);
        c->buf.consume(n);
        on_line(c, line);
        if (c->sock.is_open()) read(c);
      });
}

// A field of the wrong type or out of range is the worker's protocol error: it fails that
// connection, never the daemon. Lines are parsed and checked by the one parser both ends share
// (common/contract/control.h, fuzzed); the handler acts only on the parsed message.
void ControlServer::on_line(const ConnPtr& c, const std::string& line) {
  json m = json::parse(line, nullptr, false);
  if (m.is_discarded() || !m.is_object()) {
    fail(c, "sent a message that is not a JSON object: " + line.substr(0, 200));
    return;
  }
  const auto type = [&m] {
    return m.contains("t") && m["t"].is_string() ? m["t"].get<std::string>() : std::string("?");
  };
  try {
    handlers_.on_message(c, contract::control::worker_from_json(m));
  } catch (const contract::control::ControlError& x) {
    fail(c, std::string("sent a malformed message: ") + x.what());
  } catch (const ProtocolError& x) {
    fail(c, "sent a malformed '" + type() + "' message: " + x.what());
  } catch (const json::exception& x) {
    fail(c, "sent a malformed '" + type() + "' message (" + x.what() + "): " + line.substr(0, 200));
  }
}

void ControlServer::forget(const ConnPtr& c) {
  conns_.erase(std::remove(conns_.begin(), conns_.end(), c), conns_.end());
}

void ControlServer::fail(const ConnPtr& c, const std::string& what) {
  boost::system::error_code ec;
  c->sock.close(ec);
  forget(c);
  handlers_.on_protocol_error(c, what);
}

void ControlServer::send(int local, const json& m) {
  for (auto& c : conns_)
    if (c->local == local) {
      write(c, m);
      return;
    }
}

void ControlServer::write(const ConnPtr& c, const json& m) {
  if (!c->sock.is_open()) return;
  std::string s = m.dump() + "\n";
  c->out_bytes += s.size();
  c->out.push_back(std::move(s));
  if (c->out_bytes > max_queued_) {
    fail(c, fmt::format("does not read its control socket ({} bytes waiting)", c->out_bytes));
    return;
  }
  if (!c->writing) write_next(c);
}

void ControlServer::write_next(const ConnPtr& c) {
  if (c->out.empty() || !c->sock.is_open()) {
    c->writing = false;
    if (c->close_after) {
      boost::system::error_code ec;
      c->sock.close(ec);
    }
    return;
  }
  c->writing = true;
  asio::async_write(c->sock, asio::buffer(c->out.front()),
                    [this, c](const boost::system::error_code& e, size_t) {
                      if (e) {  // the peer is gone: SIGCHLD tells the rest
                        c->out.clear();
                        c->out_bytes = 0;
                        c->writing = false;
                        return;
                      }
                      c->out_bytes -= c->out.front().size();
                      c->out.pop_front();
                      write_next(c);
                    });
}

void ControlServer::close_all() {
  for (auto& c : conns_) {
    boost::system::error_code ec;
    c->sock.close(ec);
  }
  conns_.clear();
}

bool ControlServer::peer(const ConnPtr& c, pid_t* pid, uid_t* uid) {
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (getsockopt(c->sock.native_handle(), SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) return false;
  *pid = cred.pid;
  *uid = cred.uid;
  return true;
}

}  // namespace ring::ringd
