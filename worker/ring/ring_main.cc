#include "worker/ring/ring_main.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/cli/flags.h"
#include "common/proc/close_fds.h"
#include "common/proc/reap.h"
#include "common/spec/parse.h"
#include "kernels/backend.h"
#include "worker/data/cursor.h"
#include "worker/data/errors.h"
#include "worker/data/loader.h"
#include "worker/data/split.h"
#include "worker/offload/ringd_client.h"
#include "worker/ring/ring_attention.h"
#include "worker/ring/ring_rank.h"
#include "worker/train/trainer.h"

namespace ring::cp {
namespace {

constexpr int kExitUsage = 2;
constexpr int kExitRuntime = 1;

const char* kUsage =
    "usage: ring-worker --spec FILE (--launch-local | --rank R --world P --rendezvous DIR)\n"
    "                   [options]\n"
    "Context parallelism: the spec's sequence split over P = parallel.context_ranks processes\n"
    "that pass K/V blocks around a ring (ring attention); gradients summed over the ranks.\n"
    "  --launch-local        fork the P ranks here (fresh rendezvous dir), wait for them\n"
    "  --rank R --world P    run rank R of P (P must equal parallel.context_ranks)\n"
    "  --rendezvous DIR      directory unique to this ring attempt (file rendezvous)\n"
    "  --transport NAME      transport plugin (default ucx)\n"
    "  --steps N             optimizer steps (default: train.steps)\n"
    "  --threads T           CPU threads per rank (default: resources.cpus_per_worker)\n"
    "  --backend NAME        kernel backend (default: resources.backend)\n"
    "  --stagger-us US       override parallel.stagger_us\n"
    "  --timeout-ms MS       bound on every transfer and collective (default 60000)\n"
    "  --log-json FILE       rank 0: append one JSON object per logged step\n"
    "  --max-corpus-mb M     cap on the text corpus read into memory (default 256)\n"
    "  --ringd SOCKET        run under ringd: weights and optimizer live there; gradients go\n"
    "                        to its shared memory bucket by bucket (spawned by ringd only)\n"
    "  --local-rank L        this rank's slot on its node (with --ringd)\n"
    "  --help\n";

struct Args {
  std::string spec;
  bool launch_local = false;
  int rank = -1;
  int world = -1;
  std::string rendezvous;
  std::string transport = "ucx";
  std::optional<int64_t> steps;
  std::optional<int> threads;
  std::optional<std::string> backend;
  std::optional<int64_t> stagger_us;
  int timeout_ms = 60000;
  std::string log_json;
  int64_t max_corpus_mb = 256;
  std::string ringd;
  int local_rank = -1;
};

[[noreturn]] void usage_error(const std::string& msg) {
  flags::usage_exit("ring-worker", msg, kUsage, kExitUsage);
}

Args parse_args(int argc, char** argv) try {
  Args a;
  flags::FlagSet fs(kUsage);
  fs.text("--spec", &a.spec)
      .toggle("--launch-local", &a.launch_local)
      .integer("--rank", &a.rank, 0, 65535)
      .integer("--world", &a.world, 1, 65536)
      .text("--rendezvous", &a.rendezvous)
      .text("--transport", &a.transport)
      .integer("--steps", &a.steps, 1, int64_t{1} << 40)
      .integer("--threads", &a.threads, 0, 4096)
      .text("--backend", &a.backend)
      .integer("--stagger-us", &a.stagger_us, 0, 1000000)
      .integer("--timeout-ms", &a.timeout_ms, 100, 3600000)
      .text("--log-json", &a.log_json)
      .integer("--max-corpus-mb", &a.max_corpus_mb, 1, 1 << 20)
      .text("--ringd", &a.ringd)
      .integer("--local-rank", &a.local_rank, 0, 65535)
      .unknown_note(" (multi-rank mode)");
  fs.parse(argc, argv);
  if (a.spec.empty()) usage_error("--spec FILE is required");
  if (a.launch_local && (a.rank >= 0 || !a.rendezvous.empty()))
    usage_error("--launch-local chooses ranks and the rendezvous itself: drop --rank/--rendezvous");
  if (!a.launch_local && (a.rank < 0 || a.world < 1 || a.rendezvous.empty()))
    usage_error("a rank needs --rank R, --world P and --rendezvous DIR (or use --launch-local)");
  if (!a.ringd.empty() && (a.launch_local || a.local_rank < 0))
    usage_error("--ringd needs --local-rank L and a rank's flags (ringd spawns such ranks)");
  if (!a.launch_local && a.rank >= a.world)
    usage_error("--rank " + std::to_string(a.rank) + " is not below --world " +
                std::to_string(a.world));
  return a;
} catch (const flags::FlagError& e) {
  usage_error(e.what());
}

std::optional<spec::JobSpec> load(const Args& a) {
  spec::LoadResult loaded = spec::load_spec_file(a.spec);
  for (const auto& d : loaded.diagnostics) std::cerr << d.str() << "\n";
  if (!loaded.ok()) {
    std::cerr << "ring-worker: " << a.spec << ": invalid spec (" << loaded.error_count()
              << " error(s))\n";
    return std::nullopt;
  }
  spec::JobSpec s = *loaded.spec;
  if (s.parallel.data_replicas != 1) {
    std::cerr << "ring-worker: parallel.data_replicas = " << s.parallel.data_replicas
              << ": several rings need ringd (a later issue); this mode runs one ring\n";
    return std::nullopt;
  }
  return s;
}

int run_offloaded_rank(const Args& args, const spec::JobSpec& spec);

// ---- one rank ---------------------------------------------------------------------------------

int run_rank(const Args& args) {
  std::optional<spec::JobSpec> loaded = load(args);
  if (!loaded) return kExitUsage;
  spec::JobSpec spec = *loaded;
  if (spec.parallel.context_ranks != args.world) {
    std::cerr << "ring-worker: --world " << args.world << " but parallel.context_ranks is "
              << spec.parallel.context_ranks << "\n";
    return kExitUsage;
  }
  if (args.stagger_us) spec.parallel.stagger_us = *args.stagger_us;
  if (!args.ringd.empty()) return run_offloaded_rank(args, spec);
  const int rank = args.rank, world = args.world;
  const bool lead = rank == 0;
  const int64_t steps = args.steps.value_or(spec.train.steps);
  const int threads = args.threads.value_or(static_cast<int>(spec.resources.cpus_per_worker));
  const std::string backend_name = args.backend.value_or(spec::to_string(spec.resources.backend));
  std::string err;
  auto backend = kernels::create_backend(backend_name, threads, &err);
  if (!backend) {
    std::cerr << "ring-worker: backend '" << backend_name << "': " << err << "\n";
    return kExitUsage;
  }

  RankOptions ro;
  ro.rank = rank;
  ro.world = world;
  ro.rendezvous = args.rendezvous;
  ro.transport = args.transport;
  ro.op_timeout_ms = args.timeout_ms;
  RingRank rr(spec, ro);
  if (lead && !rr.note().empty()) std::cerr << "ring-worker: note: " << rr.note() << "\n";

  data::CorpusOptions corpus;
  corpus.max_total_bytes = args.max_corpus_mb << 20;
  // Every rank builds the same sequences (same spec, same seed) and keeps its shard.
  std::unique_ptr<data::SequenceSource> source =
      data::make_source(spec.data, data::PasskeyLabels::kAll, corpus);

  RingAttention::Options ao;
  ao.stagger_us = spec.parallel.stagger_us;
  ao.timeout_ms = args.timeout_ms;
  RingAttention attention(backend.get(), &rr.progress(), rr.ring(), ao);
  train::Trainer trainer(spec, backend.get(), &attention, steps);
  trainer.set_grad_reduce(rr.grad_reducer());

  const auto& cfg = trainer.model().config();
  if (lead) {
    std::string order;
    for (int r : rr.ring().order) {
      if (!order.empty()) order += ',';
      order += std::to_string(r);
    }
    std::printf(
        "ring-worker: %s | %d ranks, ring order %s, %s split, stagger %lld us, %s transport | "
        "%s backend, %d threads per rank | %lld layers, d_model %lld, heads %lld/%lld, %lld "
        "parameters%s | seq_len %lld (%lld per rank) | %lld steps\n",
        spec.job.name.c_str(), world, order.c_str(), spec::to_string(spec.parallel.causal_balance),
        static_cast<long long>(spec.parallel.stagger_us), args.transport.c_str(), backend->name(),
        threads, static_cast<long long>(cfg.layers), static_cast<long long>(cfg.d_model),
        static_cast<long long>(cfg.heads), static_cast<long long>(cfg.kv_heads),
        static_cast<long long>(trainer.model().layout().num_params()),
        cfg.recompute ? ", recompute" : "", static_cast<long long>(spec.data.seq_len),
        static_cast<long long>(spec.data.seq_len / world), static_cast<long long>(steps));
    std::fflush(stdout);
  }
  std::ofstream log_json;
  if (lead && !args.log_json.empty()) {
    log_json.open(args.log_json, std::ios::app);
    if (!log_json) {
      std::cerr << "ring-worker: --log-json: cannot open " << args.log_json << "\n";
      return kExitUsage;
    }
  }

  // From here on transfers may be in flight: an error exits at once, without unwinding.
  return run_then_exit_on_error("ring-worker: rank " + std::to_string(rank), kExitRuntime, [&] {
    for (int64_t s = 1; s <= steps; ++s) {
      data::Sequence seq = source->next_sequence();
      data::SequenceShard shard =
          data::shard_sequence(seq, world, rank, spec.parallel.causal_balance);
      const int64_t local_valid = valid_labels(shard);
      const RingStats r0 = attention.ring_stats();
      const double reduce0 = rr.reduce_seconds();
      const auto t0 = std::chrono::steady_clock::now();
      const int64_t global_valid = rr.global_count(local_valid);
      train::StepStats st = trainer.train_step(shard_batch(shard), global_valid);
      const double step_ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      const RingStats& r1 = attention.ring_stats();
      const double ring_wait_ms = (r1.wait_s - r0.wait_s) * 1e3;
      const double reduce_ms = (rr.reduce_seconds() - reduce0) * 1e3;
      st.tokens = seq.size();  // the whole sequence: the ring's throughput
      st.step_ms = step_ms;
      st.tokens_per_s = step_ms > 0 ? st.tokens * 1000.0 / step_ms : 0;
      if (lead && (s % spec.train.log_every == 0 || s == steps || s == 1)) {
        std::printf(
            "%s | comm %.1f ms (ring wait %.1f, grad all-reduce %.1f) | blocks skipped "
            "%lld/%lld | %.1f MB sent\n",
            train::format_step(st).c_str(), ring_wait_ms + reduce_ms, ring_wait_ms, reduce_ms,
            static_cast<long long>(r1.blocks_skipped - r0.blocks_skipped),
            static_cast<long long>(r1.blocks_total - r0.blocks_total),
            (r1.bytes_sent - r0.bytes_sent) / 1e6);
        std::fflush(stdout);
        if (log_json.is_open()) {
          nlohmann::json j = nlohmann::json::parse(train::step_json(st));
          j["ranks"] = world;
          j["comm_ms"] = ring_wait_ms + reduce_ms;
          j["ring_wait_ms"] = ring_wait_ms;
          j["allreduce_ms"] = reduce_ms;
          j["blocks_skipped"] = r1.blocks_skipped - r0.blocks_skipped;
          j["blocks_total"] = r1.blocks_total - r0.blocks_total;
          j["bytes_sent_rank0"] = r1.bytes_sent - r0.bytes_sent;
          log_json << j.dump() << std::endl;
        }
      }
    }

    // Peak memory of every rank, printed by rank 0.
    std::vector<int64_t> peaks(world);
    int64_t mine = peak_rss_bytes();
    rr.progress().collective([&](transport::TransportComm& c) {
      c.check(c.api().all_gather(c.get(), &mine, peaks.data(), sizeof(int64_t), 0),
              "all_gather of peak memory");
    });
    if (lead) {
      std::printf("peak memory (VmHWM) per rank:");
      for (int r = 0; r < world; ++r) std::printf(" %d: %.1f MiB", r, peaks[r] / 1048576.0);
      const kernels::AttentionStats k = attention.stats();
      std::printf(" | rank 0 attention tiles: %lld of %lld skipped\n",
                  static_cast<long long>(k.tiles_skipped), static_cast<long long>(k.tiles_total));
      std::fflush(stdout);
    }
    // Everyone finishes together: a rank that exits early looks like a failed peer to the others.
    rr.shutdown();
    return 0;
  });
}

// ---- one rank under ringd ---------------------------------------------------------------------
//
// The optimizer lives in ringd: per step the rank takes the weights ringd put in shared memory,
// runs forward and backward and hands each gradient bucket to ringd's shm slot the moment the
// backward finishes it (ringd sums the node's slots and updates that bucket while this backward
// goes on). Only the loss and the valid-label count still cross the ring (all_gather), so rank 0
// reports the global loss. No gradient all-reduce between workers.

int run_offloaded_rank(const Args& args, const spec::JobSpec& spec) {
  const int rank = args.rank, world = args.world;  // ringd decides the number of steps
  const int threads = args.threads.value_or(static_cast<int>(spec.resources.cpus_per_worker));
  const std::string backend_name = args.backend.value_or(spec::to_string(spec.resources.backend));
  std::string err;
  auto backend = kernels::create_backend(backend_name, threads, &err);
  if (!backend) {
    std::cerr << "ring-worker: backend '" << backend_name << "': " << err << "\n";
    return kExitUsage;
  }
  RankOptions ro;
  ro.rank = rank;
  ro.world = world;
  ro.rendezvous = args.rendezvous;
  ro.transport = args.transport;
  ro.op_timeout_ms = args.timeout_ms;
  RingRank rr(spec, ro);

  data::CorpusOptions corpus;
  corpus.max_total_bytes = args.max_corpus_mb << 20;
  std::unique_ptr<data::SequenceSource> source =
      data::make_source(spec.data, data::PasskeyLabels::kAll, corpus);

  RingAttention::Options ao;
  ao.stagger_us = spec.parallel.stagger_us;
  ao.timeout_ms = args.timeout_ms;
  RingAttention attention(backend.get(), &rr.progress(), rr.ring(), ao);
  model::Model model(model::ModelConfig::from_spec(spec), backend.get(), &attention);
  const int64_t n = model.layout().total();

  offload::ClientOptions co;
  co.rank = rank;
  co.local = args.local_rank;
  co.n = n;
  offload::RingdClient client(args.ringd, co);
  const offload::Welcome& w = client.welcome();
  if (!w.cursor.is_null()) source->seek(w.cursor.get<data::Cursor>());
  if (w.need_init) {
    model.init_params(static_cast<uint64_t>(spec.train.seed));
    client.send_init(model.params());
  }
  // The host copy of the weights (the CPU backend's memory is host memory; a device backend
  // copies it in with set_params).
  std::vector<float> host(static_cast<size_t>(n));
  const bool host_backend = backend_name == "cpu";
  float* weights = host_backend ? model.params() : host.data();

  // From here on transfers may be in flight: an error exits at once, without unwinding.
  return run_then_exit_on_error("ring-worker: rank " + std::to_string(rank), kExitRuntime, [&] {
    for (;;) {
      offload::Command cmd = client.next(weights);
      if (cmd.stop) break;
      if (!host_backend) model.set_params(host);
      data::Sequence seq = source->next_sequence();
      data::SequenceShard shard =
          data::shard_sequence(seq, world, rank, spec.parallel.causal_balance);
      const int64_t local_valid = valid_labels(shard);
      const RingStats r0 = attention.ring_stats();
      const auto t0 = std::chrono::steady_clock::now();
      const int64_t global_valid = std::max<int64_t>(rr.global_count(local_valid), 1);
      model.zero_grads();
      std::vector<float> dev_grads;
      model::LossResult loss =
          model.forward_backward(shard_batch(shard), global_valid, [&](const model::GradBucket& b) {
            if (host_backend) {
              client.bucket(cmd.step, b, model.grads());
            } else {
              dev_grads = model.get_grads();  // a device backend: one copy out per bucket
              client.bucket(cmd.step, b, dev_grads.data());
            }
          });
      // The step's global loss: (loss_sum, valid) of every rank, summed in rank order; and
      // whether any node's ringd has a stop request, so that every node stops after this step.
      struct Part {
        double loss_sum;
        int64_t valid;
        int64_t stop;
      };
      Part mine{loss.loss_sum, loss.valid, cmd.stop_requested ? 1 : 0};
      std::vector<Part> all(world);
      if (world > 1) {
        rr.progress().collective([&](transport::TransportComm& c) {
          c.check(c.api().all_gather(c.get(), &mine, all.data(), sizeof(Part), args.timeout_ms),
                  "all_gather of the loss");
        });
      } else {
        all[0] = mine;
      }
      double loss_sum = 0;
      int64_t valid = 0;
      bool stop = false;
      for (const Part& p : all) {
        loss_sum += p.loss_sum;
        valid += p.valid;
        stop = stop || p.stop != 0;
      }
      const double step_ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      const RingStats& r1 = attention.ring_stats();
      nlohmann::json d;
      d["step"] = cmd.step;
      d["loss_sum"] = loss_sum;
      d["valid"] = valid;
      d["tokens"] = seq.size();
      d["step_ms"] = step_ms;
      d["ring_wait_ms"] = (r1.wait_s - r0.wait_s) * 1e3;
      d["bytes_sent"] = r1.bytes_sent - r0.bytes_sent;
      d["cursor"] = source->cursor();
      if (stop) d["stop"] = true;
      client.done(std::move(d));
    }
    rr.shutdown();
    return 0;
  });
}

// ---- launcher ---------------------------------------------------------------------------------

using proc::describe_status;

int launch_local(int argc, char** argv, const Args& args) {
  std::optional<spec::JobSpec> loaded = load(args);
  if (!loaded) return kExitUsage;
  const int world = static_cast<int>(loaded->parallel.context_ranks);

  std::string tmpl = std::filesystem::temp_directory_path().string() + "/ring-rdv-XXXXXX";
  if (!mkdtemp(tmpl.data())) {
    std::cerr << "ring-worker: mkdtemp " << tmpl << ": " << std::strerror(errno) << "\n";
    return kExitRuntime;
  }
  const std::string dir = tmpl;

  // The ranks' command line: ours without --launch-local, plus the rank's identity.
  std::vector<std::string> base;
  for (int i = 1; i < argc; ++i)
    if (std::strcmp(argv[i], "--launch-local") != 0) base.push_back(argv[i]);

  sigset_t handled, old;
  sigemptyset(&handled);
  for (int sig : {SIGCHLD, SIGINT, SIGTERM, SIGHUP}) sigaddset(&handled, sig);
  sigprocmask(SIG_BLOCK, &handled, &old);

  const pid_t self = getpid();
  const int max_fd = ring::proc::descriptor_limit();  // before fork: the child only closes
  std::vector<pid_t> pids(world, -1);
  for (int r = 0; r < world; ++r) {
    std::vector<std::string> cmd = base;
    for (const std::string& x : {std::string("--rank"), std::to_string(r), std::string("--world"),
                                 std::to_string(world), std::string("--rendezvous"), dir})
      cmd.push_back(x);
    pid_t pid = fork();
    if (pid < 0) {
      std::cerr << "ring-worker: fork: " << std::strerror(errno) << "\n";
      for (int q = 0; q < r; ++q) kill(pids[q], SIGKILL);
      for (int q = 0; q < r; ++q) waitpid(pids[q], nullptr, 0);
      std::filesystem::remove_all(dir);
      return kExitRuntime;
    }
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);  // no orphans, even if the launcher is SIGKILLed
      if (getppid() != self) _exit(kExitRuntime);
      sigprocmask(SIG_SETMASK, &old, nullptr);
      std::vector<char*> cargv;
      cargv.push_back(argv[0]);
      for (std::string& x : cmd) cargv.push_back(x.data());
      cargv.push_back(nullptr);
      ring::proc::close_descriptors_from(3, max_fd);
      execv("/proc/self/exe", cargv.data());
      const char msg[] = "ring-worker: exec /proc/self/exe failed\n";
      if (::write(2, msg, sizeof msg - 1) < 0) _exit(127);
      _exit(127);
    }
    pids[r] = pid;
  }
  std::fprintf(stderr, "ring-worker: launched %d ranks (pids", world);
  for (pid_t p : pids) std::fprintf(stderr, " %d", static_cast<int>(p));
  std::fprintf(stderr, "), rendezvous %s\n", dir.c_str());

