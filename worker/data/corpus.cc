#include "worker/data/corpus.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <set>
#include <utility>

#include "fmt/format.h"
#include "worker/data/errors.h"

namespace ring::data {
namespace {

constexpr size_t kMaxSkippedExamples = 8;
constexpr unsigned kReadChunk = 1u << 20;  // bytes per gzread call

std::string os_error(int err) {
  return std::strerror(err);
}

}  // namespace

// Mixes 8 bytes at a time (tail padded with zeros); not cryptographic, only to tell corpora apart.
uint64_t hash_bytes(uint64_t h, const uint8_t* p, size_t n) {
  constexpr uint64_t kMul = 0x9e3779b97f4a7c15ull;
  auto mix = [&](uint64_t w) {
    h ^= w;
    h *= kMul;
    h ^= h >> 29;
  };
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);
    mix(w);
  }
  uint64_t tail = 0;
  std::memcpy(&tail, p + i, n - i);
  mix(tail ^ (uint64_t{n - i} << 56));
  return h;
}

namespace {

struct FileEntry {
  std::string path;
  size_t root = 0;         // index into the user's paths
  bool explicit_ = false;  // the path was named in data.paths itself
};

// Closes a file descriptor on every exit path.
struct FdCloser {
  int fd = -1;
  ~FdCloser() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

double invalid_utf8_fraction(std::span<const uint8_t> b) {
  if (b.empty()) return 0.0;
  size_t invalid = 0;
  size_t i = 0;
  const size_t n = b.size();
  while (i < n) {
    uint8_t c = b[i];
    size_t need;
    if (c < 0x80) {
      ++i;
      continue;
    } else if (c >= 0xC2 && c <= 0xDF) {
      need = 1;
    } else if (c >= 0xE0 && c <= 0xEF) {
      need = 2;
    } else if (c >= 0xF0 && c <= 0xF4) {
      need = 3;
    } else {
      ++invalid;
      ++i;
      continue;
    }
    size_t k = 1;
    while (k <= need && i + k < n && (b[i + k] & 0xC0) == 0x80) ++k;
    if (k == need + 1) {
      i += k;
    } else if (i + k == n) {
      i = n;  // a sequence cut by the end of the buffer (byte cap): not counted
    } else {
      ++invalid;  // the lead byte is invalid; continuation bytes are re-examined
      ++i;
    }
  }
  return static_cast<double>(invalid) / static_cast<double>(n);
}

class TextCorpus::Builder {
 public:
  Builder(const std::vector<std::string>& paths, const CorpusOptions& o) : paths_(paths), o_(o) {}

  void check_options() const {
    if (o_.max_doc_len < 0 || o_.min_doc_len < 1 || o_.max_total_bytes < 1)
      throw DataError(
          fmt::format("corpus options: max_doc_len ({}) must be >= 0, min_doc_len ({}) >= 1, "
                      "max_total_bytes ({}) >= 1",
                      o_.max_doc_len, o_.min_doc_len, o_.max_total_bytes));
  }

