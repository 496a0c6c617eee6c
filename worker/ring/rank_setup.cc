#include "worker/ring/rank_setup.h"

#include "common/log/log.h"

namespace ring::cp {
namespace {
using Args = worker::Flags;
}  // namespace

std::shared_ptr<spdlog::logger> logger() { return log::get("ring-worker"); }

std::optional<spec::JobSpec> load(const Args& a) { return worker::load_spec(a.spec); }

std::optional<spec::JobSpec> load_rank_spec(const Args& args) {
  std::optional<spec::JobSpec> loaded = load(args);
  if (!loaded) return std::nullopt;
  spec::JobSpec spec = *loaded;
  if (spec.parallel.context_ranks * spec.parallel.data_replicas != args.world) {
    logger()->error("--world {} but parallel.context_ranks {} x data_replicas {} = {}", args.world,
                    spec.parallel.context_ranks, spec.parallel.data_replicas,
                    spec.parallel.context_ranks * spec.parallel.data_replicas);
    return std::nullopt;
  }
  if (args.stagger_us) spec.parallel.stagger_us = *args.stagger_us;
  return spec;
}

StepData next_step_data(data::SequenceSource& source, const spec::JobSpec& spec,
                        const RingRank& rr) {
  const int64_t m_count = spec.train.micro_batches;
  StepData sd;
  for (int64_t j = 0; j < rr.replicas() * m_count; ++j) {
    data::Sequence seq = source.next_sequence();
    sd.tokens += seq.size();
    if (j / m_count != rr.replica()) continue;
    sd.shards.push_back(
        data::shard_sequence(seq, rr.ring().world, rr.ring().rank, spec.parallel.causal_balance));
    sd.local_valid += valid_labels(sd.shards.back());
  }
  return sd;
}

RankOptions rank_options(const Args& args, const spec::JobSpec& spec) {
  RankOptions ro;
  ro.rank = args.rank;
  ro.world = args.world;
  ro.replicas = static_cast<int>(spec.parallel.data_replicas);
  ro.rendezvous = args.rendezvous;
  ro.transport = args.transport;
  ro.op_timeout_ms = args.timeout_ms;
  return ro;
}

int rank_threads(const Args& args, const spec::JobSpec& spec) {
  return args.threads.value_or(static_cast<int>(spec.resources.cpus_per_worker));
}
std::string rank_backend_name(const Args& args, const spec::JobSpec& spec) {
  return args.backend.value_or(spec::to_string(spec.resources.backend));
}
std::unique_ptr<kernels::Backend> make_rank_backend(const Args& args, const spec::JobSpec& spec) {
  const std::string name = rank_backend_name(args, spec);
  std::string err;
  auto backend = kernels::create_backend(name, rank_threads(args, spec), &err);
  if (!backend) logger()->error("backend '{}': {}", name, err);
  return backend;
}
std::unique_ptr<data::SequenceSource> make_rank_source(const Args& args,
                                                       const spec::JobSpec& spec) {
  data::CorpusOptions corpus;
  corpus.max_total_bytes = args.max_corpus_mb << 20;
  corpus.encode_threads = rank_threads(args, spec);
  std::unique_ptr<data::SequenceSource> source =
      data::make_source(spec.data, data::PasskeyLabels::kAll, corpus);
  data::check_vocab(*source, spec.model.vocab);
  return source;
}

}  // namespace ring::cp
