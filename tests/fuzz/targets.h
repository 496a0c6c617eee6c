// The fuzz targets' bodies, shared by the libFuzzer entry points (fuzz_entry.cc, build-fuzz/,
// scripts/fuzz.sh) and by fuzz_replay_test (normal build), which runs every corpus file through
// the same function so a fixed finding stays fixed.
//
// Each function takes any bytes. Bad input must end in the parser's own error type; anything
// else (a crash, a sanitizer report, another exception, a broken invariant) is a finding:
// fail() prints what broke and aborts, which libFuzzer and gtest both report with the input.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace ring::fuzz {

// Job spec text: load_spec_string (and the planner for specs that validate).
void spec_input(const uint8_t* data, size_t size);
// One ZeroMQ control message: protocol::parse; what parses re-encodes and parses to the same.
void protocol_input(const uint8_t* data, size_t size);
// One line of ringd's worker control socket, read by each side (contract::control); round trip.
void worker_control_input(const uint8_t* data, size_t size);
// A checkpoint step directory: checkpoint.json, node-00000.json and node-00000.bin, inspected,
// verified and loaded (checkpoint_target.cc documents the input layout).
void checkpoint_input(const uint8_t* data, size_t size);
// A shared-memory segment as a worker maps it: header and size (shm_target.cc).
void shm_input(const uint8_t* data, size_t size);
// A safetensors file, whole (safetensors_target.cc).
void safetensors_input(const uint8_t* data, size_t size);
// One HTTP request as ring-coord's web endpoint reads it, parsed and routed (http_target.cc).
void http_input(const uint8_t* data, size_t size);
// A Hugging Face config.json as `ringctl import` reads it (hf_config_target.cc).
void hf_config_input(const uint8_t* data, size_t size);

[[noreturn]] void fail(const char* target, const std::string& what);

}  // namespace ring::fuzz
