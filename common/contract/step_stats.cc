#include "common/contract/step_stats.h"

#include <cstdio>

#include <nlohmann/json.hpp>

namespace ring::contract {

std::string format_step(const StepStats& s) {
  char buf[256];
  std::snprintf(buf, sizeof(buf),
                "step %lld | loss %.4f | %.0f tok/s | %.1f ms | lr %.3e | gnorm %.3f",
                static_cast<long long>(s.step), s.loss, s.tokens_per_s, s.step_ms, s.lr,
                s.grad_norm);
  return buf;
}

std::string step_json(const StepStats& s) {
  nlohmann::json j{{"step", s.step},       {"loss", s.loss},   {"tokens_per_s", s.tokens_per_s},
                   {"step_ms", s.step_ms}, {"lr", s.lr},       {"grad_norm", s.grad_norm},
                   {"tokens", s.tokens},   {"valid", s.valid}};
  return j.dump();
}

}  // namespace ring::contract
