#include "daemon/ringd/step_driver.h"

#include <algorithm>
#include <cstring>

#include <fmt/format.h>

namespace ring::ringd {

using Clock = std::chrono::steady_clock;

uint64_t fnv1a(const void* data, size_t bytes) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < bytes; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

ckpt::LoadResult load_agreed_checkpoint(const std::string& dir, int node_rank, int nodes,
                                        const std::vector<ckpt::LoadTarget>& targets,
                                        int64_t max_step, optim::Exchange& ex,
                                        const ckpt::Layout* job) {
  ckpt::LoadResult r = ckpt::load_latest(dir, node_rank, nodes, targets, max_step, job);
  if (nodes == 1) return r;
  // Every node must resume from the same step: the smallest one any node loaded.
  int64_t mine = r.loaded ? r.step : -1;
  auto all = ex.allgather(&mine, sizeof(mine));
  int64_t least = mine;
  std::string without;
  for (size_t n = 0; n < all.size(); ++n) {
    int64_t v;
    std::memcpy(&v, all[n].data(), sizeof(v));
    least = std::min(least, v);
    if (v < 0) without += (without.empty() ? "" : ", ") + std::to_string(n);
  }
  if (least < 0 && r.loaded) {
    // A resume loads on every node or on none: never some nodes from a checkpoint and the
    // others from fresh weights.
    r.loaded = false;
    r.message = "node(s) " + without + " found no usable checkpoint in " + dir +
                " (this node could load " + ckpt::step_dir_name(r.step) + ")";
  } else if (least >= 0 && least != mine) {
    r = ckpt::load_latest(dir, node_rank, nodes, targets, least, job);
  }
  return r;
}

void StepDriver::reset() {
  cur_step_ = 0;
  last_all_changed_ = true;
  publish_all_ = true;
  have_master_ = false;
  done_step_ = 0;
  cursor_ = nlohmann::json();
}

void StepDriver::resumed(int64_t step, nlohmann::json cursor) {
  have_master_ = true;
  done_step_ = step;
  cursor_ = std::move(cursor);
}

void StepDriver::init_master(optim::NodeOptimizer& opt, const contract::ShmRegion& shm) {
  opt.init_master(shm.params(), shm.params_begin());
  have_master_ = true;
}

int64_t StepDriver::begin_step(std::vector<Worker>& workers, contract::ShmRegion& shm,
                               optim::NodeOptimizer& opt) {
  const int64_t s = done_step_ + 1;
  int64_t changed = -1;
  // The optimizer writes the new weights straight into the shared memory at every finish_step.
  opt.set_weights_buffer(shm.params(), shm.params_begin());
  if (publish_all_) {
    // The first step of the attempt (workers start from nothing): every weight, gathered from
    // the owners with shard optimizer.
    opt.publish_all();
    publish_all_ = false;
  } else if (!last_all_changed_) {
    const std::vector<int64_t>& ch = opt.changed();
    uint64_t* idx = shm.index();
    for (size_t i = 0; i < ch.size(); ++i) idx[i] = static_cast<uint64_t>(ch[i]);
    changed = static_cast<int64_t>(ch.size());
  }
  for (Worker& w : workers) {
    w.buckets = 0;
    w.done = false;
  }
  cur_step_ = s;
  buckets_ready_ = 0;
  opt.begin_step(s);
  step_t0_ = Clock::now();
  return changed;
}

std::string StepDriver::on_bucket(std::vector<Worker>& workers, Worker& w, int b,
                                  const contract::ShmRegion& shm, optim::NodeOptimizer& opt,
                                  const std::function<void()>& before_update) {
  const int nb = static_cast<int>(layout_.buckets().size());
  if (b != w.buckets || b >= nb) return fmt::format("sent bucket {} when {} was due", b, w.buckets);
  ++w.buckets;
  while (buckets_ready_ < nb &&
         std::all_of(workers.begin(), workers.end(),
                     [&](const Worker& x) { return x.buckets > buckets_ready_; })) {
    const contract::GradBucket& bk = layout_.buckets()[buckets_ready_];
    if (full_) {
      // Shard full: each worker's slot holds its shard of the job's sum; outside the range
      // nothing is this node's.
      float* dst = nullptr;
      if (bk.begin >= range_.begin && bk.end <= range_.end && bk.end > bk.begin) {
        dst = node_grad_.data() + (bk.begin - range_.begin);
        for (size_t l = 0; l < workers.size() && l < shards_.size(); ++l) {
          const int64_t lo = std::max(bk.begin, shards_[l].begin);
          const int64_t hi = std::min(bk.end, shards_[l].end);
          if (hi > lo)
            std::memcpy(dst + (lo - bk.begin), shm.grads(static_cast<int>(l)) + (lo - shards_[l].begin),
                        static_cast<size_t>(hi - lo) * sizeof(float));
        }
      }
      before_update();
      opt.bucket_ready(bk.index, dst);
      ++buckets_ready_;
      continue;
    }
    float* dst = node_grad_.data() + bk.begin;
    const int64_t len = bk.end - bk.begin;
    // The node's gradient: the workers' slots summed in local-rank order (deterministic).
    std::memcpy(dst, shm.grads(0) + bk.begin, static_cast<size_t>(len) * sizeof(float));
    for (int l = 1; l < static_cast<int>(workers.size()); ++l) {
      const float* src = shm.grads(l) + bk.begin;
      for (int64_t i = 0; i < len; ++i) dst[i] += src[i];
    }
    before_update();
    opt.bucket_ready(bk.index, dst);
    ++buckets_ready_;
  }
  return "";
}

bool StepDriver::step_complete(const std::vector<Worker>& workers) const {
  const int nb = static_cast<int>(layout_.buckets().size());
  if (cur_step_ == 0 || buckets_ready_ < nb) return false;
  return std::all_of(workers.begin(), workers.end(), [](const Worker& x) { return x.done; });
}

StepDriver::Finished StepDriver::finish_step(const std::vector<Worker>& workers,
                                             optim::NodeOptimizer& opt, int attempt) {
  Finished f;
  f.result = opt.finish_step();
  const optim::StepResult& r = f.result;
  f.wall_s = std::chrono::duration<double>(Clock::now() - step_t0_).count();
  done_step_ = cur_step_;
  cur_step_ = 0;
  last_all_changed_ = r.all_changed;
  f.done = workers[0].done_msg;
  const contract::control::Done& d = f.done;
  cursor_ = d.cursor;
  // loss_sum is NaN when the worker's loss was NaN or infinite (JSON null).
  contract::StepStats& st = f.stats;
  st.step = done_step_;
  st.loss = d.valid > 0 ? d.loss_sum / static_cast<double>(d.valid) : 0.0;
  st.tokens = d.tokens;
  st.valid = d.valid;
  st.grad_norm = r.grad_norm;
  st.lr = r.lr;
  st.step_ms = f.wall_s * 1e3;
  st.tokens_per_s = f.wall_s > 0 ? d.tokens / f.wall_s : 0;
  nlohmann::json& j = f.record;
  j = nlohmann::json::parse(contract::step_json(st));
  j["attempt"] = attempt;
  j["comm_s"] = d.ring_wait_ms / 1e3;
  j["optimizer_s"] = r.optimizer_s;
  j["exposed_optimizer_s"] = r.exposed_s;
  j["bytes_exchanged"] = r.bytes_sent;
  j["bytes_weights"] = r.bytes_weights;
  j["bytes_dense"] = r.bytes_dense;
  j["compressed"] = r.compressed;
  return f;
}

void StepDriver::record(const ckpt::SaveResult& r) {
  if (r.ok) {
    ckpt_ok_.insert(r.step);
    ckpt_failed_.erase(r.step);
  } else if (!ckpt_ok_.count(r.step)) {
    ckpt_failed_[r.step] = r.error;
  }
}

const std::string* StepDriver::failed_at_done_step() const {
  auto it = ckpt_failed_.find(done_step_);
  if (done_step_ <= 0 || it == ckpt_failed_.end() || ckpt_ok_.count(done_step_)) return nullptr;
  return &it->second;
}

}  // namespace ring::ringd