  using Clock = std::chrono::steady_clock;
  int exit_code = 0;
  int running = world;
  std::optional<Clock::time_point> kill_at;
  auto stop_others = [&](int sig) {
    for (pid_t p : pids)
      if (p > 0) kill(p, sig);
  };
  while (running > 0) {
    timespec ts{0, 200 * 1000 * 1000};
    siginfo_t info;
    int sig = sigtimedwait(&handled, &info, &ts);
    if (sig == SIGINT || sig == SIGTERM || sig == SIGHUP) {
      std::fprintf(stderr, "ring-worker: %s: stopping the %d ranks\n", strsignal(sig), running);
      if (exit_code == 0) exit_code = 128 + sig;
      stop_others(sig == SIGHUP ? SIGTERM : sig);
      if (!kill_at) kill_at = Clock::now() + std::chrono::seconds(10);
    }
    // Every rank that has ended, those killed by a signal first: the killed rank is the cause
    // to report, its peers fail within milliseconds and may be reaped first (reap_ended waits
    // briefly for a killed rank whose threads are still exiting).
    const std::vector<std::pair<pid_t, int>> ended = proc::reap_ended(
        pids, [](int st) { return WIFSIGNALED(st); },
        exit_code == 0 ? std::chrono::milliseconds(1000) : std::chrono::milliseconds(0));
    for (const auto& [got, st] : ended) {
      int r = 0;
      while (r < world && pids[r] != got) ++r;
      if (r == world) continue;
      pids[r] = -1;
      --running;
      const bool ok = WIFEXITED(st) && WEXITSTATUS(st) == 0;
      if (!ok && exit_code == 0) {
        exit_code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        std::fprintf(stderr, "ring-worker: rank %d (pid %d) %s; stopping the other %d ranks\n", r,
                     static_cast<int>(got), describe_status(st).c_str(), running);
        stop_others(SIGTERM);
        kill_at = Clock::now() + std::chrono::seconds(5);
      }
    }
    if (kill_at && Clock::now() >= *kill_at && running > 0) {
      std::fprintf(stderr, "ring-worker: %d ranks still running: SIGKILL\n", running);
      stop_others(SIGKILL);
      kill_at = Clock::now() + std::chrono::seconds(3600);
    }
  }
  sigprocmask(SIG_SETMASK, &old, nullptr);
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  return exit_code;
}

}  // namespace