  TextCorpus build() {
    check_options();
    if (paths_.empty()) throw DataError("data.paths: no path given for the text source");
    per_root_.resize(paths_.size());
    for (size_t r = 0; r < paths_.size(); ++r) walk(paths_[r], r, /*is_root=*/true);
    c_.offsets_.push_back(0);
    if (sink_ == nullptr) c_.bytes_.reserve(static_cast<size_t>(estimate_bytes()));
    if (sink_ != nullptr && estimate_ != nullptr && *estimate_) (*estimate_)(estimate_bytes());
    for (const auto& f : files_) {
      if (streamed_bytes_ + static_cast<int64_t>(c_.bytes_.size()) >= o_.max_total_bytes)
        c_.stats_.capped = true;
      if (c_.stats_.capped) {
        ++c_.stats_.files_not_loaded;
        continue;
      }
      read_file(f);
      if (sink_ != nullptr) drain();
    }
    if (c_.num_docs() + streamed_docs_ == 0) throw DataError(empty_message());
    if (sink_ != nullptr) return std::move(c_);
    c_.content_hash_ = hash_bytes(0x7269'6e67'6461'7461ull, c_.bytes_.data(), c_.bytes_.size());
    c_.content_hash_ =
        hash_bytes(c_.content_hash_, reinterpret_cast<const uint8_t*>(c_.offsets_.data()),
                   c_.offsets_.size() * sizeof(int64_t));
    return std::move(c_);
  }

  // Streaming (TextCorpus::stream): every document read so far to the sink, then forgotten.
  void set_sink(const DocumentSink* sink, const std::function<void(int64_t)>* estimate) {
    sink_ = sink;
    estimate_ = estimate;
  }
  void drain() {
    for (int64_t i = 0; i < c_.num_docs(); ++i) (*sink_)(c_.doc(i));
    streamed_docs_ += c_.num_docs();
    streamed_bytes_ += static_cast<int64_t>(c_.bytes_.size());
    c_.bytes_.clear();
    c_.offsets_.assign(1, 0);
  }

  // Appends one document's bytes (already in bytes_ from `begin`) as pieces; trims what is
  // dropped. Returns the number of pieces kept.
  int64_t cut(size_t begin) {
    const int64_t len = static_cast<int64_t>(c_.bytes_.size() - begin);
    const int64_t piece = o_.max_doc_len > 0 ? o_.max_doc_len : len;
    int64_t kept_end = 0, pieces = 0;
    for (int64_t s = 0; s < len; s += piece) {
      int64_t e = std::min(len, s + piece);
      if (e - s < o_.min_doc_len) continue;  // only the last piece can be short
      c_.offsets_.push_back(static_cast<int64_t>(begin) + e);
      kept_end = e;
      ++pieces;
    }
    c_.stats_.bytes_dropped += len - kept_end;
    c_.bytes_.resize(begin + static_cast<size_t>(kept_end));
    return pieces;
  }

  void add_document(std::string_view text) {
    size_t begin = c_.bytes_.size();
    c_.bytes_.insert(c_.bytes_.end(), text.begin(), text.end());
    ++c_.stats_.files_found;
    if (text.empty()) {
      ++c_.stats_.files_empty;
    } else if (cut(begin) > 0) {
      ++c_.stats_.files_used;
    } else {
      ++c_.stats_.files_too_short;
    }
  }

  TextCorpus finish_in_memory() {
    if (c_.num_docs() == 0)
      throw DataError("in-memory corpus: no document is at least min_doc_len tokens long");
    c_.content_hash_ = hash_bytes(0x7269'6e67'6461'7461ull, c_.bytes_.data(), c_.bytes_.size());
    c_.content_hash_ =
        hash_bytes(c_.content_hash_, reinterpret_cast<const uint8_t*>(c_.offsets_.data()),
                   c_.offsets_.size() * sizeof(int64_t));
    return std::move(c_);
  }

  void start_in_memory() {
    check_options();
    c_.offsets_.push_back(0);
  }

 private:
  struct RootCounts {
    int64_t files = 0, docs = 0, binary = 0, empty = 0, short_ = 0, skipped = 0;
  };

  void skip(const std::string& path, size_t root, const std::string& why) {
    ++c_.stats_.entries_skipped;
    ++per_root_[root].skipped;
    if (c_.stats_.skipped_examples.size() < kMaxSkippedExamples)
      c_.stats_.skipped_examples.push_back(path + ": " + why);
  }

  void walk(const std::string& path, size_t root, bool is_root) {
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) {
      int err = errno;
      if (is_root)
        throw DataError(fmt::format("data.paths: cannot read '{}': {}", path, os_error(err)));
      return skip(path, root, os_error(err));
    }
    if (S_ISDIR(st.st_mode)) {
      if (!dirs_seen_.insert({st.st_dev, st.st_ino}).second) return;  // loop or second link
      DIR* d = ::opendir(path.c_str());
      if (d == nullptr) {
        int err = errno;
        if (is_root)
          throw DataError(
              fmt::format("data.paths: cannot read directory '{}': {}", path, os_error(err)));
        return skip(path, root, os_error(err));
      }
      std::vector<std::string> names;
      errno = 0;
      while (dirent* e = ::readdir(d)) {
        std::string name = e->d_name;
        if (name != "." && name != "..") names.push_back(std::move(name));
      }
      ::closedir(d);
      std::sort(names.begin(), names.end());  // byte order: the same on every machine
      std::string prefix = path.ends_with('/') ? path : path + "/";
      for (const auto& n : names) walk(prefix + n, root, false);
    } else if (S_ISREG(st.st_mode)) {
      if (!files_seen_.insert({st.st_dev, st.st_ino}).second) {
        ++c_.stats_.files_duplicate;
        return;
      }
      files_.push_back({path, root, is_root});
    } else {
      if (is_root)
        throw DataError(
            fmt::format("data.paths: '{}' is neither a regular file nor a directory", path));
      skip(path, root, "not a regular file");
    }
  }

  // Bytes the corpus will hold, to reserve the buffer once: plain sizes plus the uncompressed
  // size recorded in each gzip trailer (mod 2^32; a wrong guess only costs a reallocation).
  int64_t estimate_bytes() const {
    int64_t total = 0;
    for (const auto& f : files_) {
      if (total >= o_.max_total_bytes) break;
      FdCloser fd{::open(f.path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK)};
      struct stat st;
      if (fd.fd < 0 || ::fstat(fd.fd, &st) != 0) continue;
      uint8_t magic[2] = {0, 0};
      uint8_t isize[4] = {0, 0, 0, 0};
      if (st.st_size >= 18 && ::pread(fd.fd, magic, 2, 0) == 2 && magic[0] == 0x1f &&
          magic[1] == 0x8b && ::pread(fd.fd, isize, 4, st.st_size - 4) == 4) {
        total += int64_t{isize[0]} | int64_t{isize[1]} << 8 | int64_t{isize[2]} << 16 |
                 int64_t{isize[3]} << 24;
      } else {
        total += st.st_size;
      }
    }
    return std::min(total, o_.max_total_bytes);
  }

  // Reads one file (plain or gzip: gzread passes plain files through) into the tail of bytes_,
  // at most the bytes left under the cap. Returns false with `why` set when it cannot be read.
  bool read_into_buffer(const FileEntry& f, std::string& why) {
    int fd = ::open(f.path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
      why = os_error(errno);
      return false;
    }
    struct stat st;
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
      ::close(fd);
      why = "not a regular file";
      return false;
    }
    gzFile gz = ::gzdopen(fd, "rb");  // owns fd from here
    if (gz == nullptr) {
      ::close(fd);
      why = "cannot start zlib";
      return false;
    }
    ::gzbuffer(gz, 128 * 1024);
    auto& b = c_.bytes_;
    const size_t cap = static_cast<size_t>(o_.max_total_bytes);
    bool ok = true;
    for (;;) {
      size_t left = cap - b.size();
      if (left == 0) {
        // At the cap: the file is cut here if it has more to give.
        char probe;
        if (::gzread(gz, &probe, 1) > 0) c_.stats_.capped = true;
        break;
      }
      // Grow inside the reserved capacity when possible, so the buffer is not reallocated.
      size_t room = b.capacity() - b.size();
      size_t want = std::min<size_t>({left, kReadChunk, room >= 4096 ? room : size_t{65536}});
      size_t old = b.size();
      b.resize(old + want);
      int n = ::gzread(gz, b.data() + old, static_cast<unsigned>(want));
      if (n < 0) {
        int errnum = 0;
        const char* msg = ::gzerror(gz, &errnum);
        why = errnum == Z_ERRNO ? os_error(errno) : std::string("zlib: ") + msg;
        b.resize(old);
        ok = false;
        break;
      }
      b.resize(old + static_cast<size_t>(n));
      if (n == 0) {
        int errnum = 0;
        const char* msg = ::gzerror(gz, &errnum);
        if (errnum != Z_OK) {  // e.g. a truncated .gz: "unexpected end of file"
          why = std::string("zlib: ") + msg;
          ok = false;
        }
        break;
      }
    }
    ::gzclose(gz);
    return ok;
  }

