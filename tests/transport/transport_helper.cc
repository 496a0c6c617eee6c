// One rank of the transport conformance suite (transport_conformance_test.cc starts P of them).
//
//   transport_helper <transport> <rank> <world> <rendezvous-dir> <scenario>
//
// Exit status: 0 pass; 1 a check failed (message on stderr); 3 the transport reported a peer
// failure (what the "kill" scenario expects of survivors); 4 a timeout; 2 bad usage or init.
// Results that must be identical on every rank are written as a hash to <dir>/result-<rank>.
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "plugins/transport/loader.h"

#ifdef RING_HELPER_CUDA
#include <cuda_runtime.h>
#endif

namespace {

using ring::transport::TransportComm;
using ring::transport::TransportError;
using ring::transport::TransportPlugin;

int g_rank = 0;
const ring_transport_t* g_api = nullptr;
bool g_device = false;  // buffers live on the GPU (NCCL)

[[noreturn]] void fail(const std::string& what) {
  std::fprintf(stderr, "rank %d: CHECK FAILED: %s\n", g_rank, what.c_str());
  std::exit(1);
}
#define CHECK(cond, msg)                                                  \
  do {                                                                    \
    if (!(cond)) fail(std::string(#cond) + " - " + std::string(msg));     \
  } while (0)

// Memory the transport can use: host memory, or a device mirror of a host vector.
struct Buf {
  std::vector<uint8_t> host;
  void* dev = nullptr;
  explicit Buf(size_t n, uint8_t fill = 0) : host(n, fill) {
#ifdef RING_HELPER_CUDA
    if (g_device && n) {
      if (cudaMalloc(&dev, n) != cudaSuccess) fail("cudaMalloc");
      cudaMemcpy(dev, host.data(), n, cudaMemcpyHostToDevice);
    }
#endif
  }
  ~Buf() {
#ifdef RING_HELPER_CUDA
    if (dev) cudaFree(dev);
#endif
  }
  Buf(const Buf&) = delete;
  void* ptr() { return g_device ? dev : (host.empty() ? nullptr : host.data()); }
  void upload() {
#ifdef RING_HELPER_CUDA
    if (dev) cudaMemcpy(dev, host.data(), host.size(), cudaMemcpyHostToDevice);
#endif
  }
  void download() {
#ifdef RING_HELPER_CUDA
    if (dev) cudaMemcpy(host.data(), dev, host.size(), cudaMemcpyDeviceToHost);
#endif
  }
  float* f() { return reinterpret_cast<float*>(host.data()); }
};

uint64_t mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  return x ^ (x >> 33);
}
uint8_t pattern(int src, uint64_t msg, size_t i) {
  return static_cast<uint8_t>(mix((static_cast<uint64_t>(src) << 48) ^ (msg << 32) ^ i));
}
void fill(Buf& b, int src, uint64_t msg) {
  for (size_t i = 0; i < b.host.size(); ++i) b.host[i] = pattern(src, msg, i);
  b.upload();
}
// Checks the first n bytes; cheap enough for 256 MiB (one pass).
void verify(Buf& b, size_t n, int src, uint64_t msg, const std::string& what) {
  b.download();
  for (size_t i = 0; i < n; ++i)
    if (b.host[i] != pattern(src, msg, i))
      fail(what + ": byte " + std::to_string(i) + " of message " + std::to_string(msg) +
           " from rank " + std::to_string(src) + " is wrong");
}

// Floats of very different magnitudes so that the order of a sum changes its bits.
float value(int rank, size_t i) {
  uint64_t h = mix(static_cast<uint64_t>(rank) * 0x9e3779b97f4a7c15ull + i);
  float mant = static_cast<float>(static_cast<int64_t>(h % 2000001) - 1000000) * 1e-6f;
  int exp = static_cast<int>((h >> 32) % 24) - 12;
  return std::ldexp(mant, exp);
}

uint64_t fnv(const void* p, size_t n, uint64_t h = 1469598103934665603ull) {
  const auto* b = static_cast<const uint8_t*>(p);
  for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

struct Ctx {
  TransportComm* comm;
  int rank, world;
  std::string dir;
  uint64_t result_hash = 1469598103934665603ull;
  ring_transport_comm_t* c() const { return comm->get(); }
  bool tags() const { return g_api->caps & RING_TRANSPORT_CAP_TAG_MATCHING; }
  bool ring_order() const { return g_api->caps & RING_TRANSPORT_CAP_RING_SUM_ORDER; }
};

// Exit with the category of a transport error: the parent checks survivors of "kill" report
// a peer failure, and that nothing else does.
void ok(const Ctx& x, ring_transport_status_t s, const std::string& what) {
  if (s == RING_TRANSPORT_OK) return;
  std::fprintf(stderr, "rank %d: %s: %s: %s\n", g_rank, what.c_str(), ring_transport_status_name(s),
               g_api->last_error(x.c()));
  std::fflush(stderr);
  std::exit(s == RING_TRANSPORT_ERR_PEER_FAILED ? 3 : s == RING_TRANSPORT_ERR_TIMEOUT ? 4 : 1);
}

ring_transport_request_t* isend(Ctx& x, Buf& b, size_t n, int peer, uint32_t tag) {
  ring_transport_request_t* r = nullptr;
  ok(x, g_api->isend(x.c(), b.ptr(), n, peer, tag, &r), "isend to " + std::to_string(peer));
  return r;
}
ring_transport_request_t* irecv(Ctx& x, Buf& b, size_t n, int peer, uint32_t tag) {
  ring_transport_request_t* r = nullptr;
  ok(x, g_api->irecv(x.c(), b.ptr(), n, peer, tag, &r), "irecv from " + std::to_string(peer));
  return r;
}
size_t wait(Ctx& x, ring_transport_request_t* r, const std::string& what) {
  size_t bytes = 0;
  ok(x, g_api->wait(x.c(), r, 0, &bytes), what);
  return bytes;
}

// The clean-exit handshake (as RingRank::shutdown does): returns once every rank has reached it.
void exit_handshake(Ctx& x) {
  constexpr uint32_t kDoneTag = 0x7e570001, kReleaseTag = 0x7e570002;
  Buf one(1, 1);
  if (x.rank == 0) {
    for (int p = 1; p < x.world; ++p) {
      Buf in(1);
      wait(x, irecv(x, in, 1, p, kDoneTag), "exit: done from " + std::to_string(p));
    }
    for (int p = 1; p < x.world; ++p)
      wait(x, isend(x, one, 1, p, kReleaseTag), "exit: release to " + std::to_string(p));
  } else {
    Buf in(1);
    ring_transport_request_t* r = irecv(x, in, 1, 0, kReleaseTag);
    wait(x, isend(x, one, 1, 0, kDoneTag), "exit: done to 0");
    wait(x, r, "exit: release from 0");
  }
}

// ---- scenarios --------------------------------------------------------------------------------

// Messages to the next rank arrive in order, over sizes across eager/rendezvous protocols; with
// tag matching, two interleaved tag streams each keep their order even when received in the
// other order.
void ordering(Ctx& x) {
  const int next = (x.rank + 1) % x.world, prev = (x.rank + x.world - 1) % x.world;
  const size_t sizes[] = {0, 1, 8, 4096, 65539, 1 << 20, 3};
  const int n = 200;
  std::vector<std::unique_ptr<Buf>> out, in;
  std::vector<ring_transport_request_t*> sends, recvs;
  auto tag_of = [&](int i) -> uint32_t { return x.tags() ? (i % 2 ? 9u : 7u) : 0u; };
  auto size_of = [&](int i) { return sizes[i % 7]; };
  // Post receives first for tag 9, then for tag 7 (reverse of the send interleaving).
  std::vector<int> order;
  for (int pass : {1, 0})
    for (int i = 0; i < n; ++i)
      if (!x.tags() ? pass == 0 : (i % 2) == pass) order.push_back(i);
  in.resize(n);
  for (int i : order) {
    size_t cap = x.tags() ? (1 << 20) + 16 : size_of(i);  // order-matching plugins: exact size
    in[i] = std::make_unique<Buf>(cap);
  }
  for (int i : order) recvs.push_back(irecv(x, *in[i], in[i]->host.size(), prev, tag_of(i)));
  for (int i = 0; i < n; ++i) {
    out.push_back(std::make_unique<Buf>(size_of(i)));
    fill(*out.back(), x.rank, i);
    sends.push_back(isend(x, *out.back(), size_of(i), next, tag_of(i)));
  }
  for (size_t k = 0; k < order.size(); ++k) {
    int i = order[k];
    size_t got = wait(x, recvs[k], "ordering recv " + std::to_string(i));
    CHECK(got == size_of(i), "message " + std::to_string(i) + " has " + std::to_string(got) +
                                 " bytes, sent " + std::to_string(size_of(i)));
    verify(*in[i], got, prev, i, "ordering");
  }
  for (auto* s : sends) wait(x, s, "ordering send");
}

// Zero-length messages, self-sends, argument errors, truncation, a wait that times out and is
// then waited again.
void edge(Ctx& x) {
  const int next = (x.rank + 1) % x.world, prev = (x.rank + x.world - 1) % x.world;
  Buf empty(0);
  auto rr = irecv(x, empty, 0, prev, 1);
  auto sr = isend(x, empty, 0, next, 1);
  CHECK(wait(x, rr, "zero-length recv") == 0, "zero-length message has bytes");
  wait(x, sr, "zero-length send");

  Buf self_out(1000), self_in(1000);
  fill(self_out, x.rank, 77);
  rr = irecv(x, self_in, 1000, x.rank, 2);
  sr = isend(x, self_out, 1000, x.rank, 2);
  wait(x, sr, "self send");
  CHECK(wait(x, rr, "self recv") == 1000, "self message length");
  verify(self_in, 1000, x.rank, 77, "self message");

  ring_transport_request_t* r = nullptr;
  CHECK(g_api->isend(x.c(), self_out.ptr(), 10, x.world, 3, &r) ==
            RING_TRANSPORT_ERR_INVALID_ARGUMENT && r == nullptr,
        "isend to rank world_size is accepted");
  CHECK(std::strlen(g_api->last_error(x.c())) > 0, "no error message for a bad rank");
  CHECK(g_api->irecv(x.c(), nullptr, 10, prev, 3, &r) == RING_TRANSPORT_ERR_INVALID_ARGUMENT,
        "irecv into NULL with size 10 is accepted");

  if (x.tags()) {
    // Truncation: 100 bytes into a 10-byte buffer completes with INVALID_ARGUMENT.
    Buf big(100), small(10);
    fill(big, x.rank, 5);
    rr = irecv(x, small, 10, prev, 4);
    sr = isend(x, big, 100, next, 4);
    ring_transport_status_t s = g_api->wait(x.c(), rr, 0, nullptr);
    CHECK(s == RING_TRANSPORT_ERR_INVALID_ARGUMENT,
          std::string("truncated receive returned ") + ring_transport_status_name(s));
    wait(x, sr, "truncation send");
  }
  // A wait that times out leaves the request valid: rank 0's receive from rank 1 times out
  // (rank 1 sends only when rank 0 tells it that it did), then completes on the second wait.
  ok(x, g_api->barrier(x.c(), 0), "barrier before timeout check");
  if (x.world >= 2 && x.rank <= 1) {
    Buf m(64), go(8);
    if (x.rank == 0) {
      rr = irecv(x, m, 64, 1, 6);
      auto t0 = std::chrono::steady_clock::now();
      ring_transport_status_t s = g_api->wait(x.c(), rr, 200, nullptr);
      double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                      .count();
      CHECK(s == RING_TRANSPORT_ERR_TIMEOUT,
            std::string("early wait returned ") + ring_transport_status_name(s));
      CHECK(ms >= 150 && ms < 30000, "timeout of 200 ms took " + std::to_string(ms) + " ms");
      fill(go, 0, 7);
      wait(x, isend(x, go, 8, 1, 7), "go-ahead send");
      CHECK(wait(x, rr, "second wait") == 64, "late message length");
      verify(m, 64, 1, 6, "late message");
    } else {
      wait(x, irecv(x, go, 8, 0, 7), "go-ahead receive");
      fill(m, 1, 6);
      wait(x, isend(x, m, 64, 0, 6), "late send");
    }
  }
  ok(x, g_api->barrier(x.c(), 0), "final edge barrier");
}

// 256 MiB to the next rank, verified.
void large(Ctx& x) {
  const int next = (x.rank + 1) % x.world, prev = (x.rank + x.world - 1) % x.world;
  const size_t n = 256ull << 20;
  Buf out(n), in(n);
  fill(out, x.rank, 1);
  auto rr = irecv(x, in, n, prev, 11);
  auto sr = isend(x, out, n, next, 11);
  CHECK(wait(x, rr, "256 MiB recv") == n, "256 MiB message length");
  wait(x, sr, "256 MiB send");
  verify(in, n, prev, 1, "256 MiB message");
}

// Many messages in flight at once to every rank, completed in a shuffled order with test().
void many(Ctx& x) {
  const int per_peer = 256;
  const size_t sz = 2048 + 1;
  std::vector<std::unique_ptr<Buf>> out, in;
  struct Item {
    ring_transport_request_t* req;
    int peer, msg;
    Buf* buf;
    bool recv;
  };
  std::vector<Item> items;
  for (int p = 0; p < x.world; ++p) {
    if (p == x.rank) continue;
    for (int m = 0; m < per_peer; ++m) {
      in.push_back(std::make_unique<Buf>(sz));
      items.push_back({irecv(x, *in.back(), sz, p, 20), p, m, in.back().get(), true});
    }
  }
  for (int p = 0; p < x.world; ++p) {
    if (p == x.rank) continue;
    for (int m = 0; m < per_peer; ++m) {
      out.push_back(std::make_unique<Buf>(sz));
      fill(*out.back(), x.rank, 1000 + m);
      items.push_back({isend(x, *out.back(), sz, p, 20), p, m, out.back().get(), false});
    }
  }
  std::mt19937 rng(x.rank);
  std::shuffle(items.begin(), items.end(), rng);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  size_t left = items.size();
  std::vector<bool> done(items.size(), false);
  while (left) {
    CHECK(std::chrono::steady_clock::now() < deadline, std::to_string(left) + " requests stuck");
    for (size_t i = 0; i < items.size(); ++i) {
      if (done[i]) continue;
      int d = 0;
      size_t bytes = 0;
      ok(x, g_api->test(x.c(), items[i].req, &d, &bytes), "test");
      if (!d) continue;
      done[i] = true;
      --left;
      if (items[i].recv) {
        CHECK(bytes == sz, "many: length");
        verify(*items[i].buf, sz, items[i].peer, 1000 + items[i].msg, "many");
      }
    }
  }
}

// Ring attention's pattern: P steps, send the held block to next while receiving from prev.
void ring_exchange(Ctx& x) {
  const int next = (x.rank + 1) % x.world, prev = (x.rank + x.world - 1) % x.world;
  int peers[2] = {prev, next};
  ok(x, g_api->connect(x.c(), peers, 2, 0), "connect to ring neighbours");
  const size_t n = (4 << 20) + 12;
  Buf a(n), b(n);
  fill(a, x.rank, 0);
  Buf* cur = &a;
  Buf* nxt = &b;
  for (int s = 0; s < x.world; ++s) {
    int origin = (x.rank - s + x.world) % x.world;
    verify(*cur, n, origin, 0, "ring step " + std::to_string(s));
    auto rr = irecv(x, *nxt, n, prev, 30);
    auto sr = isend(x, *cur, n, next, 30);
    wait(x, rr, "ring recv");
    wait(x, sr, "ring send");
    std::swap(cur, nxt);
  }
  verify(*cur, n, x.rank, 0, "ring: own block back after P steps");
}

size_t block_begin(size_t count, int world, int b) {
  return static_cast<size_t>((static_cast<unsigned __int128>(count) * b) / world);
}

// Reference sum of element i of block b: left fold starting at rank b+1 (transport.h).
float ring_sum(int world, int b, size_t i, size_t offset_in_rank_data) {
  float acc = value((b + 1) % world, offset_in_rank_data);
  for (int k = 2; k <= world; ++k) acc = acc + value((b + k) % world, offset_in_rank_data);
  return world == 1 ? value(0, offset_in_rank_data) : acc;
}

void check_sum(const Ctx& x, float got, float want, const std::string& what) {
  if (x.ring_order()) {
    if (std::memcmp(&got, &want, 4) != 0)
      fail(what + ": " + std::to_string(got) + " != ring-order reference " + std::to_string(want));
  } else if (std::fabs(got - want) > 1e-5f * (std::fabs(want) + 1e-3f) * x.world) {
    fail(what + ": " + std::to_string(got) + " vs " + std::to_string(want));
  }
}

void collectives(Ctx& x) {
  const int P = x.world;
  for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t(P - 1), size_t{1000003}}) {
    for (bool in_place : {false, true}) {
      Buf send(count * 4), recv(count * 4);
      for (size_t i = 0; i < count; ++i) send.f()[i] = value(x.rank, i);
      send.upload();
      Buf& dst = in_place ? send : recv;
      ok(x, g_api->all_reduce_sum_f32(x.c(), static_cast<float*>(send.ptr()),
                                      static_cast<float*>(dst.ptr()), count, 0),
         "all_reduce " + std::to_string(count));
      dst.download();
      for (int b = 0; b < P; ++b)
        for (size_t i = block_begin(count, P, b); i < block_begin(count, P, b + 1); ++i)
          check_sum(x, dst.f()[i], ring_sum(P, b, i, i),
                    "all_reduce[" + std::to_string(i) + "] of " + std::to_string(count));
      x.result_hash = fnv(dst.host.data(), dst.host.size(), x.result_hash);
    }
  }
  for (size_t n : {size_t{1}, size_t{1000}, size_t{65537}}) {
    Buf send(n * P * 4), recv(n * 4);
    for (size_t i = 0; i < n * P; ++i) send.f()[i] = value(x.rank, i);
    send.upload();
    ok(x, g_api->reduce_scatter_sum_f32(x.c(), static_cast<float*>(send.ptr()),
                                        static_cast<float*>(recv.ptr()), n, 0),
       "reduce_scatter " + std::to_string(n));
    recv.download();
    for (size_t i = 0; i < n; ++i)
      check_sum(x, recv.f()[i], ring_sum(P, x.rank, i, x.rank * n + i),
                "reduce_scatter[" + std::to_string(i) + "]");
  }
  for (size_t bytes : {size_t{0}, size_t{1}, size_t{12345}}) {
    Buf mine(bytes), all(bytes * P);
    fill(mine, x.rank, 40);
    ok(x, g_api->all_gather(x.c(), mine.ptr(), all.ptr(), bytes, 0), "all_gather");
    all.download();
    for (int q = 0; q < P; ++q)
      for (size_t i = 0; i < bytes; ++i)
        CHECK(all.host[q * bytes + i] == pattern(q, 40, i), "all_gather block " +
                                                                 std::to_string(q));
    x.result_hash = fnv(all.host.data(), all.host.size(), x.result_hash);
  }
  for (int i = 0; i < 20; ++i) ok(x, g_api->barrier(x.c(), 0), "barrier");
  // A barrier really waits: rank 0 enters late, nobody may leave before it entered. The times
  // are CLOCK_MONOTONIC (steady_clock), one clock for every process of this host; each rank's
  // (entered, left) goes round in an all_gather, so a rank that leaves late is no false alarm.
  auto now_ns = [] {
    return static_cast<int64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                    std::chrono::steady_clock::now().time_since_epoch())
                                    .count());
  };
  if (x.rank == 0) std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const int64_t entered = now_ns();
  ok(x, g_api->barrier(x.c(), 0), "late barrier");
  const int64_t left = now_ns();
  Buf times(2 * sizeof(int64_t)), all_times(2 * sizeof(int64_t) * P);
  std::memcpy(times.host.data(), &entered, sizeof entered);
  std::memcpy(times.host.data() + sizeof entered, &left, sizeof left);
  times.upload();
  ok(x, g_api->all_gather(x.c(), times.ptr(), all_times.ptr(), times.host.size(), 0),
     "all_gather of barrier times");
  all_times.download();
  int64_t rank0_entered = 0;
  std::memcpy(&rank0_entered, all_times.host.data(), sizeof rank0_entered);
  CHECK(left >= rank0_entered, "left the barrier " + std::to_string((rank0_entered - left) / 1e6) +
                                   " ms before rank 0 entered it");
}

