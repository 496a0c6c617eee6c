#include "worker/generate/ring_generate.h"

#include <filesystem>
#include <system_error>

#include <fmt/format.h>

#include "common/contract/timeline.h"

#include "worker/ring/head_attention.h"
#include "worker/ring/ring_attention.h"
#include "worker/ring/ring_rank.h"

namespace ring::gen {

GenerateRing::GenerateRing(kernels::Backend* backend, const RingOptions& o) : options_(o) {
  if (o.ranks < 1 || o.rank < 0 || o.rank >= o.ranks)
    throw GenerateError(fmt::format("rank {} of {} ranks (0 <= rank < ranks)", o.rank, o.ranks));
  if (o.rendezvous.empty()) throw GenerateError("the ranks need a rendezvous directory");
  // Ranks arriving in any order find the directory (the transport reports one it cannot use).
  std::error_code ec;
  std::filesystem::create_directories(o.rendezvous, ec);
  spec::JobSpec spec;  // natural ring order, one replica
  spec.parallel.context_ranks = o.ranks;
  cp::RankOptions ro;
  ro.rank = o.rank;
  ro.world = o.ranks;
  ro.replicas = 1;
  ro.rendezvous = o.rendezvous;
  ro.transport = o.transport;
  ro.bootstrap_timeout_ms = o.bootstrap_timeout_ms;
  ro.op_timeout_ms = o.timeout_ms;
  rank_ = std::make_unique<cp::RingRank>(spec, ro);
  cp::RingAttention::Options ao;
  ao.timeout_ms = o.timeout_ms;
  ao.wire = o.wire;
  if (o.head_ranks < 1 || o.ranks % o.head_ranks != 0)
    throw GenerateError(fmt::format("head ranks {} must divide the {} ranks", o.head_ranks,
                                    o.ranks));
  attention_ = cp::make_context_attention(backend, &rank_->progress(), rank_->ring(),
                                          o.head_ranks, ao);
}

GenerateRing::~GenerateRing() {
  attention_.reset();
  rank_.reset();
}

ShardOptions GenerateRing::shard(spec::CausalBalance balance) {
  ShardOptions s;
  s.ranks = options_.ranks;
  s.rank = options_.rank;
  s.balance = balance;
  s.prefill_attention = attention_.get();
  s.all_gather = [this](const void* send, void* recv, size_t bytes) {
    all_gather(send, recv, bytes);
  };
  return s;
}

void GenerateRing::all_gather(const void* send, void* recv, size_t bytes) {
  // Blocked on the other ranks: the flight recorder says so (a hung peer is the one to blame).
  contract::timeline::TimelineWriter* tl = contract::timeline::active();
  if (tl) tl->wait_begin(contract::timeline::Phase::kCollective, tl->step(), -1, -1, -1);
  rank_->all_gather(send, recv, bytes, options_.timeout_ms, "all_gather of decode partials");
  if (tl) tl->wait_end();
}

model::AttentionExecutor* GenerateRing::attention() {
  return attention_.get();
}

void GenerateRing::shutdown() {
  rank_->shutdown();
}

}  // namespace ring::gen