bool is_ring_invocation(int argc, char** argv) {
  for (int i = 1; i < argc; ++i)
    if (std::strcmp(argv[i], "--rank") == 0 || std::strcmp(argv[i], "--launch-local") == 0)
      return true;
  return false;
}

int ring_main(int argc, char** argv) {
  Args args = parse_args(argc, argv);
  if (args.launch_local) return launch_local(argc, argv, args);
  try {
    return run_rank(args);
  } catch (const offload::RingdGone& e) {
    std::fprintf(stderr, "ring-worker: rank %d: %s\n", args.rank, e.what());
    std::fflush(stdout);
    std::fflush(stderr);
    _exit(kExitRuntime);
  } catch (const transport::TransportError& e) {
    // Thrown while setting up (bootstrap, connect): nothing is in flight yet. Errors during the
    // steps never get here: run_then_exit_on_error exits before anything is unwound.
    std::fprintf(stderr, "ring-worker: rank %d: %s\n", args.rank, e.what());
    std::fflush(stdout);
    std::fflush(stderr);
    _exit(kExitRuntime);
  } catch (const data::DataError& e) {
    std::cerr << "ring-worker: rank " << args.rank << ": data: " << e.what() << "\n";
  } catch (const model::ModelError& e) {
    std::cerr << "ring-worker: rank " << args.rank << ": model: " << e.what() << "\n";
  } catch (const std::exception& e) {
    std::cerr << "ring-worker: rank " << args.rank << ": " << e.what() << "\n";
  }
  std::fflush(stdout);
  std::fflush(stderr);
  _exit(kExitRuntime);
}

}  // namespace ring::cp
