#include "worker/offload/ringd_client.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

namespace ring::offload {

namespace control = contract::control;

RingdClient::RingdClient(const std::string& path, const ClientOptions& o, int timeout_ms)
    : opt_(o) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof(addr.sun_path))
    throw RingdGone("--ringd " + path + ": socket path longer than " +
                    std::to_string(sizeof(addr.sun_path) - 1) + " bytes");
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  fd_ = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd_ < 0) throw RingdGone(std::string("socket: ") + std::strerror(errno));
  if (connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    const int e = errno;
    close(fd_);
    fd_ = -1;
    throw RingdGone("connect to ringd at " + path + ": " + std::strerror(e));
  }
  // A constructor that throws runs no destructor: close the socket here, or ringd would wait
  // for this worker's next line forever.
  try {
    send(control::Hello{.rank = o.rank, .local = o.local, .pid = getpid(), .n = o.n});
    pollfd p{fd_, POLLIN, 0};
    if (poll(&p, 1, timeout_ms) <= 0)
      throw RingdGone("no welcome from ringd within " + std::to_string(timeout_ms) + " ms");
    const control::RingdMessage m = recv();
    if (auto* s = std::get_if<control::Stop>(&m)) throw RingdGone("ringd refused: " + s->reason);
    const auto* w = std::get_if<control::Welcome>(&m);
    if (!w) throw RingdGone("expected a welcome from ringd, got " + control::to_json(m).dump());
    welcome_.shm = w->shm;
    welcome_.start_step = w->start_step;
    welcome_.need_init = w->need_init;
    welcome_.cursor = w->cursor;
    shm_ = contract::ShmRegion::open(welcome_.shm, o.n);
    // bucket() writes into slot `local`: a segment with fewer slots would be written past its end.
    if (o.local < 0 || o.local >= shm_.workers())
      throw RingdGone("shared memory " + welcome_.shm + " has " + std::to_string(shm_.workers()) +
                      " gradient slots, this worker's local rank is " + std::to_string(o.local));
    send(control::Mapped{});
  } catch (...) {
    close(fd_);
    fd_ = -1;
    throw;
  }
  hb_ = std::thread([this] {
    while (!stop_hb_.load()) {
      try {
        send(control::Heartbeat{});
      } catch (const std::exception&) {
        return;
      }
      for (int i = 0; i < opt_.heartbeat_ms / 10 && !stop_hb_.load(); ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  });
}

RingdClient::~RingdClient() {
  stop_hb_ = true;
  if (hb_.joinable()) hb_.join();
  if (fd_ >= 0) close(fd_);
}

void RingdClient::send(const control::WorkerMessage& m) {
  const std::string line = control::encode(m);
  std::lock_guard<std::mutex> lock(write_mu_);
  size_t off = 0;
  while (off < line.size()) {
    ssize_t w = ::send(fd_, line.data() + off, line.size() - off, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) throw RingdGone(std::string("ringd control socket: ") + std::strerror(errno));
    off += static_cast<size_t>(w);
  }
}

control::RingdMessage RingdClient::recv() {
  for (;;) {
    size_t nl = inbuf_.find('\n');
    if (nl != std::string::npos) {
      std::string line = inbuf_.substr(0, nl);
      inbuf_.erase(0, nl + 1);
      try {
        return control::parse_ringd_line(line, opt_.n);
      } catch (const control::ControlError& e) {
        throw RingdGone(std::string("ringd sent a malformed message: ") + e.what());
      }
    }
    char buf[4096];
    ssize_t r = ::recv(fd_, buf, sizeof(buf), 0);
    if (r < 0 && errno == EINTR) continue;
    if (r == 0) throw RingdGone("ringd closed the control socket");
    if (r < 0) throw RingdGone(std::string("ringd control socket: ") + std::strerror(errno));
    inbuf_.append(buf, static_cast<size_t>(r));
    if (inbuf_.size() > control::kMaxLineBytes) throw RingdGone("ringd message over 1 MiB");
  }
}

void RingdClient::send_init(const float* params) {
  // The segment's part of the model (shard full: the node's range).
  std::memcpy(shm_.params(), params + shm_.params_begin(),
              static_cast<size_t>(shm_.params_n()) * sizeof(float));
  send(control::Init{});
}

void RingdClient::send_init_written() {
  send(control::Init{});
}

Command RingdClient::next(float* params) {
  const control::RingdMessage m = recv();
  Command c;
  if (auto* s = std::get_if<control::Stop>(&m)) {
    c.stop = true;
    c.reason = s->reason;
    return c;
  }
  const auto* p = std::get_if<control::Params>(&m);
  if (!p) throw RingdGone("expected params or stop from ringd, got " + control::to_json(m).dump());
  c.step = p->step;
  c.changed = p->changed;  // -1..n (checked by the parser)
  c.stop_requested = p->stop;
  const float* src = shm_.params();
  if (params == src) return c;  // the caller reads the weights where ringd put them
  if (!shm_.whole())
    throw RingdGone("shared memory " + shm_.name() + " holds part of the model (shard full): " +
                    "read the weights from it, not through a copy of all " +
                    std::to_string(opt_.n));
  if (c.changed < 0) {
    std::memcpy(params, src, static_cast<size_t>(opt_.n) * sizeof(float));
  } else {
    const uint64_t* idx = shm_.index();
    for (int64_t i = 0; i < c.changed; ++i) {
      const uint64_t k = idx[i];
      if (k >= static_cast<uint64_t>(opt_.n))
        throw RingdGone("shared memory " + shm_.name() + ": changed coordinate " +
                        std::to_string(k) + " is outside the model's " + std::to_string(opt_.n));
      params[k] = src[k];
    }
  }
  return c;
}

void RingdClient::bucket(int64_t step, const contract::GradBucket& b, const float* grads) {
  if (!shm_.whole())
    throw RingdGone("shared memory " + shm_.name() + " has shard-sized gradient slots: write "
                    "this worker's shard into slot() and call bucket_written");
  std::memcpy(shm_.grads(opt_.local) + b.begin, grads + b.begin,
              static_cast<size_t>(b.end - b.begin) * sizeof(float));
  send(control::Bucket{.step = step, .b = b.index});
}

void RingdClient::bucket_written(int64_t step, const contract::GradBucket& b) {
  send(control::Bucket{.step = step, .b = b.index});
}

void RingdClient::done(const control::Done& d) {
  send(d);
}

}  // namespace ring::offload
