// One optimizer step's record, as the in-worker trainer and ringd both print it (the log line)
// and write it (a line of steps.jsonl / --log-json): one format whoever ran the optimizer.
#pragma once

#include <cstdint>
#include <string>

namespace ring::contract {

struct StepStats {
  int64_t step = 0;       // 1-based optimizer step just taken
  double loss = 0;        // mean cross-entropy (nats) over the step's valid labels
  int64_t tokens = 0;     // tokens processed in the step (all its sequences)
  int64_t valid = 0;      // valid labels
  double grad_norm = 0;   // global L2 norm before clipping
  double lr = 0;          // learning rate used for the update
  double step_ms = 0;     // wall time of forward + backward + optimizer
  double tokens_per_s = 0;
};

// "step 10 | loss 2.3456 | 12345 tok/s | 234.5 ms | lr 1.00e-03 | gnorm 0.812"
std::string format_step(const StepStats& s);
// One JSON object (one line): {"step":..,"loss":..,"tokens_per_s":..,"step_ms":..,"lr":..,
// "grad_norm":..,"tokens":..,"valid":..}
std::string step_json(const StepStats& s);

}  // namespace ring::contract
