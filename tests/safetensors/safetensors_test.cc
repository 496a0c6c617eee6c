// The safetensors reader against hostile files (each a SafetensorsError naming the file, the
// tensor and the rule; never a crash), exact bf16/fp16 conversion, the writer's format and
// round trip, and the config.json checks of `ringctl import` (common/hf/hf_llama.h).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/hf/hf_llama.h"
#include "common/safetensors/safetensors.h"

namespace {

namespace fs = std::filesystem;
using ring::st::DType;
using ring::st::File;
using ring::st::SafetensorsError;

// 8-byte length + header text + data.
std::string make(const std::string& header, const std::string& data = "",
                 int64_t length_override = -1) {
  uint64_t n = length_override >= 0 ? static_cast<uint64_t>(length_override) : header.size();
  std::string s(8, '\0');
  std::memcpy(s.data(), &n, 8);
  return s + header + data;
}

std::string error_of(const std::string& bytes) {
  try {
    File::parse(bytes.data(), bytes.size(), "x.safetensors");
  } catch (const SafetensorsError& e) {
    return e.what();
  }
  return "";
}

#define EXPECT_ERROR(bytes, ...)                                                        \
  do {                                                                                  \
    std::string err_ = error_of(bytes);                                                 \
    ASSERT_FALSE(err_.empty()) << "accepted";                                           \
    EXPECT_NE(err_.find("x.safetensors"), std::string::npos) << err_;                   \
    for (const char* part_ : {__VA_ARGS__})                                             \
      EXPECT_NE(err_.find(part_), std::string::npos) << err_ << "\n  lacks: " << part_; \
  } while (0)

TEST(Safetensors, ParsesAValidFile) {
  std::string data(8 + 4, '\0');
  float a[2] = {1.5f, -2.f};
  std::memcpy(data.data(), a, 8);
  uint16_t b[2] = {0x3FC0, 0xC000};  // bf16 1.5, -2
  std::memcpy(data.data() + 8, b, 4);
  std::string h =
      R"({"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[2],)"
      R"("data_offsets":[0,8]},"b":{"dtype":"BF16","shape":[1,2],"data_offsets":[8,12]},)"
      R"("e":{"dtype":"F16","shape":[0,3],"data_offsets":[12,12]},)"
      R"("z":{"dtype":"F32","shape":[0],"data_offsets":[12,12]}})";
  std::string bytes = make(h, data);
  File f = File::parse(bytes.data(), bytes.size(), "ok");
  ASSERT_EQ(f.tensors().size(), 4u);
  EXPECT_EQ(f.metadata().at("format"), "pt");
  EXPECT_EQ(f.to_f32(*f.find("a")), (std::vector<float>{1.5f, -2.f}));
  EXPECT_EQ(f.to_f32(*f.find("b")), (std::vector<float>{1.5f, -2.f}));
  EXPECT_EQ(f.find("e")->numel(), 0);
  // Empty tensors convert to empty vectors (no copy from or to a null pointer: the fuzz
  // target's UBSan found one; corpus file empty-tensors).
  EXPECT_TRUE(f.to_f32(*f.find("e")).empty());
  EXPECT_TRUE(f.to_f32(*f.find("z")).empty());
  EXPECT_EQ(f.find("nope"), nullptr);
}