  void read_file(const FileEntry& f) {
    ++c_.stats_.files_found;
    RootCounts& rc = per_root_[f.root];
    ++rc.files;
    const size_t begin = c_.bytes_.size();
    std::string why;
    if (!read_into_buffer(f, why)) {
      c_.bytes_.resize(begin);
      if (f.explicit_)
        throw DataError(fmt::format("data.paths: cannot read '{}': {}", f.path, why));
      return skip(f.path, f.root, why);
    }
    std::span<const uint8_t> text(c_.bytes_.data() + begin, c_.bytes_.size() - begin);
    if (text.empty()) {
      ++c_.stats_.files_empty;
      ++rc.empty;
      return;
    }
    if (std::find(text.begin(), text.end(), uint8_t{0}) != text.end() ||
        invalid_utf8_fraction(text) > o_.max_invalid_utf8_fraction) {
      c_.bytes_.resize(begin);
      ++c_.stats_.files_binary;
      ++rc.binary;
      return;
    }
    int64_t pieces = cut(begin);
    if (pieces == 0) {
      ++c_.stats_.files_too_short;
      ++rc.short_;
      return;
    }
    ++c_.stats_.files_used;
    rc.docs += pieces;
  }

  std::string empty_message() const {
    std::string m = "data.paths: the text source has no document";
    for (size_t r = 0; r < paths_.size(); ++r) {
      const RootCounts& rc = per_root_[r];
      m += fmt::format(
          "; '{}': {} files, {} binary, {} empty, {} shorter than min_doc_len ({}), {} "
          "unreadable",
          paths_[r], rc.files, rc.binary, rc.empty, rc.short_, o_.min_doc_len, rc.skipped);
    }
    if (!c_.stats_.skipped_examples.empty())
      m += "; first skipped: " + c_.stats_.skipped_examples.front();
    return m;
  }

