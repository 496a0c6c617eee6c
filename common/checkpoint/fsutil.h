// File helpers of ring_checkpoint: whole writes and reads that retry EINTR, fsync of files and
// directories, atomic replacement (temporary + fsync + rename + fsync of the directory). Every
// failure throws CheckpointError naming the path and the errno text.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace ring::ckpt::fs {

std::string errno_text(int err);
std::string join(const std::string& dir, const std::string& name);
std::string basename(const std::string& path);
std::string dirname(const std::string& path);   // "." when none

void mkdirs(const std::string& dir);  // like mkdir -p
void fsync_dir(const std::string& dir);
void pwrite_all(int fd, const void* p, size_t n, uint64_t off, const std::string& path);
void pread_all(int fd, void* p, size_t n, uint64_t off, const std::string& path);
// Writes `text` to dir/name (0600) with common/files/atomic_write.h; fsyncs when do_fsync.
void write_atomic(const std::string& dir, const std::string& name, const std::string& text,
                  bool do_fsync);
// Reads a whole file of at most max_bytes; throws naming the file when missing, unreadable or
// larger.
std::string read_file(const std::string& path, size_t max_bytes);
bool exists(const std::string& path);
bool is_dir(const std::string& path);
uint64_t file_size(const std::string& path);  // throws when missing
std::vector<std::string> list_dir(const std::string& dir);  // names, no "." and ".."
void remove_tree(const std::string& path);                  // best effort, never throws

}  // namespace ring::ckpt::fs
