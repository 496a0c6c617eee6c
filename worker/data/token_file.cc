#include "worker/data/token_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <tuple>

#include "common/files/atomic_write.h"
#include "fmt/format.h"
#include "worker/data/errors.h"

namespace ring::data {

namespace {
// A private temporary beside `path` (0600: it holds the user's data, derived from texts that may
// be private; O_EXCL|O_NOFOLLOW through mkstemp), its name in *tmp. nullptr: errno says why.
std::FILE* create_temp(const std::string& path, std::string* tmp) {
  std::string t = path + ".tmp-XXXXXX";
  const int fd = ::mkostemp(t.data(), O_CLOEXEC);
  if (fd < 0) return nullptr;
  std::FILE* f = ::fdopen(fd, "wb");
  if (f == nullptr) {
    ::close(fd);
    ::unlink(t.c_str());
    return nullptr;
  }
  *tmp = t;
  return f;
}

// The .idx: header + offsets, written atomically (private temporary, fsync, rename).
void write_idx(const std::string& idx, const std::vector<uint8_t>& header,
               const std::vector<uint64_t>& offsets) {
  std::string bytes(reinterpret_cast<const char*>(header.data()), header.size());
  bytes.append(reinterpret_cast<const char*>(offsets.data()), offsets.size() * 8);
  try {
    files::write_file_atomic(idx, bytes, 0600);
  } catch (const files::AtomicWriteError& e) {
    throw DataError(std::string("token dataset: ") + e.what());
  }
}
}  // namespace

namespace {

static_assert(std::endian::native == std::endian::little, "token files are little-endian");

// Maps a whole file read-only; {nullptr, 0} for an empty file. Throws DataError.
std::pair<const uint8_t*, size_t> map_file(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    throw DataError(fmt::format("token dataset: cannot open '{}': {}", path, std::strerror(errno)));
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw DataError(fmt::format("token dataset: '{}' is not a regular file", path));
  }
  const auto size = static_cast<size_t>(st.st_size);
  if (size == 0) {
    ::close(fd);
    return {nullptr, 0};
  }
  void* p = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  int err = errno;
  ::close(fd);
  if (p == MAP_FAILED)
    throw DataError(fmt::format("token dataset: cannot map '{}': {}", path, std::strerror(err)));
  return {static_cast<const uint8_t*>(p), size};
}

uint64_t read_u64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}
uint32_t read_u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

}  // namespace

std::string token_file_prefix(const std::string& path) {
  if (path.size() > 4 && (path.ends_with(".bin") || path.ends_with(".idx")))
    return path.substr(0, path.size() - 4);
  return path;
}

// ---- writer ----------------------------------------------------------------------------------

TokenFileWriter::TokenFileWriter(const std::string& prefix, int width, uint64_t vocab,
                                 bool with_mask)
    : prefix_(token_file_prefix(prefix)), width_(width), vocab_(vocab) {
  if (width != 2 && width != 4)
    throw DataError(fmt::format("token dataset: token width {} must be 2 or 4 bytes", width));
  if (width == 2 && vocab > 65536)
    throw DataError(fmt::format(
        "token dataset: vocab {} does not fit uint16 ids (at most 65536); use uint32", vocab));
  const std::string bin = prefix_ + ".bin";
  bin_ = create_temp(bin, &bin_tmp_);
  if (bin_ == nullptr)
    throw DataError(fmt::format("token dataset: cannot create a temporary beside '{}': {}", bin,
                                std::strerror(errno)));
  if (with_mask) {
    const std::string mask = prefix_ + ".mask";
    mask_ = create_temp(mask, &mask_tmp_);
    if (mask_ == nullptr) {
      const int err = errno;
      std::fclose(bin_);
      bin_ = nullptr;
      ::unlink(bin_tmp_.c_str());
      throw DataError(fmt::format("token dataset: cannot create a temporary beside '{}': {}",
                                  mask, std::strerror(err)));
    }
  }
}

TokenFileWriter::~TokenFileWriter() {
  if (bin_ != nullptr) std::fclose(bin_);
  if (!bin_tmp_.empty()) ::unlink(bin_tmp_.c_str());
  if (mask_ != nullptr) std::fclose(mask_);
  if (!mask_tmp_.empty()) ::unlink(mask_tmp_.c_str());
}

