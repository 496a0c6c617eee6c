// The NCCL transport plugin (plugins/transport/nccl) on a real GPU: a one-rank communicator
// sends to and receives from itself (NCCL queues the pair as one group on the plugin's own
// stream) and runs the collectives on device buffers allocated through the CUDA backend.
// Without a GPU the plugin must still load and say why it cannot run (ProbeSaysWhy runs
// everywhere); the rest skips with that reason.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "plugins/transport/loader.h"

namespace {

using ring::transport::TransportPlugin;

std::string probe_reason(const TransportPlugin& p) {
  char why[512] = {0};
  return p->probe(why, sizeof(why)) == RING_TRANSPORT_OK ? std::string() : std::string(why);
}

TEST(NcclTransport, ProbeSaysWhy) {
  TransportPlugin p = TransportPlugin::load("nccl");
  EXPECT_EQ(p.name(), "nccl");
  EXPECT_TRUE(p->caps & RING_TRANSPORT_CAP_DEVICE_MEMORY);
  const std::string why = probe_reason(p);
  if (!why.empty()) {
    EXPECT_NE(why.find("CUDA"), std::string::npos) << why;
    // init refuses the same way, without touching the rendezvous or crashing.
    ring_transport_config_t cfg{};
    cfg.rank = 0;
    cfg.world_size = 1;
    cfg.rendezvous = "/nonexistent/never-created";
    cfg.device = -1;
    ring_transport_comm_t* comm = nullptr;
    EXPECT_EQ(p->init(&cfg, &comm), RING_TRANSPORT_ERR_UNSUPPORTED);
    EXPECT_EQ(comm, nullptr);
    EXPECT_NE(std::string(p->last_error(nullptr)).find("CUDA"), std::string::npos);
  }
}

TEST(NcclTransport, SelfSendRecvAndCollectivesOnOneGpu) {
  TransportPlugin p = TransportPlugin::load("nccl");
  if (std::string why = probe_reason(p); !why.empty()) GTEST_SKIP() << "nccl: " << why;
  std::string err;
  auto be = ring::kernels::create_backend("cuda", 0, &err);
  if (!be) GTEST_SKIP() << "no CUDA backend: " << err;

  const auto dir =
      std::filesystem::temp_directory_path() / ("ring-nccl-test-" + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  ring_transport_config_t cfg{};
  cfg.rank = 0;
  cfg.world_size = 1;
  const std::string rdv = dir.string();
  cfg.rendezvous = rdv.c_str();
  cfg.bootstrap_timeout_ms = 20000;
  cfg.op_timeout_ms = 20000;
  cfg.device = -1;
  ring_transport_comm_t* comm = nullptr;
  ASSERT_EQ(p->init(&cfg, &comm), RING_TRANSPORT_OK) << p->last_error(nullptr);

  const size_t n = 1 << 20;
  std::vector<float> host(n);
  std::iota(host.begin(), host.end(), 0.f);
  void *src = nullptr, *dst = nullptr;
  ASSERT_EQ(be->alloc(n * 4, &src), ring::kernels::Status::kOk);
  ASSERT_EQ(be->alloc(n * 4, &dst), ring::kernels::Status::kOk);
  ASSERT_EQ(be->copy_to_device(src, host.data(), n * 4), ring::kernels::Status::kOk);
  ASSERT_EQ(be->fill(n, -1.f, static_cast<float*>(dst)), ring::kernels::Status::kOk);
  ASSERT_EQ(be->synchronize(), ring::kernels::Status::kOk);

  ring_transport_request_t *rs = nullptr, *rr = nullptr;
  ASSERT_EQ(p->irecv(comm, dst, n * 4, 0, 7, &rr), RING_TRANSPORT_OK) << p->last_error(comm);
  ASSERT_EQ(p->isend(comm, src, n * 4, 0, 7, &rs), RING_TRANSPORT_OK) << p->last_error(comm);
  size_t got = 0;
  ASSERT_EQ(p->wait(comm, rs, 0, nullptr), RING_TRANSPORT_OK) << p->last_error(comm);
  ASSERT_EQ(p->wait(comm, rr, 0, &got), RING_TRANSPORT_OK) << p->last_error(comm);
  EXPECT_EQ(got, n * 4);
  std::vector<float> back(n);
  ASSERT_EQ(be->copy_to_host(back.data(), dst, n * 4), ring::kernels::Status::kOk);
  EXPECT_EQ(back, host);

  // One rank: the sum is the input, the gather is the input.
  ASSERT_EQ(p->all_reduce_sum_f32(comm, static_cast<float*>(src), static_cast<float*>(dst), n, 0),
            RING_TRANSPORT_OK)
      << p->last_error(comm);
  ASSERT_EQ(be->copy_to_host(back.data(), dst, n * 4), ring::kernels::Status::kOk);
  EXPECT_EQ(back, host);
  ASSERT_EQ(p->barrier(comm, 0), RING_TRANSPORT_OK) << p->last_error(comm);
  EXPECT_EQ(p->finalize(comm), RING_TRANSPORT_OK);
  be->free(src);
  be->free(dst);
  std::filesystem::remove_all(dir);
}

}  // namespace
