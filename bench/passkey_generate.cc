// Passkey retrieval through the generation path, and what the two inexact modes cost on a trained
// model (bench/passkey_generate.sh runs it on scripts/passkey_train.sh's model).
//
//   passkey_generate --spec SPEC --checkpoint DIR [--samples N] [--page-tokens P]
//                    [--prompts-dir DIR] [--approximate T,T,...] [--threads K]
//
// The held-out samples are the training-time evaluation's (data seed + 1000003, samples 0..N-1,
// worker/ring_worker.cc). For each sample the prompt (every token before the answer) is
// prefilled into the paged KV cache and the answer digits are decoded teacher-forced (the true
// earlier digits fed back), exactly as the training-time evaluation scores them, in each mode:
//   exact        fp32 pages, every page attended (the default of ringctl generate)
//   int8         --host-int8: host-tier pages stored as int8 (opt-in, not exact)
//   approx T     --approximate T: pages whose bound on softmax share is below T skipped
// Per mode: digit and key accuracy (greedy), the mean and largest KL(exact || mode) of the
// next-token distributions at the answer positions (nats), and the largest reported bound on the
// skipped softmax mass. The first line is the training forward's own evaluation
// (train::evaluate_passkey) on the same samples, for the "same accuracy" comparison.
// --prompts-dir also writes each prompt as prompt-NNNN.txt and the answers as answers.txt, for
// the script's run of `ringctl generate` on the same samples.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "common/spec/parse.h"
#include "common/spec/spec.h"
#include "common/checkpoint/checkpoint.h"
#include "kernels/backend.h"
#include "worker/data/passkey.h"
#include "worker/generate/generator.h"
#include "worker/model/model.h"
#include "worker/train/passkey_eval.h"

namespace {

[[noreturn]] void die(const std::string& m) {
  std::fprintf(stderr, "passkey_generate: %s\n", m.c_str());
  std::exit(2);
}

std::vector<double> log_softmax(const float* x, int64_t n) {
  double mx = x[0];
  for (int64_t i = 1; i < n; ++i) mx = std::max(mx, static_cast<double>(x[i]));
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += std::exp(x[i] - mx);
  const double lse = mx + std::log(s);
  std::vector<double> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) out[i] = x[i] - lse;
  return out;
}

double kl(const std::vector<double>& p, const std::vector<double>& q) {
  double k = 0;
  for (size_t i = 0; i < p.size(); ++i) k += std::exp(p[i]) * (p[i] - q[i]);
  return std::max(k, 0.0);
}

struct Mode {
  std::string name;
  bool int8 = false;
  double approximate = 0;
};

struct Result {
  int64_t digits_right = 0, digits = 0, keys_right = 0, keys = 0;
  double kl_sum = 0, kl_max = 0, bound_max = 0;
  int64_t kl_n = 0;
};

}  // namespace

