#include "sim/rates.h"

#include <algorithm>
#include <cctype>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "fmt/format.h"

namespace ring::sim {

namespace {

constexpr double kGemmEff = 0.60, kAttnFwdEff = 0.45, kAttnBwdEff = 0.35;

Rates gpu(const char* name, double peak, double peak_tf32, double nvlink_bidir, const char* source) {
  Rates r;
  r.name = name;
  r.gemm_flops = peak * kGemmEff;
  r.attention_fwd_flops = peak * kAttnFwdEff;
  r.attention_bwd_flops = peak * kAttnBwdEff;
  r.intra_node_bw = nvlink_bidir / 2;
  r.intra_node_latency = 1e-6;
  r.adamw_params_per_s = 2e9;
  r.checkpoint_bytes_per_s = 2e9;
  r.source = source;
  r.peak_bf16_flops = peak;
  r.peak_fp32_flops = peak_tf32;
  r.peak_source = fmt::format("{} SXM datasheet: {:.1f} TFLOP/s dense BF16, {:.1f} TFLOP/s dense TF32",
                              name, peak / 1e12, peak_tf32 / 1e12);
  r.gemm_eff = {kGemmEff, "assumed (not yet measured: scripts/gpu-check.sh's cuBLAS GEMM)"};
  r.attention_fwd_eff = {kAttnFwdEff,
                         "assumed, below FlashAttention-3's published H100 BF16 forward (up to "
                         "740 TFLOP/s, 75 %, head_dim 128; Shah et al. 2024) for ring-sized blocks"};
  r.attention_bwd_eff = {kAttnBwdEff,
                         "assumed, below the forward as in FlashAttention-3's published H100 "
                         "figures (its backward is slower than its forward)"};
  r.optimizer_source = "assumed: ringd's host AdamW, 2e9 parameters/s per node";
  return r;
}

}  // namespace

std::vector<std::string> preset_names() { return {"H100", "H200", "A100"}; }

Rates preset_rates(const std::string& name) {
  std::string n;
  for (char c : name) n += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (n == "H100" || n == "H100-80G")
    return gpu("H100", 989.4e12, 494.7e12, 900e9, "NVIDIA H100 SXM datasheet: 989.4 TFLOP/s dense BF16, NVLink 900 GB/s");
  if (n == "H200" || n == "H200-141G")
    return gpu("H200", 989.4e12, 494.7e12, 900e9, "NVIDIA H200 SXM datasheet: 989.4 TFLOP/s dense BF16, NVLink 900 GB/s");
  if (n == "A100" || n == "A100-80G")
    return gpu("A100", 312e12, 156e12, 600e9, "NVIDIA A100 SXM datasheet: 312 TFLOP/s dense BF16, NVLink 600 GB/s");
  throw std::invalid_argument(
      fmt::format("unknown GPU type '{}' (choose H100, H200, A100, or cpu with a calibration file)", name));
}

Rates load_calibration(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error(fmt::format("{}: cannot open the calibration file", path));
  std::stringstream ss;
  ss << in.rdbuf();
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(ss.str());
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error(fmt::format("{}: not JSON: {}", path, e.what()));
  }
  if (!j.is_object()) throw std::runtime_error(fmt::format("{}: a calibration file is a JSON object", path));
  auto num = [&](const char* key, bool required) {
    if (!j.contains(key)) {
      if (required)
        throw std::runtime_error(fmt::format("{}: key '{}' is missing (bench/sim_calibrate.sh writes it)", path, key));
      return 0.0;
    }
    if (!j[key].is_number() || !(j[key].get<double>() > 0))
      throw std::runtime_error(fmt::format("{}: key '{}' must be a positive number", path, key));
    return j[key].get<double>();
  };
  Rates r;
  r.name = "cpu";
  r.gemm_flops = num("gemm_flops", true);
  r.attention_fwd_flops = num("attention_fwd_flops", true);
  r.attention_bwd_flops = num("attention_bwd_flops", true);
  r.intra_node_bw = num("intra_node_bytes_per_s", true);
  r.intra_node_latency = j.contains("intra_node_latency_s") ? num("intra_node_latency_s", false) : 5e-6;
  r.adamw_params_per_s = num("adamw_params_per_s", true);
  r.checkpoint_bytes_per_s = j.contains("checkpoint_bytes_per_s") ? num("checkpoint_bytes_per_s", false) : 1e9;
  r.gemm_bwd_flops = j.contains("gemm_bwd_flops") ? num("gemm_bwd_flops", false) : 0;
  if (j.contains("host_speed")) {
    const auto& hs = j["host_speed"];
    if (!hs.is_array() || hs.empty())
      throw std::runtime_error(fmt::format("{}: key 'host_speed' must be a non-empty list of positive numbers", path));
    for (const auto& x : hs) {
      if (!x.is_number() || !(x.get<double>() > 0))
        throw std::runtime_error(fmt::format("{}: key 'host_speed' must be a non-empty list of positive numbers", path));
      r.host_speed.push_back(x.get<double>());
    }
  }
  if (j.contains("host_poll_load")) {
    if (!j["host_poll_load"].is_number() || j["host_poll_load"].get<double>() < 0)
      throw std::runtime_error(fmt::format("{}: key 'host_poll_load' must be a number >= 0", path));
    r.host_poll_load = j["host_poll_load"].get<double>();
  }
  // The link model (bench/link_probe.py): all of its keys or none.
  static const char* link_keys[] = {"link_rate_share", "link_message_s", "link_rate_share_loaded",
                                    "link_message_s_loaded", "link_loaded_processes",
                                    "link_cpu_s_per_byte"};
  int link_n = 0;
  for (const char* k : link_keys) link_n += j.contains(k) ? 1 : 0;
  if (link_n > 0 && link_n < 6)
    throw std::runtime_error(fmt::format(
        "{}: the link model needs all of link_rate_share, link_message_s, link_rate_share_loaded, "
        "link_message_s_loaded, link_loaded_processes, link_cpu_s_per_byte (bench/link_probe.py "
        "writes them together)", path));
  if (link_n == 6) {
    auto any_num = [&](const char* key) {
      if (!j[key].is_number())
        throw std::runtime_error(fmt::format("{}: key '{}' must be a number", path, key));
      return j[key].get<double>();
    };
    auto share = [&](const char* key) {
      const double v = any_num(key);
      if (!(v > 0 && v <= 1))
        throw std::runtime_error(fmt::format("{}: key '{}' must be in (0, 1] (a share of the link's rate)", path, key));
      return v;
    };
    auto nonneg = [&](const char* key) {
      const double v = any_num(key);
      if (!(v >= 0)) throw std::runtime_error(fmt::format("{}: key '{}' must be a number >= 0", path, key));
      return v;
    };
    r.has_link_model = true;
    r.link_rate_share = share("link_rate_share");
    r.link_rate_share_loaded = share("link_rate_share_loaded");
    r.link_message_s = any_num("link_message_s");
    r.link_message_s_loaded = any_num("link_message_s_loaded");
    r.link_loaded_processes = nonneg("link_loaded_processes");
    r.link_cpu_s_per_byte = nonneg("link_cpu_s_per_byte");
  }
  r.network_bw = j.contains("network_bytes_per_s") ? num("network_bytes_per_s", false) : 0;
  r.network_latency = j.contains("network_latency_s") ? num("network_latency_s", false) : 0;
  // The compute rates per second of wall time (the default) or per CPU-second of the rank's
  // thread (sim_calibrate --as-run --cpu-time: a dedicated core's; the host_speed table then
  // says what share of a core each rank gets).
  if (j.contains("compute_rates_per")) {
    const auto& v = j["compute_rates_per"];
    if (!v.is_string() || (v.get<std::string>() != "cpu_second" && v.get<std::string>() != "wall_second"))
      throw std::runtime_error(fmt::format("{}: key 'compute_rates_per' must be \"wall_second\" or \"cpu_second\"", path));
    r.compute_per_cpu_second = v.get<std::string>() == "cpu_second";
  }
  r.source = fmt::format("calibration file {}{}", path,
                         r.compute_per_cpu_second ? " (compute rates per CPU-second)" : "");
  // No datasheet peak for a CPU: the measured GEMM rate stands for it (both dtypes).
  r.peak_bf16_flops = r.peak_fp32_flops = r.gemm_flops;
  r.peak_source = fmt::format("the calibration's measured GEMM rate ({})", path);
  const std::string measured = fmt::format("measured (calibration file {})", path);
  r.gemm_eff = {1.0, measured};
  r.attention_fwd_eff = {r.attention_fwd_flops / r.gemm_flops, measured};
  r.attention_bwd_eff = {r.attention_bwd_flops / r.gemm_flops, measured};
  r.optimizer_source = measured;
  for (auto it = j.begin(); it != j.end(); ++it) {
    static const char* known[] = {"gemm_flops", "attention_fwd_flops", "attention_bwd_flops",
                                  "intra_node_bytes_per_s", "intra_node_latency_s",
                                  "adamw_params_per_s", "checkpoint_bytes_per_s",
                                  "network_bytes_per_s", "network_latency_s", "machine", "measured",
                                  "threads", "notes", "gemm_bwd_flops", "host_speed", "host_poll_load",
                                  "ringd_threads", "link_rate_share", "link_message_s",
                                  "link_rate_share_loaded", "link_message_s_loaded",
                                  "link_loaded_processes", "link_cpu_s_per_byte", "link_probe_mbit",
                                  "compute_rates_per", "as_run_beside_compute",
                                  "as_run_beside_pollers"};
    if (std::find_if(std::begin(known), std::end(known), [&](const char* k) { return it.key() == k; }) == std::end(known))
      throw std::runtime_error(fmt::format("{}: unknown key '{}'", path, it.key()));
  }
  return r;
}

}  // namespace ring::sim
