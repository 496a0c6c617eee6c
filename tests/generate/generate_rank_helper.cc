// One rank of a sharded generation for generate_ring_test.cc:
//   generate_rank_helper key=value...
// keys: rank, ranks, dir (rendezvous), out (result file), tokens, docs, seed, batch, prefix (common
// prefix tokens), vary (prompt b is b x vary tokens shorter), steps (greedy decode steps), page,
// fast (bytes), host (bytes), disk (directory or empty), window (-1: a page), balance
// (zigzag|contiguous), threads, device (none: the fast pool in host memory; cpu: a second cpu
// backend holds it, fast_on_backend's code path; renamed: a backend other than cpu standing in
// for a GPU, renamed_backend.h: the fast tier and the decode step's dense ops on it, the prefill
// on the cpu backend, as a rank of `ringctl generate --ranks P --backend cuda` runs), dtype
// (fp32|bf16: the model's dtype; bf16 also puts the prefill's K/V on the ring in bf16). Every
// prompt is prefilled over the ranks, then `steps` tokens are decoded for the whole batch; rank
// 0's greedy choice is the next token of every rank. The result file (raw):
//   int64 batch, int64 rows (steps + 1), then per prompt: int32 tokens [prompt + steps],
//   float logits [rows, vocab] (the prompt's last token, then each step), then int64 stats:
//   local tokens per prompt [batch], shared page hits, fast tasks, host tasks, disk tasks,
//   promotions, fast peak bytes, fast bytes limit, device rows (fast pages' partials by the
//   backend's kernel), fast pool on the device (0/1).
// Exit: 0 ok, 1 transport failure, 2 usage, 3 other errors.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <optional>
#include <string>

#include "tests/generate/generate_ring_util.h"
#include "tests/generate/renamed_backend.h"
#include "worker/generate/generator.h"
#include "worker/generate/ring_generate.h"
#include "worker/ring/ring_rank.h"

using namespace ring;
using namespace ring::gen;

