// The worker's side of ringd's control socket (worker/offload/ringd_client.h) against a fake
// ringd in a thread that sends what the worker_control fuzz target's properties rule out: lazy
// params whose shm index names coordinates outside the model, a `changed` count above n, a
// wrongly typed field, and a segment with fewer gradient slots than the worker's local rank.
// Each must be a RingdGone naming the problem; before offload/control.h the first wrote far
// outside the worker's weights (a crash), the others were nlohmann exceptions or silent.
#include <gtest/gtest.h>

#include <stdlib.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/contract/shm.h"
#include "worker/offload/ringd_client.h"

namespace {

using ring::offload::RingdClient;
using ring::offload::RingdGone;
using ring::contract::ShmRegion;

constexpr int64_t kN = 1000;

// One connection: reads the hello, creates the segment (slots workers), sends the welcome,
// reads "mapped", then runs `script` with the socket and the segment.
class FakeRingd {
 public:
  FakeRingd(int slots, std::function<void(int fd, ShmRegion& shm)> script) {
    char tmpl[] = "/tmp/ringd-client-test-XXXXXX";
    dir_ = mkdtemp(tmpl);
    path_ = dir_ + "/ctl.sock";
    listen_fd_ = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::strcpy(a.sun_path, path_.c_str());
    EXPECT_EQ(bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    EXPECT_EQ(listen(listen_fd_, 1), 0);
    shm_name_ = "/ring-client-test-" + std::to_string(getpid());
    thread_ = std::thread([this, slots, script] {
      const int fd = accept(listen_fd_, nullptr, nullptr);
      if (fd < 0) return;
      timeval tv{30, 0};  // a reply that never comes fails the test instead of hanging it
      setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
      (void)read_line(fd);  // hello
      ShmRegion shm = ShmRegion::create(shm_name_, kN, slots);
      write_line(fd, {{"t", "welcome"},
                      {"shm", shm_name_},
                      {"start_step", 0},
                      {"need_init", false},
                      {"cursor", nullptr}});
      (void)read_line(fd);  // mapped (or nothing: the worker refused the segment)
      script(fd, shm);
      shutdown(fd, SHUT_RDWR);
      close(fd);
    });
  }
  ~FakeRingd() {
    shutdown(listen_fd_, SHUT_RDWR);
    if (thread_.joinable()) thread_.join();
    close(listen_fd_);
    std::filesystem::remove_all(dir_);
  }
  const std::string& path() const { return path_; }

  static void write_line(int fd, const nlohmann::json& j) { write_raw(fd, j.dump() + "\n"); }
  static void write_raw(int fd, const std::string& s) {
    (void)!::send(fd, s.data(), s.size(), MSG_NOSIGNAL);
  }
  static std::string read_line(int fd) {
    std::string line;
    char c;
    while (::recv(fd, &c, 1, 0) == 1 && c != '\n') line += c;
    return line;
  }

 private:
  std::string dir_, path_, shm_name_;
  int listen_fd_ = -1;
  std::thread thread_;
};

std::string next_error(FakeRingd& fake, int local = 0) {
  std::vector<float> params(kN, 0.f);
  try {
    RingdClient c(fake.path(), {.rank = 0, .local = local, .n = kN, .heartbeat_ms = 50}, 10000);
    (void)c.next(params.data());
  } catch (const RingdGone& e) {
    return e.what();
  }
  return "no error";
}

TEST(RingdClient, LazyIndexOutsideTheModelIsRefused) {
  FakeRingd fake(1, [](int fd, ShmRegion& shm) {
    shm.index()[0] = 3;
    shm.index()[1] = 0x1fffffff0ull;  // far past the worker's weights (and past 2^32)
    FakeRingd::write_line(fd, {{"t", "params"}, {"step", 1}, {"changed", 2}, {"stop", false}});
    (void)FakeRingd::read_line(fd);
  });
  const std::string e = next_error(fake);
  EXPECT_NE(e.find("changed coordinate 8589934576 is outside the model's 1000"), std::string::npos)
      << e;
}

TEST(RingdClient, ChangedAboveNIsRefused) {
  FakeRingd fake(1, [](int fd, ShmRegion&) {
    FakeRingd::write_line(fd, {{"t", "params"}, {"step", 1}, {"changed", kN + 1}});
    (void)FakeRingd::read_line(fd);
  });
  const std::string e = next_error(fake);
  EXPECT_NE(e.find("control message 'params': changed: 1001 is outside [-1, 1000]"),
            std::string::npos)
      << e;
}

TEST(RingdClient, WronglyTypedFieldIsRingdGone) {
  FakeRingd fake(1, [](int fd, ShmRegion&) {
    FakeRingd::write_raw(fd, "{\"t\":\"params\",\"step\":\"1\",\"changed\":-1}\n");
    (void)FakeRingd::read_line(fd);
  });
  const std::string e = next_error(fake);
  EXPECT_NE(e.find("control message 'params': step: must be an integer"), std::string::npos) << e;
}

TEST(RingdClient, SegmentWithoutThisWorkersSlotIsRefused) {
  FakeRingd fake(2, [](int, ShmRegion&) {});
  const std::string e = next_error(fake, /*local=*/2);
  EXPECT_NE(e.find("has 2 gradient slots, this worker's local rank is 2"), std::string::npos) << e;
}

}  // namespace
