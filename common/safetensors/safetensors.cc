#include "common/safetensors/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "common/numeric/bf16.h"

namespace ring::st {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; this reader assumes a little-endian host");

namespace {

using nlohmann::json;

[[noreturn]] void fail(const std::string& file, const std::string& what) {
  throw SafetensorsError(file + ": " + what);
}
[[noreturn]] void fail_t(const std::string& file, const std::string& tensor,
                         const std::string& what) {
  throw SafetensorsError(file + ": tensor '" + tensor + "': " + what);
}

// The dtypes of the format this reader knows but does not convert.
const std::set<std::string>& unsupported_dtypes() {
  static const std::set<std::string> s{
      "F64",  "I64",     "I32",     "I16",     "I8",      "U64",     "U32", "U16", "U8",
      "BOOL", "F8_E4M3", "F8_E5M2", "F8_E8M0", "F6_E2M3", "F6_E3M2", "F4",  "C64"};
  return s;
}

bool valid_utf8(const std::string& s) {
  size_t i = 0, n = s.size();
  while (i < n) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    int len;
    uint32_t cp;
    if (c < 0x80) {
      ++i;
      continue;
    }
    if ((c & 0xE0) == 0xC0) {
      len = 2;
      cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3;
      cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4;
      cp = c & 0x07;
    } else
      return false;
    if (i + len > n) return false;
    for (int k = 1; k < len; ++k) {
      unsigned char d = static_cast<unsigned char>(s[i + k]);
      if ((d & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (d & 0x3F);
    }
    if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) ||
        cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
      return false;
    i += len;
  }
  return true;
}

// A JSON value as a non-negative integer that fits uint64 (nlohmann keeps large ones unsigned,
// negative ones signed, others float).
bool as_u64(const json& v, uint64_t& out) {
  if (v.is_number_unsigned()) {
    out = v.get<uint64_t>();
    return true;
  }
  if (v.is_number_integer()) {
    int64_t x = v.get<int64_t>();
    if (x < 0) return false;
    out = static_cast<uint64_t>(x);
    return true;
  }
  return false;
}

std::string errno_text() {
  return std::strerror(errno);
}

}  // namespace

const char* dtype_name(DType t) {
  switch (t) {
    case DType::kF32:
      return "F32";
    case DType::kF16:
      return "F16";
    case DType::kBF16:
      return "BF16";
  }
  return "?";
}

size_t dtype_size(DType t) {
  return t == DType::kF32 ? 4 : 2;
}

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

float bf16_to_f32(uint16_t h) { return numeric::bf16_to_f32(h); }

float f16_to_f32(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1F;
  uint32_t man = h & 0x3FF;
  uint32_t u;
  if (exp == 0) {
    if (man == 0) {
      u = sign;
    } else {  // subnormal: man * 2^-24, exact in fp32
      float f = std::ldexp(static_cast<float>(man), -24);
      u = sign | std::bit_cast<uint32_t>(f);
    }
  } else if (exp == 31) {
    u = sign | 0x7F800000u | (man << 13);  // inf, or NaN with its payload
  } else {
    u = sign | ((exp + 112) << 23) | (man << 13);
  }
  return std::bit_cast<float>(u);
}

uint16_t f32_to_bf16(float f) { return numeric::f32_to_bf16(f); }

// ---- File ----------------------------------------------------------------------------------

File::File(File&& o) noexcept {
  *this = std::move(o);
}

File& File::operator=(File&& o) noexcept {
  if (this != &o) {
    if (map_) munmap(map_, map_bytes_);
    path_ = std::move(o.path_);
    base_ = o.base_;
    size_ = o.size_;
    data_ = o.data_;
    data_bytes_ = o.data_bytes_;
    map_ = o.map_;
    map_bytes_ = o.map_bytes_;
    tensors_ = std::move(o.tensors_);
    metadata_ = std::move(o.metadata_);
    by_name_ = std::move(o.by_name_);
    o.map_ = nullptr;
    o.base_ = o.data_ = nullptr;
  }
  return *this;
}

File::~File() {
  if (map_) munmap(map_, map_bytes_);
}

File File::open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(path, "cannot open: " + errno_text());
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    std::string e = errno_text();
    ::close(fd);
    fail(path, "cannot stat: " + e);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    fail(path, "not a regular file");
  }
  File f;
  f.path_ = path;
  f.size_ = static_cast<uint64_t>(st.st_size);
  if (f.size_ > 0) {
    void* m = mmap(nullptr, f.size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (m == MAP_FAILED) {
      std::string e = errno_text();
      ::close(fd);
      fail(path, "cannot map: " + e);
    }
    f.map_ = m;
    f.map_bytes_ = f.size_;
    f.base_ = static_cast<const uint8_t*>(m);
  }
  ::close(fd);
  f.validate();
  return f;
}