namespace {
// Flushes, syncs and closes `*f`, then renames `tmp` to `dst`. Throws DataError.
void commit_file(std::FILE** f, std::string* tmp, const std::string& dst) {
  const bool flushed = std::fflush(*f) == 0 && ::fsync(::fileno(*f)) == 0;
  const int err = errno;
  const bool closed = std::fclose(*f) == 0;
  *f = nullptr;
  if (!closed || !flushed)
    throw DataError(fmt::format("token dataset: writing '{}': {}", dst,
                                std::strerror(flushed ? errno : err)));
  if (::rename(tmp->c_str(), dst.c_str()) != 0)
    throw DataError(fmt::format("token dataset: cannot rename {} to '{}': {}", *tmp, dst,
                                std::strerror(errno)));
  tmp->clear();
}
}  // namespace

void TokenFileWriter::add_document(std::span<const int32_t> ids, std::span<const uint8_t> mask) {
  if ((mask_ != nullptr) != !mask.empty() || (!mask.empty() && mask.size() != ids.size()))
    throw DataError(fmt::format(
        "token dataset '{}': document {} has {} mask entries for {} ids (the dataset {} a loss "
        "mask)",
        prefix_, documents(), mask.size(), ids.size(), mask_ != nullptr ? "has" : "has no"));
  const uint64_t limit = vocab_ > 0 ? vocab_ : (width_ == 2 ? 65536 : uint64_t{1} << 32);
  buf_.resize(ids.size() * static_cast<size_t>(width_));
  for (size_t k = 0; k < ids.size(); ++k) {
    const int64_t id = ids[k];
    if (id < 0 || static_cast<uint64_t>(id) >= limit)
      throw DataError(fmt::format("token dataset '{}': id {} of document {} is outside 0..{}",
                                  prefix_, id, documents(), limit - 1));
    if (width_ == 2) {
      const auto v = static_cast<uint16_t>(id);
      std::memcpy(buf_.data() + 2 * k, &v, 2);
    } else {
      const auto v = static_cast<uint32_t>(id);
      std::memcpy(buf_.data() + 4 * k, &v, 4);
    }
  }
  if (!buf_.empty() && std::fwrite(buf_.data(), 1, buf_.size(), bin_) != buf_.size())
    throw DataError(
        fmt::format("token dataset: writing '{}.bin': {}", prefix_, std::strerror(errno)));
  if (mask_ != nullptr) {
    // Bit t % 8 of byte t / 8 for the dataset's token t; whole bytes are written as they fill.
    mask_buf_.clear();
    uint64_t t = offsets_.back();
    for (uint8_t m : mask) {
      if (m != 0) mask_byte_ |= static_cast<uint8_t>(1u << (t % 8));
      if (++t % 8 == 0) {
        mask_buf_.push_back(mask_byte_);
        mask_byte_ = 0;
      }
    }
    if (!mask_buf_.empty() &&
        std::fwrite(mask_buf_.data(), 1, mask_buf_.size(), mask_) != mask_buf_.size())
      throw DataError(
          fmt::format("token dataset: writing '{}.mask': {}", prefix_, std::strerror(errno)));
  }
  offsets_.push_back(offsets_.back() + ids.size());
}

