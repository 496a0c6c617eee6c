// The files ringd writes into the job directory (its log, steps.jsonl, the workers' logs) and
// reads back (the last lines of a worker's log when it dies).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "common/files/append_file.h"

namespace ring::ringd {

// ringd's appends (its log, steps.jsonl, a worker's log) are common/files/append_file.h's.
using files::AppendFile;
using files::open_private_append;

// The last `count` non-empty lines of the file's last 16 KiB (a partial first line dropped).
std::vector<std::string> last_lines(const std::string& path, size_t count);

}  // namespace ring::ringd
