// Compute and host rates of a device type: presets for GPUs, or a calibration file measured on
// this machine by bench/sim_calibrate.sh (CPU backend).
//
// Preset numbers (docs/simulation.md lists them with their sources): peak dense bf16 tensor
// throughput from NVIDIA's datasheets times an achieved fraction that is this simulator's
// assumption (GEMM 60 %, attention forward 45 %, attention backward 35 %); NVLink bandwidth per
// GPU and direction (half the datasheet's bidirectional figure).
#pragma once

#include <string>
#include <vector>

namespace ring::sim {

struct Rates {
  std::string name;               // "H100", "cpu (calibrated: <file>)"
  double gemm_flops = 0;          // achieved FLOP/s of the projections and MLP
  double gemm_bwd_flops = 0;      // ... of their backward (0: gemm_flops)
  double attention_fwd_flops = 0; // achieved FLOP/s of attention forward (4 x heads x hd per pair)
  double attention_bwd_flops = 0; // ... backward (10 x heads x hd per pair)
  double intra_node_bw = 0;       // bytes/s per device and direction (NVLink, or shared memory)
  double intra_node_latency = 1e-6;
  double adamw_params_per_s = 0;  // ringd's host AdamW, per node
  double checkpoint_bytes_per_s = 0;  // per node, to the checkpoint directory
  double network_bw = 0;          // calibration only: measured per-node bandwidth (0: unknown)
  double network_latency = 0;     // calibration only
  // Calibration only: speed of each of n single-thread processes running at once on this
  // machine, relative to one alone (n = 1..size); used when the cluster's nodes share one host.
  std::vector<double> host_speed;
  double host_poll_load = 0;  // a waiting rank's load on a shared host, in processes
  // Calibration only: the transport over a shaped link, measured by bench/link_probe.py (UCX over
  // TCP through a tc token bucket between two network namespaces of this machine). A message of
  // B bytes alone on a link of rate R takes  message_s + B / (rate_share x R);  message_s < 0 is
  // the token bucket's burst (the start of a message passes at the veth's speed). "loaded": with
  // link_loaded_processes single-thread GEMMs computing beside the transfer (used when the
  // cluster's nodes share one host); otherwise the idle figures. cpu_s_per_byte: CPU time the two
  // ranks spend per byte moved, which a shared host's compute competes with.
  bool has_link_model = false;
  double link_rate_share = 1, link_message_s = 0;
  double link_rate_share_loaded = 1, link_message_s_loaded = 0;
  double link_loaded_processes = 0;
  double link_cpu_s_per_byte = 0;
  // Calibration only: the compute rates are per CPU-second of the rank's thread (a dedicated
  // core's), not per second of wall time (calibration key compute_rates_per: cpu_second).
  bool compute_per_cpu_second = false;
  std::string source;
  // MFU's denominator: the device's peak dense tensor FLOP/s for bf16 and for fp32 (TF32 tensor
  // cores), from the datasheet (fp16's is bf16's); with a calibration, the measured GEMM rate (no datasheet peak).
  double peak_bf16_flops = 0, peak_fp32_flops = 0;
  std::string peak_source;
  // The kernel efficiencies assumed (achieved / peak bf16) and where each comes from (a
  // published anchor, a measurement, or "assumed"); the optimizer's is adamw_params_per_s.
  struct Efficiency {
    double fraction = 0;
    std::string source;
  };
  Efficiency gemm_eff, attention_fwd_eff, attention_bwd_eff;
  std::string optimizer_source;
  // The peak for a spec's dtype: bf16 (and fp16) on the 16-bit tensor cores, or fp32.
  double peak_flops(bool sixteen_bit) const { return sixteen_bit ? peak_bf16_flops : peak_fp32_flops; }
};

// "H100", "H200", "A100" (case-insensitive; "H100-80G" etc. accepted). Throws
// std::invalid_argument naming the choices.
Rates preset_rates(const std::string& gpu);
std::vector<std::string> preset_names();
// A calibration JSON (bench/sim_calibrate.sh). Throws std::runtime_error naming the file and key.
Rates load_calibration(const std::string& path);

}  // namespace ring::sim
