// ringd <-> worker control lines (common/contract/control.h): whatever the bytes, each side's
// parser returns a message or throws ControlError (never another exception or a crash), and what
// parses re-encodes to a line that parses to the same message. The first byte picks the model
// size the ringd side checks `params.changed` against; the rest is the line.
#include <cmath>
#include <string>
#include <string_view>

#include "common/contract/control.h"
#include "tests/fuzz/targets.h"

namespace ring::fuzz {
namespace {

namespace c = ring::contract::control;

template <typename Msg, typename Parse>
void round_trip(const char* side, const Msg& m, Parse parse) {
  const std::string line = c::encode(m);
  if (line.empty() || line.back() != '\n' || line.find('\n') != line.size() - 1)
    fail("worker_control", std::string(side) + ": encode() is not one line: " + line);
  Msg again;
  try {
    again = parse(std::string_view(line).substr(0, line.size() - 1));
  } catch (const c::ControlError& e) {
    fail("worker_control", std::string(side) + ": a parsed message re-encodes to a line that " +
                               "does not parse: " + e.what() + "\n  line: " + line);
  }
  if (again.index() != m.index() || c::to_json(again) != c::to_json(m) || c::encode(again) != line)
    fail("worker_control", std::string(side) + ": the re-encoded line parses to another " +
                               "message:\n  first:  " + line + "  second: " + c::encode(again));
}

}  // namespace

void worker_control_input(const uint8_t* data, size_t size) {
  if (size == 0) return;
  static constexpr int64_t kN[] = {1, 7, 1000, 1 << 20, -1, INT64_MAX, 0, 64};
  const int64_t n = kN[data[0] % 8];
  const std::string_view line(reinterpret_cast<const char*>(data + 1), size - 1);
  try {
    const c::WorkerMessage m = c::parse_worker_line(line);
    if (const auto* d = std::get_if<c::Done>(&m)) {
      if (!(d->step >= 1 && d->valid >= 0 && d->tokens >= 0 && std::isfinite(d->step_ms)))
        fail("worker_control", "done accepted out of range: " + std::string(line));
      if (!d->cursor.is_null() && !d->cursor.is_object())
        fail("worker_control", "done.cursor accepted as neither object nor null");
    }
    round_trip("worker -> ringd", m, [](std::string_view l) { return c::parse_worker_line(l); });
  } catch (const c::ControlError& e) {
    (void)e.field();
  }
  try {
    const c::RingdMessage m = c::parse_ringd_line(line, n);
    if (const auto* p = std::get_if<c::Params>(&m)) {
      // The worker reads `changed` entries of the index region, which holds n of them.
      if (p->changed < -1 || p->changed > std::max<int64_t>(n, -1))
        fail("worker_control", "params.changed " + std::to_string(p->changed) +
                                   " accepted for a model of " + std::to_string(n));
    }
    if (const auto* w = std::get_if<c::Welcome>(&m)) {
      if (w->shm.size() < 2 || w->shm[0] != '/' || w->shm.find('/', 1) != std::string::npos)
        fail("worker_control", "welcome.shm accepted: " + w->shm);
    }
    round_trip("ringd -> worker", m, [n](std::string_view l) { return c::parse_ringd_line(l, n); });
  } catch (const c::ControlError& e) {
    (void)e.field();
  }
}

}  // namespace ring::fuzz