File File::parse(const void* data, size_t size, const std::string& name) {
  File f;
  f.path_ = name;
  f.base_ = static_cast<const uint8_t*>(data);
  f.size_ = size;
  f.validate();
  return f;
}

size_t json_nesting_depth(std::string_view text) {
  size_t depth = 0, deepest = 0;
  bool in_string = false, escaped = false;
  for (char c : text) {
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == '"') in_string = true;
    else if (c == '[' || c == '{') deepest = std::max(deepest, ++depth);
    else if ((c == ']' || c == '}') && depth > 0) --depth;
  }
  return deepest;
}

void File::validate() {
  const std::string& p = path_;
  if (size_ < 8)
    fail(p, "truncated: " + std::to_string(size_) +
                " bytes, less than the 8-byte header length (rule: file starts with a u64 header "
                "length)");
  uint64_t n = 0;
  std::memcpy(&n, base_, 8);
  if (n > kMaxHeaderBytes)
    fail(p, "header length " + std::to_string(n) + " exceeds the limit of " +
                std::to_string(kMaxHeaderBytes) + " bytes (rule: header length bounded)");
  if (n > size_ - 8)
    fail(p, "truncated: header length " + std::to_string(n) + " but only " +
                std::to_string(size_ - 8) + " bytes follow (rule: header inside the file)");
  if (n < 2) fail(p, "header of " + std::to_string(n) + " bytes cannot be a JSON object");
  std::string text(reinterpret_cast<const char*>(base_ + 8), n);
  if (text[0] != '{') fail(p, "header does not start with '{' (rule: header is a JSON object)");
  // The JSON parser takes a NUL byte for the end of its input: the rest of the header would be
  // ignored. The format pads a header with spaces (0x20) only.
  if (const size_t z = text.find('\0'); z != std::string::npos)
    fail(p, "header has a NUL byte at offset " + std::to_string(z) +
                " (rule: header is UTF-8 JSON, padded with spaces only)");
  if (!valid_utf8(text)) fail(p, "header is not valid UTF-8 (rule: header is UTF-8 JSON)");
  if (json_nesting_depth(text) > kMaxJsonDepth)
    fail(p, "header nests arrays or objects deeper than " + std::to_string(kMaxJsonDepth) +
                " levels (rule: header maps names to {dtype, shape, data_offsets})");
  data_ = base_ + 8 + n;
  data_bytes_ = size_ - 8 - n;

  // Duplicate names: nlohmann keeps the last one silently, so count top-level keys as parsed.
  std::string duplicate;
  std::set<std::string> seen;
  json::parser_callback_t cb = [&](int depth, json::parse_event_t ev, json& parsed) {
    if (ev == json::parse_event_t::key && depth == 1) {
      const std::string& k = parsed.get_ref<const std::string&>();
      if (!seen.insert(k).second && duplicate.empty()) duplicate = k;
    }
    return true;
  };
  json h;
  try {
    h = json::parse(text, cb);
  } catch (const json::exception& e) {
    fail(p, std::string("header is not valid JSON (rule: header is UTF-8 JSON): ") + e.what());
  }
  if (!duplicate.empty())
    fail_t(p, duplicate, "name appears twice in the header (rule: names unique)");
  if (!h.is_object()) fail(p, "header is not a JSON object");

  for (auto it = h.begin(); it != h.end(); ++it) {
    const std::string& name = it.key();
    const json& v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object())
        fail(p, "__metadata__ is not an object (rule: __metadata__ maps strings to strings)");
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string())
          fail(p, "__metadata__ '" + m.key() +
                      "' is not a string (rule: __metadata__ maps strings to strings)");
        metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    if (name.empty()) fail(p, "a tensor has an empty name (rule: names non-empty)");
    if (!valid_utf8(name)) fail(p, "a tensor name is not valid UTF-8 (rule: names are UTF-8)");
    if (!v.is_object()) fail_t(p, name, "entry is not an object {dtype, shape, data_offsets}");
    for (auto k = v.begin(); k != v.end(); ++k)
      if (k.key() != "dtype" && k.key() != "shape" && k.key() != "data_offsets")
        fail_t(p, name, "unknown key '" + k.key() + "' (rule: dtype, shape, data_offsets only)");
    if (!v.contains("dtype") || !v["dtype"].is_string())
      fail_t(p, name, "dtype missing or not a string");
    const std::string ds = v["dtype"].get<std::string>();
    TensorInfo t;
    t.name = name;
    if (ds == "F32")
      t.dtype = DType::kF32;
    else if (ds == "F16")
      t.dtype = DType::kF16;
    else if (ds == "BF16")
      t.dtype = DType::kBF16;
    else if (unsupported_dtypes().count(ds))
      fail_t(p, name, "dtype " + ds + " is unsupported (rule: dtype F32, F16 or BF16)");
    else
      fail_t(p, name, "unknown dtype '" + ds + "' (rule: dtype F32, F16 or BF16)");
    if (!v.contains("shape") || !v["shape"].is_array())
      fail_t(p, name, "shape missing or not an array");
    uint64_t elems = 1;
    bool overflow = false;
    for (const json& d : v["shape"]) {
      uint64_t x;
      if (!as_u64(d, x))
        fail_t(p, name,
               "shape dimension " + d.dump() + " is not an integer >= 0 (rule: dims >= 0)");
      if (x > static_cast<uint64_t>(INT64_MAX) || __builtin_mul_overflow(elems, x, &elems))
        overflow = true;
      t.shape.push_back(static_cast<int64_t>(std::min<uint64_t>(x, INT64_MAX)));
    }
    uint64_t bytes = 0;
    if (overflow || elems > static_cast<uint64_t>(INT64_MAX) ||
        __builtin_mul_overflow(elems, static_cast<uint64_t>(dtype_size(t.dtype)), &bytes) ||
        bytes > static_cast<uint64_t>(INT64_MAX))
      fail_t(p, name,
             "shape " + v["shape"].dump() +
                 " overflows (rule: product of dims x dtype size fits int64)");
    if (!v.contains("data_offsets") || !v["data_offsets"].is_array() ||
        v["data_offsets"].size() != 2)
      fail_t(p, name, "data_offsets missing or not [begin, end]");
    if (!as_u64(v["data_offsets"][0], t.begin) || !as_u64(v["data_offsets"][1], t.end))
      fail_t(p, name, "data_offsets " + v["data_offsets"].dump() + " are not integers >= 0");
    if (t.end < t.begin)
      fail_t(p, name, "data_offsets " + v["data_offsets"].dump() + " end before they begin");
    if (t.end > data_bytes_)
      fail_t(p, name,
             "data_offsets " + v["data_offsets"].dump() + " past the end of the data section (" +
                 std::to_string(data_bytes_) + " bytes; rule: offsets inside the data section)");
    if (t.end - t.begin != bytes)
      fail_t(p, name,
             "data_offsets " + v["data_offsets"].dump() + " hold " +
                 std::to_string(t.end - t.begin) + " bytes but shape " + v["shape"].dump() + " x " +
                 ds + " needs " + std::to_string(bytes) +
                 " (rule: end - begin == product x dtype size)");
    tensors_.push_back(std::move(t));
  }
  // File order (nlohmann's object iterates by name): by offset, then name for empty tensors.
  std::sort(tensors_.begin(), tensors_.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.name < b.name;
  });
  by_name_.clear();
  for (size_t i = 0; i < tensors_.size(); ++i) by_name_[tensors_[i].name] = i;
  // Overlaps: sorted by begin, each must end before (or where) the next begins. Empty tensors
  // occupy nothing.
  std::vector<const TensorInfo*> order;
  for (const auto& t : tensors_)
    if (t.end > t.begin) order.push_back(&t);
  std::sort(order.begin(), order.end(),
            [](const TensorInfo* a, const TensorInfo* b) { return a->begin < b->begin; });
  for (size_t i = 1; i < order.size(); ++i)
    if (order[i]->begin < order[i - 1]->end)
      fail_t(p, order[i]->name,
             "bytes [" + std::to_string(order[i]->begin) + ", " + std::to_string(order[i]->end) +
                 ") overlap tensor '" + order[i - 1]->name + "' [" +
                 std::to_string(order[i - 1]->begin) + ", " + std::to_string(order[i - 1]->end) +
                 ") (rule: no overlaps)");
}

