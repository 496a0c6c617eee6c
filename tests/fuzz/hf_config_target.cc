// The Hugging Face config.json reader of `ringctl import` (common/hf/hf_llama.h parse_config) on any
// bytes. Properties: bad input ends in ConvertError naming config.json, never another exception,
// a crash or a stack overflow (deep nesting is refused before parsing); what is accepted has a
// model config with positive sizes whose key/value heads divide the query heads.
#include <string>

#include "common/hf/hf_llama.h"
#include "tests/fuzz/targets.h"

namespace ring::fuzz {

void hf_config_input(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  hf::HfConfig c;
  try {
    c = hf::parse_config(text, "config.json");
  } catch (const hf::ConvertError& e) {
    if (std::string(e.what()).find("config.json") == std::string::npos)
      fail("hf_config", std::string("an error that does not name the file: ") + e.what());
    return;
  } catch (const std::exception& e) {
    fail("hf_config", std::string("unexpected exception: ") + e.what());
  }
  const auto& m = c.model;
  if (m.layers < 1 || m.d_model < 1 || m.heads < 1 || m.vocab < 1 || m.head_dim < 1)
    fail("hf_config", "accepted a config with a size below 1");
  if (m.kv_heads < 1 || m.heads % m.kv_heads != 0)
    fail("hf_config", "accepted kv heads that do not divide the heads");
}

}  // namespace ring::fuzz