TEST(Safetensors, HostileFilesNameTheRule) {
  const std::string t = R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  // Truncated: no length, a header running past the end, data missing.
  EXPECT_ERROR(std::string("\x10\x00\x00", 3), "truncated");
  EXPECT_ERROR(make(t, "", static_cast<int64_t>(t.size()) + 100), "truncated",
               "header inside the file");
  EXPECT_ERROR(make(t, std::string(4, '\0')), "'w'", "past the end",
               "offsets inside the data section");
  // A huge header length.
  EXPECT_ERROR(make(t, "", int64_t{1} << 62), "exceeds the limit", "header length bounded");
  EXPECT_ERROR(make("", "", INT64_MAX), "header length bounded");
  // Not JSON, not UTF-8, not an object.
  EXPECT_ERROR(make("{\"w\": [1,", std::string(8, '\0')), "not valid JSON");
  EXPECT_ERROR(make("[1, 2, 3]"), "JSON object");
  EXPECT_ERROR(make("{\"w\xff\xfe\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]}}"),
               "UTF-8");
  EXPECT_ERROR(make("{\"\xc0\x80\":{}}"), "UTF-8");  // overlong encoding
  // Duplicate names.
  EXPECT_ERROR(make(R"({"w":{"dtype":"F32","shape":[0],"data_offsets":[0,0]},)"
                    R"("w":{"dtype":"F32","shape":[0],"data_offsets":[0,0]}})"),
               "'w'", "names unique");
  // Dtypes: known but unsupported, unknown.
  EXPECT_ERROR(
      make(R"({"w":{"dtype":"I64","shape":[1],"data_offsets":[0,8]}})", std::string(8, '\0')),
      "'w'", "I64 is unsupported", "dtype F32, F16 or BF16");
  EXPECT_ERROR(
      make(R"({"w":{"dtype":"F33","shape":[1],"data_offsets":[0,4]}})", std::string(4, '\0')),
      "unknown dtype 'F33'");
  EXPECT_ERROR(make(R"({"w":{"dtype":7,"shape":[1],"data_offsets":[0,4]}})", std::string(4, 0)),
               "dtype missing or not a string");
  // Shapes: negative, not integers, overflowing.
  EXPECT_ERROR(make(R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,0]}})"), "dims >= 0");
  EXPECT_ERROR(make(R"({"w":{"dtype":"F32","shape":[1.5],"data_offsets":[0,0]}})"), "dims >= 0");
  EXPECT_ERROR(
      make(R"({"w":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,0]}})"),
      "overflows", "fits int64");
  EXPECT_ERROR(make(R"({"w":{"dtype":"BF16","shape":[9223372036854775807],"data_offsets":[0,0]}})"),
               "overflows");
  EXPECT_ERROR(make(R"({"w":{"dtype":"F32","shape":[18446744073709551615],"data_offsets":[0,0]}})"),
               "overflows");
  // Offsets: wrong size, reversed, past the end, overlapping, not integers.
  EXPECT_ERROR(make(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", std::string(8, 0)),
               "end - begin == product x dtype size");
  EXPECT_ERROR(make(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", std::string(8, 0)),
               "end before they begin");
  EXPECT_ERROR(make(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,18446744073709551615]}})",
                    std::string(8, 0)),
               "past the end");
  EXPECT_ERROR(make(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                    R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                    std::string(12, 0)),
               "overlap", "no overlaps");
  EXPECT_ERROR(make(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0]}})", std::string(8, 0)),
               "data_offsets missing");
  EXPECT_ERROR(
      make(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[-8,0]}})", std::string(8, 0)),
      "integers >= 0");
  // Entries that are not {dtype, shape, data_offsets}, metadata that is not strings.
  EXPECT_ERROR(make(R"({"w":5})"), "'w'", "not an object");
  EXPECT_ERROR(make(R"({"w":{"dtype":"F32","shape":[0],"data_offsets":[0,0],"x":1}})"),
               "unknown key 'x'");
  EXPECT_ERROR(make(R"({"__metadata__":{"a":1}})"), "maps strings to strings");
  EXPECT_ERROR(make(R"({"":{"dtype":"F32","shape":[0],"data_offsets":[0,0]}})"), "non-empty");
}