const TensorInfo* File::find(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &tensors_[it->second];
}

void File::to_f32(const TensorInfo& t, float* out) const {
  const uint8_t* src = raw(t);
  const int64_t n = t.numel();
  if (n == 0) return;  // an empty tensor: `out` may be null (an empty vector's data())
  switch (t.dtype) {
    case DType::kF32:
      std::memcpy(out, src, static_cast<size_t>(n) * 4);
      break;
    case DType::kBF16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, src + 2 * i, 2);
        out[i] = bf16_to_f32(h);
      }
      break;
    case DType::kF16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, src + 2 * i, 2);
        out[i] = f16_to_f32(h);
      }
      break;
  }
}

std::vector<float> File::to_f32(const TensorInfo& t) const {
  std::vector<float> v(static_cast<size_t>(t.numel()));
  to_f32(t, v.data());
  return v;
}

// ---- Model ---------------------------------------------------------------------------------

Model Model::open(const std::string& file_or_dir) {
  namespace fs = std::filesystem;
  Model m;
  std::error_code ec;
  if (!fs::is_directory(file_or_dir, ec)) {
    m.files_.push_back(std::make_unique<File>(File::open(file_or_dir)));
  } else {
    const std::string index = file_or_dir + "/model.safetensors.index.json";
    if (fs::exists(index, ec)) {
      std::ifstream in(index, std::ios::binary);
      if (!in) fail(index, "cannot read");
      std::stringstream ss;
      ss << in.rdbuf();
      json j;
      try {
        j = json::parse(ss.str());
      } catch (const json::exception& e) {
        fail(index, std::string("not valid JSON: ") + e.what());
      }
      if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
        fail(index, "no weight_map object (rule: {\"weight_map\": {tensor: file}})");
      std::map<std::string, std::set<std::string>> by_file;
      for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
        if (!it.value().is_string()) fail(index, "weight_map '" + it.key() + "' is not a string");
        std::string f = it.value().get<std::string>();
        if (f.empty() || f.find('/') != std::string::npos || f == "." || f == "..")
          fail(index, "weight_map '" + it.key() + "' names '" + f +
                          "' (rule: a file name in the same directory)");
        by_file[f].insert(it.key());
      }
      for (const auto& [f, names] : by_file) {
        m.files_.push_back(std::make_unique<File>(File::open(file_or_dir + "/" + f)));
        const File& file = *m.files_.back();
        for (const auto& n : names)
          if (!file.find(n))
            fail(index, "weight_map puts '" + n + "' in " + f + ", which does not hold it");
        for (const auto& t : file.tensors())
          if (!names.count(t.name))
            fail(file.path(), "tensor '" + t.name + "' is not in the index's weight_map");
      }
    } else if (fs::exists(file_or_dir + "/model.safetensors", ec)) {
      m.files_.push_back(std::make_unique<File>(File::open(file_or_dir + "/model.safetensors")));
    } else {
      fail(file_or_dir, "neither model.safetensors.index.json nor model.safetensors is here");
    }
  }
  for (const auto& f : m.files_)
    for (const auto& t : f->tensors()) {
      if (m.entries_.count(t.name))
        fail(f->path(), "tensor '" + t.name + "' is also in " + m.entries_[t.name].file->path() +
                            " (rule: names unique)");
      m.entries_[t.name] = Entry{f.get(), &t};
    }
  return m;
}