int run(int argc, char** argv) {
  std::string spec_path, checkpoint, prompts_dir, approx_list = "0.001,0.01,0.05";
  int64_t samples = 32, page_tokens = 256;
  int threads = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto val = [&]() -> std::string {
      if (i + 1 >= argc) die(a + " needs a value");
      return argv[++i];
    };
    if (a == "--spec") spec_path = val();
    else if (a == "--checkpoint") checkpoint = val();
    else if (a == "--samples") samples = std::stoll(val());
    else if (a == "--page-tokens") page_tokens = std::stoll(val());
    else if (a == "--prompts-dir") prompts_dir = val();
    else if (a == "--approximate") approx_list = val();
    else if (a == "--threads") threads = std::stoi(val());
    else die("unknown argument " + a);
  }
  if (spec_path.empty() || checkpoint.empty()) die("--spec and --checkpoint are required");
  ring::spec::LoadResult lr = ring::spec::load_spec_file(spec_path);
  if (!lr.ok()) die(spec_path + ": invalid spec (ringctl validate shows why)");
  const ring::spec::JobSpec& spec = *lr.spec;
  if (spec.data.source != ring::spec::DataSource::kPasskey) die(spec_path + ": not a passkey spec");

  const ring::model::ModelConfig mc = ring::model::ModelConfig::from_spec(spec);
  const ring::contract::ParamLayout pl(mc);
  std::vector<float> params(static_cast<size_t>(pl.total()), 0.f);
  std::vector<ring::ckpt::LoadTarget> targets;
  for (const auto& v : pl.views())
    targets.emplace_back("master/" + v.name, ring::ckpt::DType::kF32, v.shape,
                         params.data() + v.offset);
  try {
    ring::ckpt::load_from_path(checkpoint, 0, 1, targets);
  } catch (const ring::ckpt::CheckpointError& e) {
    die(std::string("--checkpoint: ") + e.what());
  }
  std::string err;
  auto backend = ring::kernels::create_backend("cpu", threads, &err);
  if (!backend) die("cpu backend: " + err);

  const ring::data::PasskeyOptions eval_opts{spec.data.seq_len, spec.data.passkey_digits,
                                             spec.data.seed + 1000003,
                                             ring::data::PasskeyLabels::kAll};
  std::vector<ring::data::PasskeySample> set;
  for (int64_t i = 0; i < samples; ++i) set.push_back(ring::data::make_passkey_sample(eval_opts, i));

  // The training forward's evaluation of the same samples.
  {
    ring::model::LocalAttention attention(backend.get());
    ring::model::Model model(mc, backend.get(), &attention);
    model.set_params(params);
    ring::train::PasskeyAccuracy a = ring::train::evaluate_passkey(model, eval_opts, samples);
    std::printf("%-22s digit accuracy %.3f | key accuracy %.3f | %lld samples of %lld tokens\n",
                "training forward", a.digit_accuracy, a.key_accuracy,
                static_cast<long long>(a.samples), static_cast<long long>(spec.data.seq_len));
  }

  if (!prompts_dir.empty()) {
    std::filesystem::create_directories(prompts_dir);
    std::ofstream answers(prompts_dir + "/answers.txt");
    for (int64_t i = 0; i < samples; ++i) {
      const auto& s = set[static_cast<size_t>(i)];
      char name[64];
      std::snprintf(name, sizeof name, "/prompt-%04lld.txt", static_cast<long long>(i));
      std::ofstream p(prompts_dir + name, std::ios::binary);
      for (int64_t t = 0; t < s.answer_start; ++t) p.put(static_cast<char>(s.sequence.tokens[t]));
      answers << s.answer << "\n";
    }
  }

  std::vector<Mode> modes{{"exact", false, 0}, {"int8 host pages", true, 0}};
  std::stringstream ss(approx_list);
  for (std::string t; std::getline(ss, t, ',');)
    if (!t.empty()) modes.push_back({"approximate " + t, false, std::stod(t)});

  const int64_t V = mc.vocab;
  std::vector<std::vector<std::vector<double>>> exact_lp(static_cast<size_t>(samples));
  for (const Mode& m : modes) {
    ring::gen::GeneratorOptions go;
    go.cache.page_tokens = page_tokens;
    go.cache.fast_bytes = 2 << 20;  // the window's pages; every other page in the host tier
    go.cache.window = page_tokens;
    go.cache.host_int8 = m.int8;
    go.threads = threads;
    go.approximate = m.approximate;
    Result r;
    for (int64_t i = 0; i < samples; ++i) {
      const auto& s = set[static_cast<size_t>(i)];
      ring::gen::Generator g(mc, params.data(), backend.get(), go);
      std::vector<int32_t> prompt(s.sequence.tokens.begin(),
                                  s.sequence.tokens.begin() + s.answer_start);
      std::vector<float> logits;
      const int h = g.prefill(prompt, {}, &logits);
      bool key_right = true;
      for (int64_t d = 0; d < s.answer_len; ++d) {
        if (d > 0) {
          ring::gen::StepTiming st = g.step({h}, {static_cast<int32_t>(s.answer[d - 1])}, &logits);
          for (double b : st.skipped_mass_bound) r.bound_max = std::max(r.bound_max, b);
        }
        const int32_t want = static_cast<unsigned char>(s.answer[d]);
        const int32_t got = static_cast<int32_t>(
            std::max_element(logits.begin(), logits.begin() + V) - logits.begin());
        r.digits_right += got == want;
        ++r.digits;
        key_right = key_right && got == want;
        std::vector<double> lp = log_softmax(logits.data(), V);
        if (m.name == "exact") {
          exact_lp[static_cast<size_t>(i)].push_back(std::move(lp));
        } else {
          const double k = kl(exact_lp[static_cast<size_t>(i)][static_cast<size_t>(d)], lp);
          r.kl_sum += k;
          r.kl_max = std::max(r.kl_max, k);
          ++r.kl_n;
        }
      }
      r.keys_right += key_right;
      ++r.keys;
    }
    std::printf("%-22s digit accuracy %.3f | key accuracy %.3f", m.name.c_str(),
                static_cast<double>(r.digits_right) / static_cast<double>(r.digits),
                static_cast<double>(r.keys_right) / static_cast<double>(r.keys));
    if (r.kl_n > 0)
      std::printf(" | KL(exact||mode) mean %.2e max %.2e", r.kl_sum / static_cast<double>(r.kl_n),
                  r.kl_max);
    if (m.approximate > 0) std::printf(" | skipped-mass bound max %.2e", r.bound_max);
    std::printf("\n");
    std::fflush(stdout);
  }
  return 0;
}

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    die(e.what());
  }
}