void TokenFileWriter::finish() {
  if (bin_ == nullptr) return;
  const bool flushed = std::fflush(bin_) == 0 && ::fsync(::fileno(bin_)) == 0;
  const int err = errno;
  if (std::fclose(bin_) != 0 || !flushed) {
    bin_ = nullptr;
    throw DataError(fmt::format("token dataset: writing '{}.bin': {}", prefix_,
                                std::strerror(flushed ? errno : err)));
  }
  bin_ = nullptr;
  if (::rename(bin_tmp_.c_str(), (prefix_ + ".bin").c_str()) != 0)
    throw DataError(fmt::format("token dataset: cannot rename {} to '{}.bin': {}", bin_tmp_,
                                prefix_, std::strerror(errno)));
  bin_tmp_.clear();
  const bool with_mask = mask_ != nullptr;
  if (with_mask) {
    if (offsets_.back() % 8 != 0 && std::fwrite(&mask_byte_, 1, 1, mask_) != 1)
      throw DataError(
          fmt::format("token dataset: writing '{}.mask': {}", prefix_, std::strerror(errno)));
    commit_file(&mask_, &mask_tmp_, prefix_ + ".mask");
  }
  std::vector<uint8_t> h(kTokenIdxHeaderBytes, 0);
  std::memcpy(h.data(), kTokenIdxMagic, 8);
  const uint32_t version = kTokenIdxVersion, width = static_cast<uint32_t>(width_);
  const uint64_t n = offsets_.size() - 1, t = offsets_.back();
  const uint64_t flags = with_mask ? kTokenFlagMask : 0;
  std::memcpy(h.data() + 8, &version, 4);
  std::memcpy(h.data() + 12, &width, 4);
  std::memcpy(h.data() + 16, &n, 8);
  std::memcpy(h.data() + 24, &t, 8);
  std::memcpy(h.data() + 32, &vocab_, 8);
  std::memcpy(h.data() + 40, &flags, 8);
  write_idx(prefix_ + ".idx", h, offsets_);
  // A mask left by an earlier dataset of this name is no longer named by the .idx.
  if (!with_mask) ::unlink((prefix_ + ".mask").c_str());
}

int64_t write_index_for_flat_bin(const std::string& path, int width, int64_t eot, uint64_t vocab) {
  const std::string prefix = token_file_prefix(path), bin = prefix + ".bin";
  if (width != 2 && width != 4)
    throw DataError(fmt::format("token dataset: token width {} must be 2 or 4 bytes", width));
  auto [data, size] = map_file(bin);
  struct Unmap {
    const uint8_t* p;
    size_t n;
    ~Unmap() {
      if (p != nullptr) ::munmap(const_cast<uint8_t*>(p), n);
    }
  } unmap{data, size};
  if (size % static_cast<size_t>(width) != 0)
    throw DataError(fmt::format("token dataset '{}': {} bytes is not a whole number of {}-byte ids",
                                bin, size, width));
  const uint64_t n = size / static_cast<size_t>(width);
  std::vector<uint64_t> offsets{0};
  uint64_t max_id = 0;
  for (uint64_t i = 0; i < n; ++i) {
    uint32_t v = 0;
    std::memcpy(&v, data + i * static_cast<size_t>(width), static_cast<size_t>(width));
    max_id = std::max<uint64_t>(max_id, v);
    if (static_cast<int64_t>(v) == eot) offsets.push_back(i + 1);
  }
  if (offsets.back() != n) offsets.push_back(n);
  if (vocab > 0 && n > 0 && max_id >= vocab)
    throw DataError(
        fmt::format("token dataset '{}': id {} is not below the vocab {}", bin, max_id, vocab));
  std::vector<uint8_t> h(kTokenIdxHeaderBytes, 0);
  std::memcpy(h.data(), kTokenIdxMagic, 8);
  const uint32_t version = kTokenIdxVersion, w = static_cast<uint32_t>(width);
  const uint64_t docs = offsets.size() - 1;
  std::memcpy(h.data() + 8, &version, 4);
  std::memcpy(h.data() + 12, &w, 4);
  std::memcpy(h.data() + 16, &docs, 8);
  std::memcpy(h.data() + 24, &n, 8);
  std::memcpy(h.data() + 32, &vocab, 8);
  write_idx(prefix + ".idx", h, offsets);
  return static_cast<int64_t>(docs);
}

// ---- reader ----------------------------------------------------------------------------------

TokenFile::~TokenFile() {
  if (mask_ != nullptr) ::munmap(const_cast<uint8_t*>(mask_), mask_size_);
  if (bin_ != nullptr) ::munmap(const_cast<uint8_t*>(bin_), bin_size_);
  if (idx_ != nullptr) ::munmap(const_cast<uint8_t*>(idx_), idx_size_);
}

