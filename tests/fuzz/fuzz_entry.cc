// libFuzzer entry point; RING_FUZZ_TARGET names one of the functions in targets.h.
#include <cstddef>
#include <cstdint>

#include "tests/fuzz/targets.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ring::fuzz::RING_FUZZ_TARGET(data, size);
  return 0;
}