std::vector<std::string> Model::names() const {
  std::vector<std::string> v;
  for (const auto& [k, e] : entries_) v.push_back(k);
  return v;
}

const Model::Entry* Model::find(const std::string& name) const {
  auto it = entries_.find(name);
  return it == entries_.end() ? nullptr : &it->second;
}

uint64_t Model::total_bytes() const {
  uint64_t b = 0;
  for (const auto& f : files_) b += f->file_bytes();
  return b;
}

// ---- writing -------------------------------------------------------------------------------

namespace {

std::string make_header(const std::vector<WriteTensor>& tensors, DType dtype,
                        const std::map<std::string, std::string>& metadata) {
  // Built by hand to keep the given order (nlohmann's object sorts keys); strings escaped by
  // nlohmann.
  std::string h = "{";
  bool first = true;
  if (!metadata.empty()) {
    h += "\"__metadata__\":" + json(metadata).dump();
    first = false;
  }
  uint64_t off = 0;
  for (const auto& t : tensors) {
    uint64_t n = 1;
    for (int64_t d : t.shape) n *= static_cast<uint64_t>(d);
    uint64_t bytes = n * dtype_size(dtype);
    if (!first) h += ",";
    first = false;
    h += json(t.name).dump() + ":{\"dtype\":\"" + dtype_name(dtype) +
         "\",\"shape\":" + json(t.shape).dump() + ",\"data_offsets\":[" + std::to_string(off) +
         "," + std::to_string(off + bytes) + "]}";
    off += bytes;
  }
  h += "}";
  while (h.size() % 8) h += ' ';  // the reference implementation pads with spaces
  return h;
}

}  // namespace