// Issue 31.11: a header nested 100000 deep crashed the reader (stack overflow while the error
// message was built); a valid header followed by NUL padding was accepted although the parser
// had stopped at the first NUL (the format pads with spaces only).
TEST(Safetensors, DeepNestingAndNulPaddingAreRefused) {
  const std::string t = R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  const std::string data(8, '\x01');
  EXPECT_EQ(error_of(make(t + "   ", data)), "");  // space padding is the format's
  const std::string at = "NUL byte at offset " + std::to_string(t.size());
  EXPECT_ERROR(make(t + std::string(8, '\0'), data), at.c_str(), "padded with spaces only");
  const std::string deep = "{\"w\":" + std::string(100000, '[') + std::string(100000, ']') + "}";
  EXPECT_ERROR(make(deep), "deeper than 64 levels");
  // Brackets inside a string are text, not nesting.
  EXPECT_EQ(ring::st::json_nesting_depth(R"({"a":"[[[[{{{{\"]]"})"), 1u);
  EXPECT_EQ(ring::st::json_nesting_depth("[[{}]]"), 3u);
}

TEST(Safetensors, OpenNamesThePathAndMapsTheFile) {
  fs::path dir = fs::temp_directory_path() / ("st-test-" + std::to_string(getpid()));
  fs::create_directories(dir);
  const std::string p = (dir / "t.safetensors").string();
  std::ofstream(p, std::ios::binary)
      << make(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", std::string(8, 0));
  try {
    File::open(p);
    FAIL() << "accepted";
  } catch (const SafetensorsError& e) {
    EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("'w'"), std::string::npos) << e.what();
  }
  EXPECT_THROW(File::open((dir / "missing").string()), SafetensorsError);
  EXPECT_THROW(File::open(dir.string()), SafetensorsError);  // a directory
  std::ofstream((dir / "empty").string());
  EXPECT_THROW(File::open((dir / "empty").string()), SafetensorsError);
  fs::remove_all(dir);
}

TEST(Safetensors, HalfConversionsAreExact) {
  // Every fp16 value against the definition: sign, exponent, mantissa.
  for (uint32_t h = 0; h < 65536; ++h) {
    const uint16_t x = static_cast<uint16_t>(h);
    const int e = (x >> 10) & 31, m = x & 1023;
    const double sign = (x & 0x8000) ? -1 : 1;
    const float got = ring::st::f16_to_f32(x);
    if (e == 31) {
      EXPECT_TRUE(m ? std::isnan(got) : std::isinf(got)) << h;
      continue;
    }
    const double want = e == 0 ? sign * std::ldexp(m, -24) : sign * std::ldexp(1024 + m, e - 25);
    ASSERT_EQ(static_cast<double>(got), want) << h;
    ASSERT_EQ(std::signbit(got), (x & 0x8000) != 0) << h;
  }
  // bf16 round trip of every bf16 value (except NaN payloads, which stay NaN).
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = ring::st::bf16_to_f32(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(ring::st::bf16_to_f32(ring::st::f32_to_bf16(f))));
      continue;
    }
    ASSERT_EQ(ring::st::f32_to_bf16(f), h);
  }
  // Round to nearest even.
  EXPECT_EQ(ring::st::f32_to_bf16(std::bit_cast<float>(0x3F808000u)), 0x3F80);  // tie, even
  EXPECT_EQ(ring::st::f32_to_bf16(std::bit_cast<float>(0x3F818000u)), 0x3F82);  // tie, up
  EXPECT_EQ(ring::st::f32_to_bf16(std::bit_cast<float>(0x3F808001u)), 0x3F81);
}

TEST(Safetensors, WriterPadsTheHeaderAndRoundTrips) {
  fs::path dir = fs::temp_directory_path() / ("st-w-" + std::to_string(getpid()));
  fs::create_directories(dir);
  std::vector<float> a{1.f, -0.f, 3.25f, 1e-30f, 65504.f, 1.f / 3}, b{2.f, 7.f};
  for (DType dt : {DType::kF32, DType::kBF16}) {
    const std::string p = (dir / "m.safetensors").string();
    std::vector<ring::st::WriteTensor> ts{{"z.first", {2, 3}, a.data()},
                                          {"a.second", {2}, b.data()}};
    ring::st::write_file(p, ts, dt, {{"format", "pt"}});
    EXPECT_EQ(fs::file_size(p), ring::st::file_size(ts, dt, {{"format", "pt"}}));
    File f = File::open(p);
    std::ifstream in(p, std::ios::binary);
    uint64_t n = 0;
    in.read(reinterpret_cast<char*>(&n), 8);
    EXPECT_EQ(n % 8, 0u);
    std::string header(n, '\0');
    in.read(header.data(), static_cast<std::streamsize>(n));
    EXPECT_EQ(header.find_last_not_of(' ') + 1, header.find_last_of('}') + 1);
    ASSERT_EQ(f.tensors().size(), 2u);
    EXPECT_EQ(f.tensors()[0].name, "z.first");  // file order: the order given
    EXPECT_EQ(f.find("z.first")->shape, (std::vector<int64_t>{2, 3}));
    std::vector<float> got = f.to_f32(*f.find("z.first"));
    for (size_t i = 0; i < a.size(); ++i)
      EXPECT_EQ(got[i],
                dt == DType::kF32 ? a[i] : ring::st::bf16_to_f32(ring::st::f32_to_bf16(a[i])));
    EXPECT_EQ(f.to_f32(*f.find("a.second")), b);
  }
  std::vector<ring::st::WriteTensor> dup{{"x", {1}, a.data()}, {"x", {1}, a.data()}};
  EXPECT_THROW(ring::st::write_file((dir / "d.safetensors").string(), dup, DType::kF32),
               SafetensorsError);
  fs::remove_all(dir);
}

TEST(Safetensors, ShardedModelChecksTheIndex) {
  fs::path dir = fs::temp_directory_path() / ("st-m-" + std::to_string(getpid()));
  fs::create_directories(dir);
  std::vector<float> a{1, 2}, b{3};
  ring::st::write_file((dir / "s1.safetensors").string(), {{"a", {2}, a.data()}}, DType::kF32);
  ring::st::write_file((dir / "s2.safetensors").string(), {{"b", {1}, b.data()}}, DType::kF32);
  auto index = [&](const std::string& text) {
    std::ofstream((dir / "model.safetensors.index.json").string()) << text;
  };
  index(R"({"weight_map":{"a":"s1.safetensors","b":"s2.safetensors"}})");
  ring::st::Model m = ring::st::Model::open(dir.string());
  EXPECT_EQ(m.names(), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(m.find("b")->file->to_f32(*m.find("b")->info), b);
  index(R"({"weight_map":{"a":"s1.safetensors","b":"s1.safetensors"}})");
  EXPECT_THROW(ring::st::Model::open(dir.string()), SafetensorsError);
  index(R"({"weight_map":{"a":"../s1.safetensors"}})");
  EXPECT_THROW(ring::st::Model::open(dir.string()), SafetensorsError);
  index(R"({"weight_map":{"a":"s1.safetensors"},"x":)");
  EXPECT_THROW(ring::st::Model::open(dir.string()), SafetensorsError);
  fs::remove_all(dir);
}

TEST(HfImport, ConfigRefusesWhatTheModelCannotRepresent) {
  nlohmann::json ok = {{"architectures", {"LlamaForCausalLM"}},
                       {"hidden_size", 64},
                       {"intermediate_size", 128},
                       {"num_hidden_layers", 2},
                       {"num_attention_heads", 4},
                       {"num_key_value_heads", 2},
                       {"vocab_size", 300},
                       {"rms_norm_eps", 1e-6},
                       {"rope_theta", 500000.0},
                       {"max_position_embeddings", 4096},
                       {"rope_scaling",
                        {{"rope_type", "llama3"},
                         {"factor", 8.0},
                         {"low_freq_factor", 1.0},
                         {"high_freq_factor", 4.0},
                         {"original_max_position_embeddings", 8192}}},
                       {"tie_word_embeddings", true}};
  ring::hf::HfConfig c = ring::hf::parse_config(ok.dump(), "config.json");
  EXPECT_EQ(c.model.head_dim, 16);
  EXPECT_EQ(c.model.kv_heads, 2);
  EXPECT_TRUE(c.model.tie_embeddings);
  EXPECT_EQ(c.rope_scaling, "llama3");
  EXPECT_EQ(c.rope_original_context, 8192);
  std::string yaml = ring::hf::model_yaml(c, "/ck", "fp32", "/src");
  EXPECT_NE(yaml.find("rope_scaling: llama3"), std::string::npos) << yaml;
  EXPECT_NE(yaml.find("rope_theta: 500000"), std::string::npos) << yaml;
  auto refused = [&](nlohmann::json j, const char* why) {
    try {
      ring::hf::parse_config(j.dump(), "config.json");
      ADD_FAILURE() << "accepted: " << why;
    } catch (const ring::hf::ConvertError& e) {
      EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("config.json"), std::string::npos) << e.what();
    }
  };
  auto with = [&](const char* k, nlohmann::json v) {
    nlohmann::json j = ok;
    j[k] = v;
    return j;
  };
  refused(with("architectures", {"GPT2LMHeadModel"}), "not supported");
  // Issue 31.11: a deeply nested value (the message quoting hidden_act recursed into it).
  for (const std::string& bad :
       {ok.dump().substr(0, ok.dump().size() - 1) + ",\"hidden_act\":" +
            std::string(200000, '[') + std::string(200000, ']') + "}",
        ok.dump() + std::string(4, '\0')}) {
    try {
      ring::hf::parse_config(bad, "config.json");
      ADD_FAILURE() << "accepted";
    } catch (const ring::hf::ConvertError& e) {
      const std::string w = e.what();
      EXPECT_TRUE(w.find("deeper than 64 levels") != std::string::npos ||
                  w.find("NUL byte") != std::string::npos)
          << w;
    }
  }
  refused(with("attention_bias", true), "attention_bias");
  refused(with("mlp_bias", true), "mlp_bias");
  refused(with("num_local_experts", 8), "mixture-of-experts");
  refused(with("hidden_act", "gelu"), "hidden_act");
  refused(with("sliding_window", 1024), "sliding_window");
  refused(with("num_key_value_heads", 3), "multiple");
  refused(with("rope_scaling", {{"type", "dynamic"}, {"factor", 2.0}}), "dynamic");
  refused(with("head_dim", 15), "odd");
  refused(with("rope_theta", 1e9 + 1), "fp32");
  refused(with("hidden_size", "64"), "hidden_size");
  // rope_scaling: each refusal names the field (rope_scaling.<key>) and the rule.
  refused(with("rope_scaling", {{"rope_type", 3}}), "rope_scaling.rope_type is not a string");
  refused(with("rope_scaling", {{"rope_type", "dynamic"}, {"factor", 2.0}}),
          "rope_scaling.rope_type 'dynamic' is not supported");
  refused(with("rope_scaling", "llama3"), "rope_scaling is not an object");
  refused(with("rope_scaling", {{"factor", 2.0}}), "rope_scaling has no rope_type");
  refused(with("rope_scaling", {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0},
                                {"high_freq_factor", 4.0}}),
          "rope_scaling.original_max_position_embeddings is missing");
  refused(with("rope_scaling", {{"rope_type", "llama3"}, {"factor", 8.0}, {"high_freq_factor", 4.0},
                                {"original_max_position_embeddings", 8192}}),
          "rope_scaling.low_freq_factor is missing");
  refused(with("rope_scaling", {{"rope_type", "llama3"}, {"factor", "8"}, {"low_freq_factor", 1.0},
                                {"high_freq_factor", 4.0},
                                {"original_max_position_embeddings", 8192}}),
          "rope_scaling.factor is not a number");
  refused(with("rope_scaling", {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 4.0},
                                {"high_freq_factor", 1.0},
                                {"original_max_position_embeddings", 8192}}),
          "low_freq_factor < high_freq_factor");
  refused(with("rope_scaling", {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0},
                                {"high_freq_factor", 4.0},
                                {"original_max_position_embeddings", 8192.5}}),
          "rope_scaling.original_max_position_embeddings is not an integer");
  refused(with("rope_scaling", {{"rope_type", "linear"}, {"factor", 0.5}}),
          "rope_scaling.factor must be >= 1");
  refused(with("rope_scaling", {{"rope_type", "linear"}}), "rope_scaling.factor is missing");
  refused(with("rope_scaling", {{"rope_type", "yarn"}, {"factor", 4.0}, {"mscale", 0.7}}),
          "rope_scaling.mscale is not supported with rope_type yarn");
  refused(with("rope_scaling", {{"rope_type", "linear"}, {"type", "yarn"}, {"factor", 2.0}}),
          "disagree");
  refused(with("max_position_embeddings", "4096"), "'max_position_embeddings' is not an integer");
  // What the record carries: the settings, the context, and bf16 for a bfloat16 model.
  EXPECT_EQ(c.model.rope_scaling, ring::spec::RopeScaling::kLlama3);
  EXPECT_EQ(c.model.rope_original_context, 8192.0);
  EXPECT_EQ(c.model.rope_scaling_factor, 8.0);
  EXPECT_EQ(c.model.rope_theta, 500000.f);
  EXPECT_EQ(c.model.norm_eps, 1e-6f);
  EXPECT_EQ(c.model.max_positions, 4096);
  EXPECT_EQ(c.model.dtype, ring::spec::DType::kFp32);
  EXPECT_EQ(ring::hf::parse_config(with("torch_dtype", "bfloat16").dump(), "c").model.dtype,
            ring::spec::DType::kBf16);
  // yarn without original_max_position_embeddings: max_position_embeddings, as transformers.
  auto yarn = ring::hf::parse_config(
      with("rope_scaling", {{"type", "yarn"}, {"factor", 4.0}}).dump(), "c");
  EXPECT_EQ(yarn.model.rope_original_context, 4096.0);
  // A Mistral window as long as the context is no window at all.
  EXPECT_NO_THROW(ring::hf::parse_config(with("sliding_window", 4096).dump(), "c"));
}

TEST(HfImport, RopeRowPermutationInverts) {
  const int64_t heads = 3, hd = 8, cols = 5;
  std::vector<float> w(heads * hd * cols);
  for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>(i);
  std::vector<float> p = w;
  ring::hf::hf_to_ring_rope_rows(p.data(), heads, hd, cols);
  // new row 2j = old row j, new row 2j+1 = old row j + hd/2, inside each head.
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t j = 0; j < hd / 2; ++j)
      for (int64_t c = 0; c < cols; ++c) {
        EXPECT_EQ(p[(h * hd + 2 * j) * cols + c], w[(h * hd + j) * cols + c]);
        EXPECT_EQ(p[(h * hd + 2 * j + 1) * cols + c], w[(h * hd + j + hd / 2) * cols + c]);
      }
  ring::hf::ring_to_hf_rope_rows(p.data(), heads, hd, cols);
  EXPECT_EQ(p, w);
}

// A tiny Llama in the Hugging Face layout under dir (one model.safetensors), all weights 0.5
// except what `mutate` changes in the tensor list.
struct TinyHf {
  fs::path dir;
  nlohmann::json config = {{"architectures", {"LlamaForCausalLM"}},
                           {"hidden_size", 16},
                           {"intermediate_size", 32},
                           {"num_hidden_layers", 1},
                           {"num_attention_heads", 2},
                           {"num_key_value_heads", 1},
                           {"vocab_size", 20},
                           {"tie_word_embeddings", false}};
  std::vector<std::pair<std::string, std::vector<int64_t>>> tensors = {
      {"model.embed_tokens.weight", {20, 16}},
      {"model.layers.0.input_layernorm.weight", {16}},
      {"model.layers.0.self_attn.q_proj.weight", {16, 16}},
      {"model.layers.0.self_attn.k_proj.weight", {8, 16}},
      {"model.layers.0.self_attn.v_proj.weight", {8, 16}},
      {"model.layers.0.self_attn.o_proj.weight", {16, 16}},
      {"model.layers.0.post_attention_layernorm.weight", {16}},
      {"model.layers.0.mlp.gate_proj.weight", {32, 16}},
      {"model.layers.0.mlp.up_proj.weight", {32, 16}},
      {"model.layers.0.mlp.down_proj.weight", {16, 32}},
      {"model.norm.weight", {16}},
      {"lm_head.weight", {20, 16}}};
  void write() {
    fs::create_directories(dir);
    std::ofstream((dir / "config.json").string()) << config.dump();
    std::vector<float> ones(1024, 0.5f);
    std::vector<ring::st::WriteTensor> ws;
    for (const auto& [n, s] : tensors) ws.push_back({n, s, ones.data()});
    ring::st::write_file((dir / "model.safetensors").string(), ws, DType::kBF16);
  }
};

ring::hf::ImportResult import_to(const fs::path& src, const std::string& out,
                                 size_t chunk_bytes = 4 << 20) {
  ring::hf::ImportOptions o;
  o.src = src.string();
  o.out = out;
  o.fsync = false;
  o.chunk_bytes = chunk_bytes;
  return ring::hf::import_model(o);
}

std::string import_error(const TinyHf& m, const std::string& out) {
  try {
    import_to(m.dir, out);
  } catch (const ring::hf::ConvertError& e) {
    return e.what();
  }
  return "";
}

TEST(HfImport, RefusesModelsThatDoNotMatchTheirConfig) {
  const fs::path root = fs::temp_directory_path() / ("st-imp-" + std::to_string(getpid()));
  fs::remove_all(root);
  TinyHf m{root / "hf"};
  m.write();
  const std::string out = (root / "ck").string();
  ASSERT_EQ(import_error(m, out), "");
  EXPECT_TRUE(fs::exists(root / "ck" / "model.yaml"));
  EXPECT_TRUE(fs::exists(root / "ck" / "step-00000000" / "checkpoint.json"));
  // Not into a non-empty directory.
  EXPECT_NE(import_error(m, out).find("not empty"), std::string::npos);
  // A bias (no counterpart), a missing tensor, a wrong shape, a hostile file.
  auto expect = [&](TinyHf bad, const std::string& what) {
    fs::remove_all(bad.dir);
    bad.write();
    std::string err = import_error(bad, (root / "ck-bad").string());
    EXPECT_NE(err.find(what), std::string::npos) << err;
    EXPECT_FALSE(fs::exists(root / "ck-bad" / "latest")) << what;
    fs::remove_all(root / "ck-bad");
  };
  TinyHf bias = m;
  bias.tensors.push_back({"model.layers.0.self_attn.q_proj.bias", {16}});
  expect(bias, "q_proj.bias' has no ringmaster counterpart");
  TinyHf missing = m;
  missing.tensors.erase(missing.tensors.begin() + 3);
  expect(missing, "model.layers.0.self_attn.k_proj.weight' (layers.0.attn.wk) is missing");
  TinyHf shape = m;
  shape.tensors[3].second = {16, 16};
  expect(shape, "has shape [16,16] but config.json gives layers.0.attn.wk the shape [8,16]");
  TinyHf extra_layer = m;
  extra_layer.tensors.push_back({"model.layers.1.input_layernorm.weight", {16}});
  expect(extra_layer, "no ringmaster counterpart");
  // Old checkpoints carry RoPE's inv_freq buffers: skipped, not refused.
  TinyHf inv = m;
  inv.dir = root / "hf-inv";
  inv.tensors.push_back({"model.layers.0.self_attn.rotary_emb.inv_freq", {4}});
  inv.write();
  EXPECT_EQ(import_error(inv, (root / "ck-inv").string()), "");
  // A truncated file: the reader's rule, with the file's path.
  fs::remove_all(m.dir);
  m.write();
  fs::resize_file(m.dir / "model.safetensors", fs::file_size(m.dir / "model.safetensors") - 2);
  std::string err = import_error(m, (root / "ck-trunc").string());
  EXPECT_NE(err.find("model.safetensors"), std::string::npos) << err;
  EXPECT_NE(err.find("offsets inside the data section"), std::string::npos) << err;
  fs::remove_all(root);
}

TEST(HfImport, ChunkSizeDoesNotChangeTheCheckpoint) {
  // The writer converts chunk by chunk from the source files; chunks of 1025 floats cut the
  // 64-float rows of wq / wk (whose rows are reordered) and the tensors at odd places. Distinct
  // values (integers, exact in bf16) make a misplaced row or element visible.
  const fs::path root = fs::temp_directory_path() / ("st-chk-" + std::to_string(getpid()));
  fs::remove_all(root);
  TinyHf m{root / "hf"};
  m.config["hidden_size"] = 64;  // wq: 64 rows of 64 floats, larger than one 4100-byte chunk
  m.config["intermediate_size"] = 96;
  m.tensors = {{"model.embed_tokens.weight", {20, 64}},
               {"model.layers.0.input_layernorm.weight", {64}},
               {"model.layers.0.self_attn.q_proj.weight", {64, 64}},
               {"model.layers.0.self_attn.k_proj.weight", {32, 64}},
               {"model.layers.0.self_attn.v_proj.weight", {32, 64}},
               {"model.layers.0.self_attn.o_proj.weight", {64, 64}},
               {"model.layers.0.post_attention_layernorm.weight", {64}},
               {"model.layers.0.mlp.gate_proj.weight", {96, 64}},
               {"model.layers.0.mlp.up_proj.weight", {96, 64}},
               {"model.layers.0.mlp.down_proj.weight", {64, 96}},
               {"model.norm.weight", {64}},
               {"lm_head.weight", {20, 64}}};
  fs::create_directories(m.dir);
  std::ofstream((m.dir / "config.json").string()) << m.config.dump();
  std::vector<std::vector<float>> values;
  std::vector<ring::st::WriteTensor> ws;
  float next = -100;
  for (const auto& [n, s] : m.tensors) {
    int64_t count = 1;
    for (int64_t d : s) count *= d;
    values.emplace_back(count);
    for (auto& x : values.back()) x = (next = next >= 100 ? -100 : next + 1);
  }
  for (size_t i = 0; i < m.tensors.size(); ++i)
    ws.push_back({m.tensors[i].first, m.tensors[i].second, values[i].data()});
  ring::st::write_file((m.dir / "model.safetensors").string(), ws, DType::kBF16);

  import_to(m.dir, (root / "big").string());
  import_to(m.dir, (root / "small").string(), 4100);
  auto data = [&](const char* which) {
    std::ifstream in((root / which / "step-00000000" / "node-00000.bin").string(),
                     std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(in)), {});
  };
  EXPECT_FALSE(data("big").empty());
  EXPECT_EQ(data("big"), data("small"));
  // And the round trip gives back every source value (the row order undone by export).
  ring::hf::ExportOptions eo;
  eo.ckpt = (root / "small").string();
  eo.out = (root / "out").string();
  eo.dtype = "fp32";
  ring::hf::export_model(eo);
  ring::st::File f = ring::st::File::open((root / "out" / "model.safetensors").string());
  for (size_t i = 0; i < m.tensors.size(); ++i) {
    const ring::st::TensorInfo* t = f.find(m.tensors[i].first);
    ASSERT_NE(t, nullptr) << m.tensors[i].first;
    EXPECT_EQ(f.to_f32(*t), values[i]) << m.tensors[i].first;
  }
  fs::remove_all(root);
}

TEST(HfExport, UsesTheCheckpointsRecordWithoutModelYaml) {
  const fs::path root = fs::temp_directory_path() / ("st-exp-" + std::to_string(getpid()));
  fs::remove_all(root);
  TinyHf m{root / "hf"};
  m.write();
  import_to(m.dir, (root / "ck").string());
  fs::remove(root / "ck" / "model.yaml");  // as a training checkpoint has none
  std::vector<std::string> notes;
  ring::hf::ExportOptions eo;
  eo.ckpt = (root / "ck" / "step-00000000").string();
  eo.out = (root / "out").string();
  eo.dtype = "bf16";
  auto r = ring::hf::export_model(eo, [&](const std::string& l) { notes.push_back(l); });
  EXPECT_EQ(r.step, 0);
  ASSERT_EQ(r.files.size(), 1u);
  ring::st::Model back = ring::st::Model::open((root / "out").string());
  EXPECT_EQ(back.names().size(), m.tensors.size());
  // bf16 0.5 survives exactly, whatever the permutation.
  for (const auto& n : back.names())
    for (float x : back.find(n)->file->to_f32(*back.find(n)->info)) ASSERT_EQ(x, 0.5f) << n;
  // The checkpoint records the settings (record 2): nothing is assumed.
  for (const auto& l : notes) EXPECT_EQ(l.find("assumed"), std::string::npos) << l;
  // Sharded into the same directory, then whole again: no stale files stay.
  eo.shard_bytes = 200;
  EXPECT_GT(ring::hf::export_model(eo).files.size(), 5u);
  EXPECT_TRUE(fs::exists(root / "out" / "model.safetensors.index.json"));
  EXPECT_FALSE(fs::exists(root / "out" / "model.safetensors"));
  eo.shard_bytes = 1 << 30;
  EXPECT_EQ(ring::hf::export_model(eo).files.size(), 1u);
  int files = 0;
  for (const auto& e : fs::directory_iterator(root / "out")) {
    (void)e;
    ++files;
  }
  EXPECT_EQ(files, 2) << "config.json and model.safetensors only";
  auto cfg = nlohmann::json::parse(std::ifstream((root / "out" / "config.json").string()));
  EXPECT_EQ(cfg["num_key_value_heads"], 1);
  EXPECT_EQ(cfg["tie_word_embeddings"], false);
  fs::remove_all(root);
}

}  // namespace

