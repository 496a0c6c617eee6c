// ring_safetensors: reading and writing the safetensors format (Hugging Face), parsed here.
//
// A file is: an 8-byte little-endian header length N, N bytes of UTF-8 JSON (an object: one
// entry per tensor {"dtype": "BF16", "shape": [r, c], "data_offsets": [begin, end)} plus an
// optional "__metadata__" {string: string}), then the data section: raw little-endian tensors,
// offsets relative to its start.
//
//   ring::st::File f = ring::st::File::open("model-00001-of-00002.safetensors");
//   for (const auto& t : f.tensors()) { std::vector<float> x = f.to_f32(t); ... }
//
// Reading maps the file (mmap) and validates everything before handing out a tensor: header
// length bounded and inside the file, valid UTF-8 JSON, tensor names unique, non-empty and
// UTF-8, dtype known and supported (F32, F16, BF16; the integer and f64/f8 types are known but
// "unsupported"), dims >= 0 with product x dtype size not overflowing, offsets inside the data
// section, end - begin == product x dtype size, no two tensors overlapping. Every error is a
// SafetensorsError naming the file, the tensor (when there is one) and the rule broken.
//
// A model split over several files has model.safetensors.index.json ({"weight_map": {tensor:
// file}}); Model opens a file, or a directory with the index or with one model.safetensors.
//
// Writing: fp32 or bf16 (round to nearest even), the header padded with spaces to a multiple of
// 8 bytes as the reference implementation does, tensors in the order given, 8-byte aligned
// offsets are not required by the format and not added (bf16 and f32 data stay contiguous).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace ring::st {

class SafetensorsError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

enum class DType { kF32, kF16, kBF16 };
const char* dtype_name(DType t);  // "F32", "F16", "BF16"
size_t dtype_size(DType t);

// The header's largest accepted length (the reference implementation's bound, 100 MB).
inline constexpr uint64_t kMaxHeaderBytes = 100'000'000;

struct TensorInfo {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // in the data section, bytes
  int64_t numel() const;
};

class File {
 public:
  // Maps and validates `path`; throws SafetensorsError.
  static File open(const std::string& path);
  // Validates bytes already in memory (not copied: they must outlive the File); `name` stands
  // for the file in messages. Throws SafetensorsError.
  static File parse(const void* data, size_t size, const std::string& name);

  File(File&&) noexcept;
  File& operator=(File&&) noexcept;
  ~File();

  const std::string& path() const { return path_; }
  // In file order (by data offset).
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const TensorInfo* find(const std::string& name) const;  // nullptr when absent
  // The tensor's raw little-endian bytes (end - begin of them).
  const uint8_t* raw(const TensorInfo& t) const { return data_ + t.begin; }
  // The tensor as fp32 (bf16 and fp16 convert exactly), into out[numel] / a new vector.
  void to_f32(const TensorInfo& t, float* out) const;
  std::vector<float> to_f32(const TensorInfo& t) const;
  uint64_t file_bytes() const { return size_; }

 private:
  File() = default;
  void validate();
  std::string path_;
  const uint8_t* base_ = nullptr;  // the whole file
  uint64_t size_ = 0;
  const uint8_t* data_ = nullptr;  // the data section
  uint64_t data_bytes_ = 0;
  void* map_ = nullptr;  // owned mapping (open), or nullptr (parse)
  size_t map_bytes_ = 0;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
  std::map<std::string, size_t> by_name_;
};

// One safetensors file, or a directory holding model.safetensors.index.json (its weight_map
// names the file of each tensor) or a single model.safetensors. Every file is opened and
// validated; the index must name every tensor of each file it lists and only those.
class Model {
 public:
  static Model open(const std::string& file_or_dir);
  struct Entry {
    const File* file;
    const TensorInfo* info;
  };
  // Tensor names in sorted order.
  std::vector<std::string> names() const;
  const Entry* find(const std::string& name) const;
  const std::vector<std::unique_ptr<File>>& files() const { return files_; }
  uint64_t total_bytes() const;  // of all files

 private:
  std::vector<std::unique_ptr<File>> files_;
  std::map<std::string, Entry> entries_;
};

// Exact conversions.
// The deepest nesting of arrays and objects in JSON text (brackets inside strings not counted),
// found without parsing: a file nested deeper than any real header or config.json is refused
// before a parser or an error message recurses into it (kMaxJsonDepth).
size_t json_nesting_depth(std::string_view text);
inline constexpr size_t kMaxJsonDepth = 64;

// The project's one bf16 rounding (common/numeric/bf16.h), for callers of this library.
float bf16_to_f32(uint16_t h);
float f16_to_f32(uint16_t h);
uint16_t f32_to_bf16(float f);  // round to nearest even; NaN stays NaN

struct WriteTensor {
  std::string name;
  std::vector<int64_t> shape;
  const float* data = nullptr;  // product(shape) floats
  // Or the same values as bf16 in memory (widened exactly for an F32 file, copied for BF16).
  const uint16_t* bf16 = nullptr;
  // Or the bytes the file holds, already in its dtype, at `src_offset` of the open file
  // `src_fd`: copied file to file inside the kernel (copy_file_range), not through memory.
  int src_fd = -1;
  uint64_t src_offset = 0;
};

// Writes `tensors` as `dtype` (kF32 or kBF16) to `path` (temp + rename),
// with `metadata` as "__metadata__" when not empty; the file is created 0600 (weights are
// private until the user shares them). Throws SafetensorsError.
void write_file(const std::string& path, const std::vector<WriteTensor>& tensors, DType dtype,
                const std::map<std::string, std::string>& metadata = {});

// Bytes write_file will produce (header included).
uint64_t file_size(const std::vector<WriteTensor>& tensors, DType dtype,
                   const std::map<std::string, std::string>& metadata = {});

}  // namespace ring::st