// all_to_all (the optional member, head-parallel attention): the ranks split into groups of 2
// (with odd P the last group has 3 ranks; with P = 1 one group of 1), every member sends each
// other member (and itself) a message whose length depends on (sender, receiver), some empty,
// in a shuffled group order; disjoint groups run at the same time; 30 rounds so the ordering
// between rounds is exercised. Errors: the caller outside the group, a rank twice.
void all_to_all(Ctx& x) {
  if (!g_api->all_to_all) fail("the plugin has no all_to_all");
  const int P = x.world;
  // Groups of 2 consecutive ranks; with odd P the last group takes 3.
  int first = (x.rank / 2) * 2, size = 2;
  if (P % 2 == 1 && x.rank >= P - 3) first = std::max(0, P - 3), size = std::min(P, 3);
  std::vector<int> group;
  for (int i = size - 1; i >= 0; --i) group.push_back(first + i);  // not in rank order
  auto length = [](int from, int to, int round) {
    return static_cast<size_t>((from * 7 + to * 13 + round * 5) % 23) * 97;
  };
  for (int round = 0; round < 30; ++round) {
    std::vector<size_t> so(size), sb(size), ro(size), rb(size);
    size_t st = 0, rt = 0;
    for (int i = 0; i < size; ++i) {
      so[i] = st, sb[i] = length(x.rank, group[i], round), st += sb[i] + 3;  // gaps between
      ro[i] = rt, rb[i] = length(group[i], x.rank, round), rt += rb[i] + 5;
    }
    Buf send(st), recv(rt, 0xee);
    for (int i = 0; i < size; ++i)
      for (size_t k = 0; k < sb[i]; ++k)
        send.host[so[i] + k] = pattern(x.rank, 1000 + round * 64 + group[i], k);
    send.upload();
    recv.upload();
    ok(x, g_api->all_to_all(x.c(), group.data(), size, send.ptr(), so.data(), sb.data(),
                            recv.ptr(), ro.data(), rb.data(), 0),
       "all_to_all round " + std::to_string(round));
    recv.download();
    for (int i = 0; i < size; ++i) {
      for (size_t k = 0; k < rb[i]; ++k)
        CHECK(recv.host[ro[i] + k] == pattern(group[i], 1000 + round * 64 + x.rank, k),
              "all_to_all byte " + std::to_string(k) + " from rank " + std::to_string(group[i]));
      for (size_t k = 0; k < 5; ++k)
        CHECK(recv.host[ro[i] + rb[i] + k] == 0xee, "all_to_all wrote past a receive region");
    }
    x.result_hash = fnv(&round, sizeof round, x.result_hash);
  }
  // The caller must be in the group; a rank may not appear twice.
  std::vector<int> others;
  for (int r = 0; r < P; ++r)
    if (r != x.rank) others.push_back(r);
  size_t zero[4] = {0, 0, 0, 0};
  if (!others.empty())
    CHECK(g_api->all_to_all(x.c(), others.data(), 1, nullptr, zero, zero, nullptr, zero, zero,
                            0) == RING_TRANSPORT_ERR_INVALID_ARGUMENT,
          "all_to_all without the caller is refused");
  const int twice[2] = {x.rank, x.rank};
  CHECK(g_api->all_to_all(x.c(), twice, 2, nullptr, zero, zero, nullptr, zero, zero, 0) ==
            RING_TRANSPORT_ERR_INVALID_ARGUMENT,
        "all_to_all with a rank twice is refused");
}

