// The safetensors reader (common/safetensors/safetensors.h) on any bytes: the input is the
// whole file.
// Properties: bad input ends in SafetensorsError, never another exception or a crash; what is
// accepted has every tensor inside the data section with end - begin = numel x dtype size, no
// two tensors overlapping, unique names, and converts to fp32 (bf16 and fp16 exactly: the
// conversion back gives the same bits for every value that is not NaN).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "common/safetensors/safetensors.h"
#include "tests/fuzz/targets.h"

namespace ring::fuzz {

void safetensors_input(const uint8_t* data, size_t size) {
  std::optional<st::File> f;
  try {
    f.emplace(st::File::parse(data, size, "fuzz.safetensors"));
  } catch (const st::SafetensorsError&) {
    return;
  } catch (const std::exception& e) {
    fail("safetensors", std::string("unexpected exception: ") + e.what());
  }
  uint64_t header = 0;
  std::memcpy(&header, data, 8);
  const uint64_t data_bytes = size - 8 - header;
  std::set<std::string> names;
  std::vector<std::pair<uint64_t, uint64_t>> spans;
  for (const st::TensorInfo& t : f->tensors()) {
    if (!names.insert(t.name).second) fail("safetensors", "duplicate name accepted: " + t.name);
    if (t.end < t.begin || t.end > data_bytes)
      fail("safetensors", "tensor '" + t.name + "' outside the data section");
    if (t.end - t.begin != static_cast<uint64_t>(t.numel()) * st::dtype_size(t.dtype))
      fail("safetensors", "tensor '" + t.name + "' size does not match its shape");
    if (t.end > t.begin) spans.push_back({t.begin, t.end});
    if (f->find(t.name) != &t) fail("safetensors", "find() does not return '" + t.name + "'");
  }
  std::sort(spans.begin(), spans.end());
  for (size_t i = 1; i < spans.size(); ++i)
    if (spans[i].first < spans[i - 1].second) fail("safetensors", "overlapping tensors accepted");
  for (const st::TensorInfo& t : f->tensors()) {
    std::vector<float> x = f->to_f32(t);
    if (t.dtype == st::DType::kBF16)
      for (int64_t i = 0; i < t.numel(); ++i) {
        uint16_t h;
        std::memcpy(&h, f->raw(t) + 2 * i, 2);
        if (!std::isnan(x[i]) && st::f32_to_bf16(x[i]) != h)
          fail("safetensors", "bf16 conversion is not exact in '" + t.name + "'");
      }
  }
}

}  // namespace ring::fuzz