  const std::vector<std::string>& paths_;
  const CorpusOptions& o_;
  TextCorpus c_;
  const DocumentSink* sink_ = nullptr;  // streaming: documents go here, file by file
  const std::function<void(int64_t)>* estimate_ = nullptr;  // streaming: told the bytes ahead
  int64_t streamed_docs_ = 0, streamed_bytes_ = 0;
  std::vector<FileEntry> files_;
  std::vector<RootCounts> per_root_;
  std::set<std::pair<dev_t, ino_t>> dirs_seen_;
  std::set<std::pair<dev_t, ino_t>> files_seen_;
};

TextCorpus TextCorpus::load(const std::vector<std::string>& paths, const CorpusOptions& options) {
  return Builder(paths, options).build();
}

CorpusStats TextCorpus::stream(const std::vector<std::string>& paths, const CorpusOptions& options,
                               const DocumentSink& sink,
                               const std::function<void(int64_t)>& estimate) {
  Builder b(paths, options);
  b.set_sink(&sink, &estimate);
  return b.build().stats_;
}

TextCorpus TextCorpus::from_documents(const std::vector<std::string>& docs,
                                      const CorpusOptions& options) {
  static const std::vector<std::string> kNoPaths;
  Builder b(kNoPaths, options);
  b.start_in_memory();
  for (const auto& d : docs) b.add_document(d);
  return b.finish_in_memory();
}

}  // namespace ring::data