std::shared_ptr<const TokenFile> TokenFile::open(const std::string& path) {
  std::shared_ptr<TokenFile> f(new TokenFile());
  f->prefix_ = token_file_prefix(path);
  const std::string idx = f->prefix_ + ".idx", bin = f->prefix_ + ".bin";
  std::tie(f->idx_, f->idx_size_) = map_file(idx);
  auto bad = [&](const std::string& what) {
    return DataError(fmt::format("token dataset '{}': {}", idx, what));
  };
  if (f->idx_size_ < static_cast<size_t>(kTokenIdxHeaderBytes))
    throw bad(fmt::format("{} bytes, shorter than the {}-byte header", f->idx_size_,
                          kTokenIdxHeaderBytes));
  const uint8_t* h = f->idx_;
  if (std::memcmp(h, kTokenIdxMagic, 8) != 0)
    throw bad(
        "bad magic (expected \"RINGTOK\\0\"; Megatron .idx files start with \"MMIDIDX\" and "
        "are not read)");
  const uint32_t version = read_u32(h + 8);
  if (version != 1 && version != kTokenIdxVersion)
    throw bad(fmt::format("version {} is not supported (this build reads 1 and {})", version,
                          kTokenIdxVersion));
  f->version_ = version;
  const uint32_t width = read_u32(h + 12);
  if (width != 2 && width != 4)
    throw bad(fmt::format("token width {} must be 2 (uint16) or 4 (uint32)", width));
  f->width_ = static_cast<int>(width);
  f->num_docs_ = read_u64(h + 16);
  f->num_tokens_ = read_u64(h + 24);
  f->vocab_ = read_u64(h + 32);
  const uint64_t flags = read_u64(h + 40);
  if (version == 1 && flags != 0) throw bad("reserved header field is not 0");
  if ((flags & ~kTokenFlagMask) != 0)
    throw bad(fmt::format("flags {:#x} has bits this build does not know (bit 0: loss mask)",
                          flags));
  const uint64_t body = f->idx_size_ - kTokenIdxHeaderBytes;
  if (body % 8 != 0 || f->num_docs_ != body / 8 - 1 || body < 8)
    throw bad(fmt::format(
        "the header says {} documents but the file holds {} bytes of offsets "
        "(expected 8 x (documents + 1) = {})",
        f->num_docs_, body, f->num_docs_ < (uint64_t{1} << 60) ? 8 * (f->num_docs_ + 1) : 0));
  // At most 2^60 ids: T x width cannot wrap around 2^64 and match a short .bin.
  if (f->num_tokens_ > (uint64_t{1} << 60))
    throw bad(fmt::format("token count {} is not plausible (at most 2^60)", f->num_tokens_));
  // The offsets start 8-byte aligned (48-byte header on a page-aligned mapping).
  f->offsets_ = reinterpret_cast<const uint64_t*>(h + kTokenIdxHeaderBytes);
  if (f->offsets_[0] != 0) throw bad(fmt::format("offsets[0] is {}, not 0", f->offsets_[0]));
  for (uint64_t i = 0; i < f->num_docs_; ++i)
    if (f->offsets_[i + 1] < f->offsets_[i])
      throw bad(
          fmt::format("offsets[{}] = {} is below offsets[{}] = {} (offsets must not "
                      "decrease)",
                      i + 1, f->offsets_[i + 1], i, f->offsets_[i]));
  if (f->offsets_[f->num_docs_] != f->num_tokens_)
    throw bad(fmt::format("the last offset {} is not the token count {}", f->offsets_[f->num_docs_],
                          f->num_tokens_));
  std::tie(f->bin_, f->bin_size_) = map_file(bin);
  if (f->bin_size_ != f->num_tokens_ * width)
    throw DataError(
        fmt::format("token dataset '{}': {} bytes, but '{}' says {} tokens of {} bytes = {} bytes",
                    bin, f->bin_size_, idx, f->num_tokens_, width, f->num_tokens_ * width));
  if (f->bin_ != nullptr) ::madvise(const_cast<uint8_t*>(f->bin_), f->bin_size_, MADV_RANDOM);
  if ((flags & kTokenFlagMask) != 0) {
    const std::string mask = f->prefix_ + ".mask";
    std::tie(f->mask_, f->mask_size_) = map_file(mask);
    if (f->mask_size_ != (f->num_tokens_ + 7) / 8)
      throw DataError(fmt::format(
          "token dataset '{}': {} bytes, but '{}' says {} tokens: the loss mask needs "
          "ceil(tokens / 8) = {} bytes",
          mask, f->mask_size_, idx, f->num_tokens_, (f->num_tokens_ + 7) / 8));
  }
  return f;
}

}  // namespace ring::data