namespace {

std::string convert_error(const std::function<void()>& f) {
  try {
    f();
  } catch (const ring::hf::ConvertError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

// Issue 31.4 and 31.5, with two uids (root and nobody): import and export refuse an output
// directory another user owns, may write to, or points at with a link; export writes through no
// link planted in its directory and leaves the previous export whole when it fails.
TEST(HfFiles, ImportAndExportRefuseDirectoriesOthersControl) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to make directories of another user (nobody)";
  const fs::path root = fs::temp_directory_path() / ("st-own-" + std::to_string(getpid()));
  fs::remove_all(root);
  TinyHf m{root / "hf"};
  m.write();
  import_to(m.dir, (root / "ck").string());
  const uid_t nobody = 65534;
  // An empty directory of nobody: before, the import went in and nobody could swap weights.
  fs::create_directories(root / "theirs");
  ASSERT_EQ(::chown((root / "theirs").c_str(), nobody, nobody), 0);
  std::string err = convert_error([&] { import_to(m.dir, (root / "theirs").string()); });
  EXPECT_NE(err.find("is owned by nobody (uid 65534), not by you"), std::string::npos) << err;
  EXPECT_TRUE(fs::is_empty(root / "theirs"));
  ring::hf::ExportOptions eo;
  eo.ckpt = (root / "ck").string();
  eo.dtype = "bf16";
  eo.out = (root / "theirs").string();
  err = convert_error([&] { ring::hf::export_model(eo); });
  EXPECT_NE(err.find("is owned by nobody"), std::string::npos) << err;
  // Writable by others; a link of nobody's to a directory of ours.
  fs::create_directories(root / "open");
  ::chmod((root / "open").c_str(), 0777);
  eo.out = (root / "open").string();
  err = convert_error([&] { ring::hf::export_model(eo); });
  EXPECT_NE(err.find("has mode 0777: group or others may write there"), std::string::npos) << err;
  fs::create_directories(root / "mine");
  fs::create_directory_symlink(root / "mine", root / "link");
  ASSERT_EQ(::lchown((root / "link").c_str(), nobody, nobody), 0);
  eo.out = (root / "link").string();
  err = convert_error([&] { ring::hf::export_model(eo); });
  EXPECT_NE(err.find("is a symbolic link of nobody"), std::string::npos) << err;
  EXPECT_TRUE(fs::is_empty(root / "mine"));
  // A link planted at config.json (as nobody could in a shared directory before): replaced, the
  // file it pointed at untouched.
  eo.out = (root / "out").string();
  ring::hf::export_model(eo);
  { std::ofstream(root / "victim.txt") << "mine"; }
  fs::remove(root / "out" / "config.json");
  fs::create_symlink(root / "victim.txt", root / "out" / "config.json");
  ring::hf::export_model(eo);
  EXPECT_FALSE(fs::is_symlink(root / "out" / "config.json"));
  std::ifstream v(root / "victim.txt");
  EXPECT_EQ(std::string((std::istreambuf_iterator<char>(v)), {}), "mine");
  // A failed export (fp16 cannot be written) leaves the previous one whole, and no staging
  // directory behind.
  const auto before = fs::file_size(root / "out" / "model.safetensors");
  eo.dtype = "fp16";
  EXPECT_FALSE(convert_error([&] { ring::hf::export_model(eo); }).empty());
  EXPECT_EQ(fs::file_size(root / "out" / "model.safetensors"), before);
  EXPECT_TRUE(fs::exists(root / "out" / "config.json"));
  for (const auto& e : fs::directory_iterator(root / "out"))
    EXPECT_EQ(e.path().filename().string().find(".ringctl-export"), std::string::npos);
  fs::remove_all(root);
}

// An imported model's settings follow it (issue 36): the checkpoint's model record carries
// rope_theta, the llama3 scaling, norm_eps, the tied head, max_position_embeddings and the dtype
// (bf16 for a bfloat16 model), and export writes them back from the record alone (no
// model.yaml), in the model's dtype unless --dtype says otherwise. A --model-yaml that
// contradicts the record is refused naming the key.
TEST(HfExport, TheCheckpointCarriesTheWholeConfigAndExportWritesItBack) {
  const fs::path root = fs::temp_directory_path() / ("st-cfg-" + std::to_string(getpid()));
  fs::remove_all(root);
  TinyHf m{root / "hf"};
  m.config["rope_theta"] = 500000.0;
  m.config["rms_norm_eps"] = 1e-6;
  m.config["max_position_embeddings"] = 131072;
  m.config["torch_dtype"] = "bfloat16";
  m.config["rope_scaling"] = {{"rope_type", "llama3"},
                              {"factor", 32.0},
                              {"low_freq_factor", 1.0},
                              {"high_freq_factor", 4.0},
                              {"original_max_position_embeddings", 8192}};
  m.write();
  import_to(m.dir, (root / "ck").string());
  auto top = nlohmann::json::parse(
      std::ifstream((root / "ck" / "step-00000000" / "checkpoint.json").string()));
  const auto& rec = top["layout"]["model"];
  EXPECT_EQ(rec["record"], 2);
  EXPECT_EQ(rec["dtype"], "bf16");
  EXPECT_EQ(rec["rope_theta"], 500000.0);
  EXPECT_EQ(rec["norm_eps"], static_cast<double>(1e-6f));
  EXPECT_EQ(rec["rope_scaling"], "llama3");
  EXPECT_EQ(rec["rope_scaling_factor"], 32.0);
  EXPECT_EQ(rec["rope_original_context"], 8192);
  EXPECT_EQ(rec["rope_high_freq_factor"], 4.0);
  EXPECT_EQ(rec["max_positions"], 131072);
  EXPECT_EQ(rec["tie_embeddings"], false);
  std::ifstream yaml((root / "ck" / "model.yaml").string());
  EXPECT_NE(std::string(std::istreambuf_iterator<char>(yaml), {}).find("dtype: bf16"),
            std::string::npos);

  fs::remove(root / "ck" / "model.yaml");  // the record alone
  ring::hf::ExportOptions eo;
  eo.ckpt = (root / "ck").string();
  eo.out = (root / "out").string();
  ring::hf::export_model(eo);
  auto cfg = nlohmann::json::parse(std::ifstream((root / "out" / "config.json").string()));
  EXPECT_EQ(cfg["rope_theta"], 500000.0);
  EXPECT_EQ(cfg["rms_norm_eps"], 1e-6);  // the float's shortest decimal, not 9.99999997e-07
  EXPECT_EQ(cfg["max_position_embeddings"], 131072);
  EXPECT_EQ(cfg["torch_dtype"], "bfloat16");
  EXPECT_EQ(cfg["tie_word_embeddings"], false);
  EXPECT_EQ(cfg["rope_scaling"], m.config["rope_scaling"]);
  ring::st::File f = ring::st::File::open((root / "out" / "model.safetensors").string());
  EXPECT_EQ(f.find("model.norm.weight")->dtype, DType::kBF16);
  // The exported config imports to the same record.
  import_to(root / "out", (root / "ck2").string());
  auto top2 = nlohmann::json::parse(
      std::ifstream((root / "ck2" / "step-00000000" / "checkpoint.json").string()));
  EXPECT_EQ(top2["layout"]["model"], rec);
  // --dtype fp32 writes fp32 (and says so in config.json).
  eo.dtype = "fp32";
  ring::hf::export_model(eo);
  cfg = nlohmann::json::parse(std::ifstream((root / "out" / "config.json").string()));
  EXPECT_EQ(cfg["torch_dtype"], "float32");
  EXPECT_EQ(ring::st::File::open((root / "out" / "model.safetensors").string())
                .find("model.norm.weight")
                ->dtype,
            DType::kF32);
  // A model.yaml that contradicts the record is refused, naming the key.
  std::ofstream((root / "bad.yaml").string())
      << "model:\n  layers: 1\n  d_model: 16\n  heads: 2\n  kv_heads: 1\n  mlp_hidden: 32\n"
         "  vocab: 20\n  tie_embeddings: false\n  rope_theta: 10000\n  norm_eps: 1e-6\n"
         "  rope_scaling: llama3\n  rope_scaling_factor: 32\n  rope_original_context: 8192\n"
         "  rope_low_freq_factor: 1\n  rope_high_freq_factor: 4\n";
  eo.model_yaml = (root / "bad.yaml").string();
  const std::string e = convert_error([&] { ring::hf::export_model(eo); });
  EXPECT_NE(e.find("model.rope_theta is 10000"), std::string::npos) << e;
  EXPECT_NE(e.find("records 500000"), std::string::npos) << e;
  // import --dtype fp32 overrides the bfloat16 default.
  ring::hf::ImportOptions io;
  io.src = m.dir.string();
  io.out = (root / "ck3").string();
  io.fsync = false;
  io.dtype = "fp32";
  EXPECT_EQ(ring::hf::import_model(io).config.model.dtype, ring::spec::DType::kFp32);
  fs::remove_all(root);
}
