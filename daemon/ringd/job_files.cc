#include "daemon/ringd/job_files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>
#include <sstream>

#include "common/log/log.h"

namespace ring::ringd {

std::vector<std::string> last_lines(const std::string& path, size_t count) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return {};
  in.seekg(0, std::ios::end);
  const std::streamoff size = in.tellg();
  const std::streamoff from = std::max<std::streamoff>(0, size - 16384);
  in.seekg(from);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::string> lines;
  std::stringstream ss(text);
  // A worker's output is external text: any bytes (a crash dump, a binary printed by mistake).
  for (std::string l; std::getline(ss, l);)
    if (!l.empty()) lines.push_back(log::valid_utf8(l));
  if (from > 0 && !lines.empty()) lines.erase(lines.begin());  // a partial first line
  if (lines.size() > count) lines.erase(lines.begin(), lines.end() - count);
  return lines;
}

}  // namespace ring::ringd