namespace {

// `test` is generate_ring_util.h's namespace (using namespace ring makes ring::test, the tests'
// common fixtures, visible too).
namespace test = ring::gen::test;

int run(const std::map<std::string, std::string>& kv) {
  auto get = [&](const std::string& k, const std::string& def) {
    auto it = kv.find(k);
    return it == kv.end() ? def : it->second;
  };
  auto num = [&](const std::string& k, int64_t def) {
    return std::stoll(get(k, std::to_string(def)));
  };
  const int rank = static_cast<int>(num("rank", 0)), ranks = static_cast<int>(num("ranks", 1));
  const int steps = static_cast<int>(num("steps", 8)), batch = static_cast<int>(num("batch", 1));
  const std::string out = get("out", "");
  auto cfg = test::tiny_model_config();
  const std::string dtype = get("dtype", "fp32");
  if (dtype != "fp32" && dtype != "bf16") {
    std::fprintf(stderr, "generate_rank_helper: dtype '%s': fp32 or bf16\n", dtype.c_str());
    return 2;
  }
  if (dtype == "bf16") cfg.dtype = spec::DType::kBf16;
  auto backend = test::cpu(static_cast<int>(num("threads", 1)));
  const std::vector<float> params = test::tiny_params(cfg, backend.get(), 7, test::kSharpQK);
  const auto prompts = test::ring_prompts(num("tokens", 1000), static_cast<int>(num("docs", 4)),
                                          static_cast<uint64_t>(num("seed", 5)), batch,
                                          num("prefix", 0), num("vary", 0));
  GeneratorOptions go;
  go.threads = static_cast<int>(num("threads", 1));
  go.cache.page_tokens = num("page", 64);
  go.cache.fast_bytes = num("fast", 0);
  go.cache.host_bytes = num("host", 0);
  go.cache.disk_dir = get("disk", "");
  go.cache.window = num("window", 0);
  // The device standing in for a GPU: its own backend instance, as a rank's GPU would be.
  std::unique_ptr<kernels::Backend> device;
  const std::string dev = get("device", "none");
  if (dev == "cpu") {
    device = test::cpu(static_cast<int>(num("threads", 1)));
  } else if (dev == "renamed") {
    device = std::make_unique<Renamed>(test::cpu(static_cast<int>(num("threads", 1))), true);
  } else if (dev != "none") {
    std::fprintf(stderr, "generate_rank_helper: device '%s': none, cpu or renamed\n", dev.c_str());
    return 2;
  }
  go.device = device.get();
  // Declared before the generator: on a transport error nothing they own is destroyed.
  std::optional<GenerateRing> ring;
  if (ranks > 1) {
    RingOptions ro;
    ro.rank = rank;
    ro.ranks = ranks;
    ro.rendezvous = get("dir", "");
    ro.bootstrap_timeout_ms = 60000;
    ro.timeout_ms = 120000;
    ro.wire = dtype == "bf16" ? kernels::DType::kBF16 : kernels::DType::kF32;
    ro.head_ranks = static_cast<int>(num("head_ranks", 1));
    ring.emplace(backend.get(), ro);
    go.shard =
        ring->shard(get("balance", "zigzag") == "contiguous" ? spec::CausalBalance::kContiguous
                                                             : spec::CausalBalance::kZigzag);
  }
  std::optional<Generator> g;
  return cp::run_then_exit_on_error("generate_rank_helper rank " + std::to_string(rank), 1, [&] {
    g.emplace(cfg, params.data(), backend.get(), go);
    std::vector<std::vector<int32_t>> full;
    std::vector<std::vector<float>> logits(prompts.size());
    std::vector<int> handles;
    std::vector<int32_t> next;
    int64_t fast_peak = 0;
    auto choose = [&](const float* row) {
      return static_cast<int32_t>(std::max_element(row, row + cfg.vocab) - row);
    };
    // Rank 0's choices are every rank's.
    auto agree = [&](std::vector<int32_t>* t) {
      if (!ring) return;
      std::vector<int32_t> all(t->size() * static_cast<size_t>(ranks));
      ring->all_gather(t->data(), all.data(), t->size() * sizeof(int32_t));
      std::copy(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(t->size()), t->begin());
    };
    for (const auto& p : prompts) {
      std::vector<float> l;
      handles.push_back(g->prefill(p.ids, p.docs, &l));
      logits[full.size()] = l;
      full.push_back(p.ids);
      next.push_back(choose(l.data()));
    }
    agree(&next);
    for (int s = 0; s < steps; ++s) {
      std::vector<float> l;
      g->step(handles, next, &l);
      for (size_t b = 0; b < prompts.size(); ++b) {
        full[b].push_back(next[b]);
        const float* row = l.data() + static_cast<int64_t>(b) * cfg.vocab;
        logits[b].insert(logits[b].end(), row, row + cfg.vocab);
        next[b] = choose(row);
      }
      agree(&next);
      fast_peak = std::max(fast_peak, g->cache().stats().fast_peak_bytes);
    }
    std::ofstream f(out, std::ios::binary);
    auto put64 = [&](int64_t x) { f.write(reinterpret_cast<const char*>(&x), sizeof(x)); };
    put64(batch);
    put64(steps + 1);
    for (size_t b = 0; b < prompts.size(); ++b) {
      f.write(reinterpret_cast<const char*>(full[b].data()),
              static_cast<std::streamsize>(full[b].size() * sizeof(int32_t)));
      f.write(reinterpret_cast<const char*>(logits[b].data()),
              static_cast<std::streamsize>(logits[b].size() * sizeof(float)));
    }
    for (int h : handles) put64(g->local_length(h));
    const CacheStats cs = g->cache().stats();
    const DecodeStats& ds = g->decode_stats();
    for (int64_t x : {cs.shared_hits, ds.fast_tasks, ds.host_tasks, ds.disk_tasks, cs.promotions,
                      fast_peak, go.cache.fast_bytes, ds.device_rows,
                      static_cast<int64_t>(cs.fast_on_device)})
      put64(x);
    f.close();
    if (!f) throw std::runtime_error("cannot write " + out);
    for (int h : handles) g->release(h);
    if (ring) ring->shutdown();
    return 0;
  });
}

}  // namespace

int main(int argc, char** argv) {
  std::map<std::string, std::string> kv;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const size_t eq = a.find('=');
    if (eq == std::string::npos) {
      std::fprintf(stderr, "generate_rank_helper: '%s': expected key=value\n", argv[i]);
      return 2;
    }
    kv[a.substr(0, eq)] = a.substr(eq + 1);
  }
  try {
    return run(kv);
  } catch (const transport::TransportError& e) {
    std::fprintf(stderr, "generate_rank_helper: %s\n", e.what());
    std::fflush(stderr);
    _exit(1);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "generate_rank_helper: %s\n", e.what());
    std::fflush(stderr);
    _exit(3);
  }
}
