#include "cli/trace_export.h"

#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <limits>
#include <map>
#include <sstream>
#include <stdexcept>

#include <fmt/format.h>

#include "common/trace/chrome_trace.h"

namespace ring::cli {

using json = nlohmann::json;
namespace fs = std::filesystem;

std::vector<std::string> timeline_files(const std::string& job_dir) {
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(job_dir + "/timeline", ec)) {
    std::error_code tec;
    if (e.symlink_status(tec).type() != fs::file_type::regular) continue;
    const std::string n = e.path().filename().string();
    if (n.rfind("node-", 0) != 0 || n.size() <= 11 || n.substr(n.size() - 6) != ".jsonl") continue;
    const std::string num = n.substr(5, n.size() - 11);
    if (num.empty() || num.size() > 9 || !std::all_of(num.begin(), num.end(), ::isdigit)) continue;
    found.emplace_back(std::stoll(num), e.path().string());
  }
  std::sort(found.begin(), found.end());
  std::vector<std::string> out;
  for (auto& f : found) out.push_back(f.second);
  return out;
}

namespace {

struct Rec {
  int64_t rank, step;
  std::string phase;
  int64_t layer, hop, peer, begin_ns, end_ns, bytes;
};

struct Node {
  std::string file;
  int64_t node_rank = 0;
  std::string name;
  int64_t mono = 0, unix_ns = 0;
  std::vector<Rec> recs;
};

[[noreturn]] void bad(const std::string& file, size_t line, const std::string& what) {
  throw std::runtime_error(fmt::format("{}:{}: {}", file, line, what));
}

Node parse_node(const std::string& file, const std::string& text) {
  Node n;
  n.file = file;
  std::istringstream in(text);
  std::string line;
  size_t no = 0;
  while (std::getline(in, line)) {
    ++no;
    if (line.empty()) continue;
    json j;
    try {
      j = json::parse(line);
    } catch (const json::exception& e) {
      bad(file, no, std::string("not JSON: ") + e.what());
    }
    if (no == 1) {
      if (!j.is_object() || !j.contains("node_rank") || !j["node_rank"].is_number_integer() ||
          !j.contains("clock") || !j["clock"].is_object())
        bad(file, no, "expected the header {\"node_rank\":K,\"node\":...,\"clock\":{...}}");
      n.node_rank = j["node_rank"].get<int64_t>();
      n.name = j.value("node", "");
      const json& c = j["clock"];
      if (!c.value("mono_ns", json()).is_number_integer() ||
          !c.value("unix_ns", json()).is_number_integer())
        bad(file, no, "clock needs integer mono_ns and unix_ns");
      n.mono = c["mono_ns"].get<int64_t>();
      n.unix_ns = c["unix_ns"].get<int64_t>();
      continue;
    }
    if (!j.is_array() || j.size() != 9 || !j[2].is_string())
      bad(file, no, "expected [rank, step, \"phase\", layer, hop, peer, begin_ns, end_ns, bytes]");
    for (size_t i : {0, 1, 3, 4, 5, 6, 7, 8})
      if (!j[i].is_number_integer()) bad(file, no, fmt::format("item {} is not an integer", i));
    Rec r{j[0].get<int64_t>(), j[1].get<int64_t>(), j[2].get<std::string>(),
          j[3].get<int64_t>(), j[4].get<int64_t>(), j[5].get<int64_t>(),
          j[6].get<int64_t>(), j[7].get<int64_t>(), j[8].get<int64_t>()};
    if (r.end_ns < r.begin_ns) bad(file, no, "the record ends before it begins");
    n.recs.push_back(std::move(r));
  }
  if (no == 0) bad(file, 1, "empty timeline file");
  return n;
}

}  // namespace

json build_trace(const std::vector<std::pair<std::string, std::string>>& files,
                 const TraceOptions& o) {
  std::vector<Node> nodes;
  for (const auto& [name, text] : files) nodes.push_back(parse_node(name, text));
  // Each node's monotonic clock on the Unix axis, relative to the earliest event.
  auto unix_of = [](const Node& n, int64_t mono) { return n.unix_ns + (mono - n.mono); };
  int64_t t0 = std::numeric_limits<int64_t>::max();
  for (const Node& n : nodes)
    for (const Rec& r : n.recs)
      if (!o.step || r.step == *o.step) t0 = std::min(t0, unix_of(n, r.begin_ns));
  trace::ChromeTrace t;
  for (const Node& n : nodes) {
    const int64_t pid = n.node_rank;
    t.process(pid, n.name.empty() ? fmt::format("node {}", n.node_rank)
                                  : fmt::format("node {} ({})", n.node_rank, n.name));
    std::map<int64_t, std::string> threads;
    for (const Rec& r : n.recs) {
      if (o.step && r.step != *o.step) continue;
      int64_t tid = 0;
      if (r.rank >= 0) {
        tid = r.rank * 10 + 1;
        if (r.phase == "ring_recv") tid = r.rank * 10 + 2;
        if (r.phase == "ring_send") tid = r.rank * 10 + 3;
        threads[tid] = tid % 10 == 1   ? fmt::format("rank {}", r.rank)
                       : tid % 10 == 2 ? fmt::format("rank {} ring recv", r.rank)
                                       : fmt::format("rank {} ring send", r.rank);
      } else {
        threads[0] = "ringd";
      }
      json args = {{"step", r.step}};
      std::string name = r.phase;
      if (r.layer >= 0) {
        args["layer"] = r.layer;
        if (r.phase == "handover" || r.phase == "exchange")
          name += fmt::format(" bucket {}", r.layer);
        else
          name += fmt::format(" L{}", r.layer);
      }
      if (r.hop >= 0) {
        args["hop"] = r.hop;
        name += fmt::format(" hop {}", r.hop);
      }
      if (r.peer >= 0) args["peer"] = r.peer;
      if (r.bytes > 0) args["bytes"] = r.bytes;
      const int64_t ts = unix_of(n, r.begin_ns) - t0;
      t.complete(name, pid, tid, static_cast<double>(ts) / 1e3,
                 static_cast<double>(r.end_ns - r.begin_ns) / 1e3, std::move(args), r.phase);
    }
    for (const auto& [tid, tname] : threads) t.thread(pid, tid, tname);
  }
  return t.document();
}

}  // namespace ring::cli