uint64_t file_size(const std::vector<WriteTensor>& tensors, DType dtype,
                   const std::map<std::string, std::string>& metadata) {
  uint64_t b = 8 + make_header(tensors, dtype, metadata).size();
  for (const auto& t : tensors) {
    uint64_t n = 1;
    for (int64_t d : t.shape) n *= static_cast<uint64_t>(d);
    b += n * dtype_size(dtype);
  }
  return b;
}

void write_file(const std::string& path, const std::vector<WriteTensor>& tensors, DType dtype,
                const std::map<std::string, std::string>& metadata) {
  if (dtype == DType::kF16) fail(path, "writing F16 is not supported (F32 or BF16)");
  std::set<std::string> names;
  for (const auto& t : tensors) {
    if (t.name.empty() || !valid_utf8(t.name) || t.name == "__metadata__")
      fail(path, "cannot write a tensor named '" + t.name + "'");
    if (!names.insert(t.name).second) fail_t(path, t.name, "given twice");
    for (int64_t d : t.shape)
      if (d < 0) fail_t(path, t.name, "negative dimension");
  }
  const std::string header = make_header(tensors, dtype, metadata);
  const std::string tmp = path + ".tmp-" + std::to_string(getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) fail(tmp, "cannot create: " + errno_text());
  // Writes go out in chunks of a few MiB (the source stays in cache between the copy into the
  // page cache and the next chunk), and writeback of each 64 MiB starts as soon as it is written
  // (sync_file_range), so the final fsync waits for the tail only instead of the whole file
  // and the writer is not throttled on a mountain of dirty pages.
  constexpr size_t kWriteChunk = size_t{4} << 20, kFlushEvery = size_t{64} << 20;
  uint64_t written = 0, flushed = 0;
  auto kick = [&] {
    if (written - flushed >= kFlushEvery) {
      // Advisory: an error here shows again at fsync.
      (void)::sync_file_range(fd, static_cast<off_t>(flushed),
                              static_cast<off_t>(written - flushed), SYNC_FILE_RANGE_WRITE);
      flushed = written;
    }
  };
  auto put = [&](const void* p, size_t n) {
    const char* c = static_cast<const char*>(p);
    while (n > 0) {
      ssize_t w = ::write(fd, c, std::min(n, kWriteChunk));
      if (w < 0) {
        if (errno == EINTR) continue;
        std::string e = errno_text();
        ::close(fd);
        ::unlink(tmp.c_str());
        fail(tmp, "write failed: " + e);
      }
      c += w;
      n -= static_cast<size_t>(w);
      written += static_cast<uint64_t>(w);
      kick();
    }
  };
  uint64_t n = header.size();
  put(&n, 8);
  put(header.data(), header.size());
  std::vector<uint16_t> buf;
  constexpr int64_t kChunk = 1 << 20;  // elements converted at a time
  for (const auto& t : tensors) {
    int64_t numel = 1;
    for (int64_t d : t.shape) numel *= d;
    if (t.src_fd >= 0) {
      // File to file in the kernel; where the kernel cannot (another file system on an old
      // kernel), through a buffer.
      loff_t in = static_cast<loff_t>(t.src_offset);
      size_t left = static_cast<size_t>(numel) * dtype_size(dtype);
      while (left > 0) {
        ssize_t c = ::copy_file_range(t.src_fd, &in, fd, nullptr, std::min(left, kFlushEvery), 0);
        if (c > 0) {
          left -= static_cast<size_t>(c);
          written += static_cast<uint64_t>(c);
          kick();
          continue;
        }
        if (c < 0 && errno == EINTR) continue;
        if (c < 0 && errno != EXDEV && errno != EINVAL && errno != ENOSYS && errno != EOPNOTSUPP) {
          std::string e = errno_text();
          ::close(fd);
          ::unlink(tmp.c_str());
          fail_t(path, t.name, "copy failed: " + e);
        }
        if (c == 0 && left > 0) {
          ::close(fd);
          ::unlink(tmp.c_str());
          fail_t(path, t.name, "source file ended early");
        }
        std::vector<char> b(std::min<size_t>(left, size_t{4} << 20));
        while (left > 0) {
          ssize_t r = ::pread(t.src_fd, b.data(), std::min(left, b.size()), in);
          if (r < 0 && errno == EINTR) continue;
          if (r <= 0) {
            std::string e = r < 0 ? errno_text() : std::string("source file ended early");
            ::close(fd);
            ::unlink(tmp.c_str());
            fail_t(path, t.name, "read failed: " + e);
          }
          put(b.data(), static_cast<size_t>(r));
          in += r;
          left -= static_cast<size_t>(r);
        }
      }
    } else if (t.bf16 && dtype == DType::kBF16) {
      put(t.bf16, static_cast<size_t>(numel) * 2);
    } else if (t.bf16) {
      std::vector<float> wide;
      for (int64_t i = 0; i < numel; i += kChunk) {
        int64_t m = std::min(kChunk, numel - i);
        wide.resize(static_cast<size_t>(m));
        for (int64_t k = 0; k < m; ++k) wide[k] = bf16_to_f32(t.bf16[i + k]);
        put(wide.data(), static_cast<size_t>(m) * 4);
      }
    } else if (dtype == DType::kF32) {
      put(t.data, static_cast<size_t>(numel) * 4);
    } else {
      for (int64_t i = 0; i < numel; i += kChunk) {
        int64_t m = std::min(kChunk, numel - i);
        buf.resize(static_cast<size_t>(m));
        for (int64_t k = 0; k < m; ++k) buf[k] = f32_to_bf16(t.data[i + k]);
        put(buf.data(), static_cast<size_t>(m) * 2);
      }
    }
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    std::string e = errno_text();
    ::unlink(tmp.c_str());
    fail(tmp, "fsync/close failed: " + e);
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    std::string e = errno_text();
    ::unlink(tmp.c_str());
    fail(path, "rename failed: " + e);
  }
}

}  // namespace ring::st