// Runs ring exchanges and all-reduces until killed or a peer fails. Writes ready-<rank> after
// the first round so the parent knows the exchange is under way.
void kill_victim_loop(Ctx& x) {
  const int next = (x.rank + 1) % x.world, prev = (x.rank + x.world - 1) % x.world;
  ok(x, g_api->connect(x.c(), nullptr, 0, 0), "connect all");
  const size_t n = 1 << 20;
  Buf a(n), b(n), grad(1 << 16);
  for (int step = 0; step < 100000; ++step) {
    auto rr = irecv(x, b, n, prev, 50);
    auto sr = isend(x, a, n, next, 50);
    wait(x, rr, "exchange recv (step " + std::to_string(step) + ")");
    wait(x, sr, "exchange send (step " + std::to_string(step) + ")");
    ok(x, g_api->all_reduce_sum_f32(x.c(), static_cast<float*>(grad.ptr()),
                                    static_cast<float*>(grad.ptr()), 1 << 14, 0),
       "all_reduce (step " + std::to_string(step) + ")");
    if (step == 3) std::ofstream(x.dir + "/ready-" + std::to_string(x.rank)) << "ready\n";
  }
  fail("kill: ran 100000 steps without being stopped");
}

// Two ranks. Rank 1 dies right after the bootstrap, before anything was sent to it; once the
// parent has seen it gone (DIR/victim-gone), rank 0 sends to it. The endpoint is created on
// that first send, to a process that no longer exists: a peer failure (exit 3), not an
// internal error and not a hang.
void dead_before_first_send(Ctx& x) {
  CHECK(x.world == 2, "dead_before_first_send runs with 2 ranks");
  if (x.rank == 1) {
    std::ofstream(x.dir + "/ready-1") << "ready\n";
    raise(SIGKILL);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!std::filesystem::exists(x.dir + "/victim-gone")) {
    CHECK(std::chrono::steady_clock::now() < deadline, "the parent never said rank 1 is gone");
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  Buf b(4096);
  auto sr = isend(x, b, 4096, 1, 7);
  wait(x, sr, "send to rank 1, dead before the first message");
  fail("a send to a dead rank succeeded");
}

// arm_wakeup (transport.h): every rank posts a receive from prev, sleeps on the armed fd, sends
// to next after ~100 ms, then sleeps on the fd until its receive completes. Sizes across the
// eager, bcopy and rendezvous protocols (each needs several wake-ups: request, data, answer). A
// missed wake-up shows as a poll that sleeps its whole 20 s bound with the receive unfinished
// (generous: a loaded CI host may stall a peer for seconds).
// Transports without arm_wakeup (or that say UNSUPPORTED) pass with that noted in the result.
void wakeup(Ctx& x) {
  if (!g_api->arm_wakeup) {
    x.result_hash = fnv("absent", 6);
    return;
  }
  const int next = (x.rank + 1) % x.world, prev = (x.rank + x.world - 1) % x.world;
  using Clock = std::chrono::steady_clock;
  // Arms (test() rounds while events are pending) and sleeps up to `ms`; false if UNSUPPORTED.
  auto sleep_armed = [&](ring_transport_request_t* r, int* done, int ms, bool* woke) {
    for (;;) {
      size_t bytes = 0;
      ok(x, g_api->test(x.c(), r, done, &bytes), "test");
      if (*done) return true;
      int fd = -1;
      ring_transport_status_t s = g_api->arm_wakeup(x.c(), &fd);
      if (s == RING_TRANSPORT_ERR_UNSUPPORTED) return false;
      ok(x, s, "arm_wakeup");
      if (fd < 0) continue;  // events pending: progress again
      pollfd p{fd, POLLIN, 0};
      int n = ::poll(&p, 1, ms);
      *woke = n > 0;
      return true;
    }
  };
  const size_t sizes[] = {64, 65536, 4u << 20};
  int probe_fd = -1;
  const bool supported = g_api->arm_wakeup(x.c(), &probe_fd) != RING_TRANSPORT_ERR_UNSUPPORTED;
  for (int round = 0; round < 3 && !supported; ++round) {  // the same messages, without sleeping
    const size_t n = sizes[round];
    Buf in(n), out(n);
    fill(out, x.rank, round);
    ring_transport_request_t* rr = irecv(x, in, n, prev, 40 + round);
    wait(x, isend(x, out, n, next, 40 + round), "send (no wake-up)");
    wait(x, rr, "receive (no wake-up)");
    verify(in, n, prev, round, "receive (no wake-up)");
  }
  if (!supported) {
    x.result_hash = fnv("unsupported", 11);
    return;
  }
  for (int round = 0; round < 3; ++round) {
    const size_t n = sizes[round];
    const uint32_t tag = 40 + round;
    Buf in(n), out(n);
    fill(out, x.rank, round);
    ring_transport_request_t* rr = irecv(x, in, n, prev, tag);
    int done = 0;
    bool woke = false;
    const auto send_at = Clock::now() + std::chrono::milliseconds(100);
    while (!done && Clock::now() < send_at) {
      const int left = static_cast<int>(
          std::chrono::duration_cast<std::chrono::milliseconds>(send_at - Clock::now()).count());
      CHECK(sleep_armed(rr, &done, std::max(left, 0), &woke),
            "arm_wakeup became UNSUPPORTED mid-run");
    }
    ring_transport_request_t* sr = isend(x, out, n, next, tag);
    int sleeps = 0;
    while (!done) {
      CHECK(sleep_armed(rr, &done, 20000, &woke), "arm_wakeup became UNSUPPORTED mid-run");
      if (done) break;
      CHECK(woke, "slept 20 s on the armed fd with the receive of " + std::to_string(n) +
                      " bytes from rank " + std::to_string(prev) + " unfinished (missed wake-up)");
      ++sleeps;
    }
    verify(in, n, prev, round, "wakeup receive");
    wait(x, sr, "wakeup send");
    std::fprintf(stderr, "rank %d: %zu bytes: %d wake-ups\n", x.rank, n, sleeps);
  }
  x.result_hash = fnv("woke", 4);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 6) {
    std::fprintf(stderr, "usage: %s <transport> <rank> <world> <dir> <scenario>\n", argv[0]);
    return 2;
  }
  std::string scenario = argv[5];
  ring_transport_config_t cfg{};
  cfg.rank = g_rank = std::atoi(argv[2]);
  cfg.world_size = std::atoi(argv[3]);
  cfg.rendezvous = argv[4];
  cfg.bootstrap_timeout_ms = 30000;
  // Peer failures must be found by detection, not by this timeout: keep it above the test's
  // bound for the kill scenario.
  cfg.op_timeout_ms = 30000;
  cfg.device = -1;
  try {
    TransportPlugin plugin = TransportPlugin::load(argv[1]);
    g_api = &plugin.api();
    g_device = g_api->caps & RING_TRANSPORT_CAP_DEVICE_MEMORY;
#ifndef RING_HELPER_CUDA
    if (g_device) {
      std::fprintf(stderr, "helper built without CUDA cannot test a device-memory transport\n");
      return 2;
    }
#endif
    TransportComm comm(plugin, cfg);
    Ctx x{&comm, cfg.rank, cfg.world_size, argv[4]};
    if (scenario == "ordering") ordering(x);
    else if (scenario == "edge") edge(x);
    else if (scenario == "large") large(x);
    else if (scenario == "many") many(x);
    else if (scenario == "ring") ring_exchange(x);
    else if (scenario == "collectives") collectives(x);
    else if (scenario == "all_to_all") all_to_all(x);
    else if (scenario == "kill") kill_victim_loop(x);
    else if (scenario == "dead_before_first_send") dead_before_first_send(x);
    else if (scenario == "wakeup") wakeup(x);
    else {
      std::fprintf(stderr, "unknown scenario %s\n", scenario.c_str());
      return 2;
    }
    // Nobody finalizes while a peer still needs its messages. Point to point, not a barrier: a
    // collective fails as soon as ANY rank is gone, so a rank that left its final barrier early
    // (and exited) could fail a slower rank's barrier; a p2p wait fails only on its own peer, and
    // a message sent just before its sender exits is still delivered. Every rank tells rank 0
    // it is done; rank 0 releases each once all are done.
    exit_handshake(x);
    std::ofstream(x.dir + "/result-" + std::to_string(x.rank)) << x.result_hash << "\n";
  } catch (const TransportError& e) {
    std::fprintf(stderr, "rank %d: %s\n", g_rank, e.what());
    return e.status() == RING_TRANSPORT_ERR_PEER_FAILED ? 3
           : e.status() == RING_TRANSPORT_ERR_TIMEOUT  ? 4
                                                       : 2;
  }
  return 0;
}
