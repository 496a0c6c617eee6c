// ring_checkpoint's loading across node counts and formats, at library level: a checkpoint
// written by 2 nodes in split ranges (per-parameter names, a layout record) loads on 1, 2, 3 and
// 4 nodes with the right bytes in every tensor; per-node tensors (the residual) follow their
// rule; a node reads only the data files it needs; format 1 checkpoints (flat tensors, written by
// every node) load by slicing; a missing tensor and another model are refused naming them; a
// damaged tensor falls back to the previous checkpoint.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/checkpoint/checkpoint.h"
#include "tests/common/test_proc.h"

using namespace ring::ckpt;
using nlohmann::json;

namespace {

// A toy flat layout: parameters at 16-float aligned offsets, each in its own bucket.
struct Param {
  std::string name;
  std::vector<int64_t> shape;
  int64_t offset = 0, size = 0;
};

const char* const kKinds[] = {"master", "adam_m", "adam_v", "residual"};

struct Model {
  std::vector<Param> params;
  int64_t total = 0;
  json config = {{"layers", 2}, {"d_model", 64}, {"heads", 4}};
  Model() {
    const std::vector<std::pair<std::string, std::vector<int64_t>>> ps = {{"head", {30, 10}},
                                                                          {"layers.1.w", {17}},
                                                                          {"layers.1.v", {25, 40}},
                                                                          {"layers.0.w", {64}},
                                                                          {"embedding", {43, 3}}};
    for (const auto& [n, s] : ps) {
      Param p{n, s, total, 1};
      for (int64_t d : s) p.size *= d;
      total = (total + p.size + 15) / 16 * 16;
      params.push_back(p);
    }
  }
  // Parameters [first, end) per node: node k of `nodes`, split as evenly as whole params allow.
  std::vector<std::pair<int, int>> split(int nodes) const {
    std::vector<std::pair<int, int>> out;
    const int n = static_cast<int>(params.size());
    for (int k = 0; k < nodes; ++k) out.push_back({k * n / nodes, (k + 1) * n / nodes});
    return out;
  }
  Layout layout(int nodes, const std::string& shard) const {
    Layout l;
    l.shard = shard;
    l.nodes = nodes;
    l.total_floats = total;
    l.model = config;
    for (int k = 0; k < nodes; ++k) {
      auto [a, b] = split(nodes)[k];
      const int64_t begin = a < static_cast<int>(params.size()) ? params[a].offset : total;
      const int64_t end = b < static_cast<int>(params.size()) ? params[b].offset : total;
      l.ranges.push_back({k, begin, end, a, b});
    }
    return l;
  }
};

// One node's optimizer state over the whole flat layout (shard none holds all of it): master,
// moments identical on every node (seeded by `shared`), the residual its own (seeded by node).
struct NodeState {
  std::map<std::string, std::vector<float>> kinds;
  NodeState(const Model& m, uint32_t shared, uint32_t own) {
    for (const char* k : kKinds) {
      std::mt19937 rng(std::string(k) == "residual" ? own : shared * 31 + k[0] + k[5]);
      std::uniform_real_distribution<float> d(-1, 1);
      std::vector<float> v(static_cast<size_t>(m.total));
      for (float& x : v) x = d(rng);
      kinds[k] = std::move(v);
    }
  }
  float* at(const std::string& kind, const Param& p) { return kinds.at(kind).data() + p.offset; }
};

Options opts(const std::string& dir, int rank, int nodes) {
  Options o;
  o.dir = dir;
  o.node_rank = rank;
  o.nodes = nodes;
  o.keep_last = 5;
  o.fsync = false;
  o.chunk_bytes = 4096;
  return o;
}

// Writes step `step` from `nodes` writers in the format-2 naming: node k saves master/adam_m/
// adam_v of its parameters and its own residual of every parameter.
void write_v2(const std::string& dir, const Model& m, std::vector<NodeState>& st, int64_t step,
              const std::string& shard = "none") {
  const int nodes = static_cast<int>(st.size());
  std::vector<std::unique_ptr<Checkpointer>> cs;
  for (int k = 0; k < nodes; ++k) {
    Options o = opts(dir, k, nodes);
    o.layout = m.layout(nodes, shard);
    cs.push_back(std::make_unique<Checkpointer>(o));
    auto [a, b] = m.split(nodes)[k];
    for (const char* kind : kKinds)
      for (int i = 0; i < static_cast<int>(m.params.size()); ++i) {
        const bool per_node = std::string(kind) == "residual";
        if (!per_node && (i < a || i >= b)) continue;
        const Param& p = m.params[i];
        cs[k]->add_tensor(std::string(kind) + "/" + p.name, DType::kF32, p.shape,
                          st[k].at(kind, p));
      }
  }
  for (int k = nodes - 1; k >= 0; --k) cs[k]->start(step, {{"cursor", {{"pos", step}}}});
  for (int k = nodes - 1; k >= 0; --k) {
    SaveResult r = cs[k]->wait();
    ASSERT_TRUE(r.ok) << r.error;
  }
}

// The load targets of node `rank` of a job holding every tensor (shard none); with `only` the
// master/adam_m/adam_v of those parameters only (shard optimizer) plus every residual.
struct Targets {
  NodeState got;
  std::vector<LoadTarget> t;
  Targets(const Model& m, const std::vector<int>* only = nullptr) : got(m, 999, 999) {
    for (const char* kind : kKinds)
      for (int i = 0; i < static_cast<int>(m.params.size()); ++i) {
        const bool per_node = std::string(kind) == "residual";
        if (only && !per_node && std::find(only->begin(), only->end(), i) == only->end()) continue;
        const Param& p = m.params[i];
        LoadTarget lt(std::string(kind) + "/" + p.name, DType::kF32, p.shape, got.at(kind, p));
        lt.per_node = per_node;
        lt.flat_name = kind;
        lt.flat_offset = p.offset;
        t.push_back(std::move(lt));
      }
  }
};

bool same_floats(const float* a, const float* b, int64_t n) {
  return std::memcmp(a, b, static_cast<size_t>(n) * 4) == 0;
}

// Checks every parameter of node `rank` of `nodes` against the writers' state.
void expect_loaded(const Model& m, const std::vector<NodeState>& writers, Targets& tg, int rank,
                   int nodes) {
  auto& w = const_cast<std::vector<NodeState>&>(writers);
  for (const Param& p : m.params) {
    for (const char* kind : {"master", "adam_m", "adam_v"})
      EXPECT_TRUE(same_floats(tg.got.at(kind, p), w[0].at(kind, p), p.size))
          << kind << "/" << p.name << " on node " << rank << " of " << nodes;
    const float* r = tg.got.at("residual", p);
    if (nodes == static_cast<int>(writers.size())) {
      EXPECT_TRUE(same_floats(r, w[rank].at("residual", p), p.size))
          << "residual/" << p.name << ": node " << rank << " must get its own";
    } else if (rank == 0) {
      std::vector<float> sum(w[0].at("residual", p), w[0].at("residual", p) + p.size);
      for (size_t k = 1; k < writers.size(); ++k)
        for (int64_t i = 0; i < p.size; ++i) sum[i] += w[k].at("residual", p)[i];
      EXPECT_TRUE(same_floats(r, sum.data(), p.size))
          << "residual/" << p.name << ": node 0 must get the sum in node order";
    } else {
      std::vector<float> zero(static_cast<size_t>(p.size), 0.f);
      EXPECT_TRUE(same_floats(r, zero.data(), p.size))
          << "residual/" << p.name << ": node " << rank << " must get zeros";
    }
  }
}

std::string read_text(const std::string& p) {
  return ring::test::slurp(p);
}

void write_text(const std::string& p, const std::string& s) {
  FILE* f = std::fopen(p.c_str(), "wb");
  ASSERT_TRUE(f) << p;
  std::fwrite(s.data(), 1, s.size(), f);
  std::fclose(f);
}

void flip_byte(const std::string& path, uint64_t off) {
  int fd = ::open(path.c_str(), O_RDWR);
  ASSERT_GE(fd, 0) << path;
  char c;
  ASSERT_EQ(::pread(fd, &c, 1, off), 1);
  c ^= 0x40;
  ASSERT_EQ(::pwrite(fd, &c, 1, off), 1);
  ::close(fd);
}

}  // namespace

TEST(ReshardLoad, TwoNodeCheckpointLoadsOnOneToFourNodes) {
  ring::test::TempDir d("ckpt-reshard");
  Model m;
  std::vector<NodeState> writers = {NodeState(m, 1, 100), NodeState(m, 1, 101)};
  write_v2(d.path, m, writers, 10);
  for (int nodes : {1, 2, 3, 4}) {
    for (int rank = 0; rank < nodes; ++rank) {
      Targets tg(m);
      Layout job = m.layout(nodes, "none");
      LoadResult r = load_latest(d.path, rank, nodes, tg.t, INT64_MAX, &job);
      ASSERT_TRUE(r.loaded) << r.message;
      EXPECT_EQ(r.step, 10);
      EXPECT_EQ(r.nodes, 2);
      EXPECT_EQ(r.format_version, 2);
      ASSERT_TRUE(r.layout.has_value());
      EXPECT_EQ(*r.layout, m.layout(2, "none"));
      EXPECT_EQ(r.meta["cursor"]["pos"], 10);
      if (nodes != 2) {
        EXPECT_NE(r.message.find("written by 2 nodes, shard none; resharded onto " +
                                 std::to_string(nodes) + " nodes"),
                  std::string::npos)
            << r.message;
      }
      expect_loaded(m, writers, tg, rank, nodes);
      // Shard none holds every tensor: both data files are needed.
      EXPECT_EQ(r.shards_read, (std::vector<std::string>{"node-00000.bin", "node-00001.bin"}));
    }
  }
}

TEST(ReshardLoad, ANodeReadsOnlyTheDataFilesItNeeds) {
  ring::test::TempDir d("ckpt-reshard");
  Model m;
  std::vector<NodeState> writers = {NodeState(m, 2, 200), NodeState(m, 2, 201)};
  write_v2(d.path, m, writers, 7, "optimizer");
  // Same node count, shard optimizer: node 1 holds its own range and its residual, all in its
  // own shard.
  {
    std::vector<int> own = {2, 3, 4};
    Targets tg(m, &own);
    LoadResult r = load_latest(d.path, 1, 2, tg.t);
    ASSERT_TRUE(r.loaded) << r.message;
    EXPECT_EQ(r.shards_read, std::vector<std::string>{"node-00001.bin"});
    for (int i : own)
      EXPECT_TRUE(same_floats(tg.got.at("adam_v", m.params[i]),
                              writers[0].at("adam_v", m.params[i]), m.params[i].size));
  }
  // Four nodes: node 3 owns the last parameter (old node 1's) and no residual sum: one file.
  {
    std::vector<int> own = {4};
    Targets tg(m, &own);
    LoadResult r = load_latest(d.path, 3, 4, tg.t);
    ASSERT_TRUE(r.loaded) << r.message;
    EXPECT_EQ(r.shards_read, std::vector<std::string>{"node-00001.bin"});
    EXPECT_TRUE(same_floats(tg.got.at("master", m.params[4]), writers[0].at("master", m.params[4]),
                            m.params[4].size));
  }
  // Node 0 of four sums the residuals: it reads both.
  {
    std::vector<int> own = {0};
    Targets tg(m, &own);
    LoadResult r = load_latest(d.path, 0, 4, tg.t);
    ASSERT_TRUE(r.loaded) << r.message;
    EXPECT_EQ(r.shards_read, (std::vector<std::string>{"node-00000.bin", "node-00001.bin"}));
  }
}

TEST(ReshardLoad, LayoutIsRecordedAndListed) {
  ring::test::TempDir d("ckpt-reshard");
  Model m;
  std::vector<NodeState> writers = {NodeState(m, 3, 300), NodeState(m, 3, 301)};
  write_v2(d.path, m, writers, 4, "optimizer");
  auto list = list_checkpoints(d.path, true);
  ASSERT_EQ(list.size(), 1u);
  EXPECT_EQ(list[0].status, Status::kComplete) << list[0].problems.front();
  EXPECT_EQ(list[0].format_version, 2);
  ASSERT_TRUE(list[0].layout.has_value());
  EXPECT_EQ(describe_layout(*list[0].layout), "2 nodes, shard optimizer");
  EXPECT_EQ(list[0].layout->ranges[1].first_bucket, 2);
  EXPECT_EQ(list[0].layout->ranges[1].begin, m.params[2].offset);
  json top = json::parse(read_text(d.path + "/step-00000004/checkpoint.json"));
  EXPECT_EQ(top["format_version"], 2);
  EXPECT_EQ(top["layout"]["shard"], "optimizer");
  EXPECT_EQ(top["layout"]["ranges"][1]["end"], m.total);
  EXPECT_EQ(top["layout"]["model"]["d_model"], 64);
  json shard = json::parse(read_text(d.path + "/step-00000004/node-00001.json"));
  EXPECT_EQ(shard["layout"], top["layout"]);
  // The record round-trips and is checked strictly.
  Layout l = m.layout(3, "none");
  EXPECT_EQ(parse_layout(layout_json(l), "x"), l);
  json bad = layout_json(l);
  bad["ranges"][1]["begin"] = 0;  // overlaps node 0's
  try {
    parse_layout(bad, "f.json");
    FAIL() << "no throw";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("f.json: layout.ranges[1].begin"), std::string::npos)
        << e.what();
  }
  // A record without a model config commits too (recorded as {}).
  {
    Options o = opts(d.path + "/nomodel", 0, 1);
    o.layout = m.layout(1, "none");
    o.layout->model = nullptr;
    Checkpointer c(o);
    c.add_tensor("x", DType::kF32, {4}, writers[0].kinds.at("master").data());
    c.start(1, {});
    SaveResult r = c.wait();
    ASSERT_TRUE(r.ok) << r.error;
    auto l1 = inspect_checkpoint(d.path + "/nomodel/step-00000001", true);
    ASSERT_TRUE(l1.layout.has_value());
    EXPECT_EQ(l1.layout->model, json::object());
  }
  // A writer whose layout does not have its node count is refused.
  Options o = opts(d.path, 0, 2);
  o.layout = m.layout(3, "none");
  EXPECT_THROW(Checkpointer c(o), CheckpointError);
}

TEST(ReshardLoad, FormatOneFlatCheckpointsLoadBySlicing) {
  ring::test::TempDir d("ckpt-reshard");
  Model m;
  std::vector<NodeState> writers = {NodeState(m, 4, 400), NodeState(m, 4, 401)};
  // Format 1: every node wrote the whole flat state under the kind's name, no layout.
  {
    std::vector<std::unique_ptr<Checkpointer>> cs;
    for (int k = 0; k < 2; ++k) {
      cs.push_back(std::make_unique<Checkpointer>(opts(d.path, k, 2)));
      for (const char* kind : kKinds)
        cs[k]->add_tensor(kind, DType::kF32, {m.total}, writers[k].kinds.at(kind).data());
    }
    for (auto& c : cs) c->start(30, {});
    for (auto& c : cs) ASSERT_TRUE(c->wait().ok);
  }
  // ... as the format-1 writer wrote it: format_version 1, and the manifest checksums again.
  const std::string sd = d.path + "/step-00000030";
  json top = json::parse(read_text(sd + "/checkpoint.json"));
  top["format_version"] = 1;
  for (int k = 0; k < 2; ++k) {
    const std::string p = sd + "/node-0000" + std::to_string(k) + ".json";
    json sm = json::parse(read_text(p));
    ASSERT_FALSE(sm.contains("layout"));
    sm["format_version"] = 1;
    const std::string text = sm.dump(1) + "\n";
    write_text(p, text);
    top["shards"][k]["manifest_xxh3"] = xxh3_hex(text.data(), text.size());
  }
  write_text(sd + "/checkpoint.json", top.dump(1) + "\n");
  auto info = inspect_checkpoint(sd, true);
  ASSERT_EQ(info.status, Status::kComplete) << info.problems.front();
  EXPECT_EQ(info.format_version, 1);
  EXPECT_FALSE(info.layout.has_value());

  for (int nodes : {1, 2, 3}) {
    for (int rank = 0; rank < nodes; ++rank) {
      Targets tg(m);
      Layout job = m.layout(nodes, "none");
      LoadResult r = load_latest(d.path, rank, nodes, tg.t, INT64_MAX, &job);
      ASSERT_TRUE(r.loaded) << r.message;
      EXPECT_EQ(r.format_version, 1);
      EXPECT_FALSE(r.layout.has_value());
      expect_loaded(m, writers, tg, rank, nodes);
      if (nodes == 2) {  // every tensor, the residual included, is in its own shard
        EXPECT_EQ(r.shards_read,
                  std::vector<std::string>{"node-0000" + std::to_string(rank) + ".bin"});
      }
    }
  }
  // A job whose flat layout is another size: another model.
  Targets tg(m);
  Layout job = m.layout(1, "none");
  job.total_floats += 16;
  try {
    load_latest(d.path, 0, 1, tg.t, INT64_MAX, &job);
    FAIL() << "no throw";
  } catch (const CheckpointMismatch& e) {
    EXPECT_NE(
        std::string(e.what()).find("flat tensor 'master' holds " + std::to_string(m.total) +
                                   " elements, this job's layout " + std::to_string(m.total + 16)),
        std::string::npos)
        << e.what();
  }
}

TEST(ReshardLoad, MissingTensorAndAnotherModelAreRefusedByName) {
  ring::test::TempDir d("ckpt-reshard");
  Model m;
  std::vector<NodeState> writers = {NodeState(m, 5, 500), NodeState(m, 5, 501)};
  write_v2(d.path, m, writers, 3);
  // A parameter no shard has.
  {
    Targets tg(m);
    std::vector<float> extra(8);
    tg.t.emplace_back("master/layers.2.w", DType::kF32, std::vector<int64_t>{8}, extra.data());
    try {
      load_latest(d.path, 0, 3, tg.t);
      FAIL() << "no throw";
    } catch (const CheckpointMismatch& e) {
      EXPECT_NE(std::string(e.what()).find("no shard has tensor 'master/layers.2.w'"),
                std::string::npos)
          << e.what();
    }
  }
  // A per-node tensor (a residual) the checkpoint does not have.
  {
    Targets tg(m);
    std::vector<float> extra(8);
    LoadTarget lt("residual/extra", DType::kF32, {8}, extra.data());
    lt.per_node = true;
    tg.t.push_back(lt);
    try {
      load_latest(d.path, 1, 2, tg.t);
      FAIL() << "no throw";
    } catch (const CheckpointMismatch& e) {
      EXPECT_NE(std::string(e.what()).find("node-00001.json: has no tensor 'residual/extra'"),
                std::string::npos)
          << e.what();
    }
  }
  // Another shape.
  {
    Targets tg(m);
    std::vector<float> other(17 * 2);
    tg.t[1] = LoadTarget("master/layers.1.w", DType::kF32, {34}, other.data());
    try {
      load_latest(d.path, 0, 1, tg.t);
      FAIL() << "no throw";
    } catch (const CheckpointMismatch& e) {
      EXPECT_NE(std::string(e.what()).find(
                    "tensor 'master/layers.1.w' is f32 [17], this job expects f32 [34]"),
                std::string::npos)
          << e.what();
    }
  }
  // Equal shapes, another model config (heads): refused naming what differs.
  {
    Targets tg(m);
    Layout job = m.layout(1, "none");
    job.model["heads"] = 8;
    try {
      load_latest(d.path, 0, 1, tg.t, INT64_MAX, &job);
      FAIL() << "no throw";
    } catch (const CheckpointMismatch& e) {
      EXPECT_NE(std::string(e.what()).find(
                    "checkpoint.json: written for another model: heads 4 (this job: 8)"),
                std::string::npos)
          << e.what();
    }
  }
}

TEST(ReshardLoad, DamagedTensorFallsBackWhereItIsNeeded) {
  ring::test::TempDir d("ckpt-reshard");
  Model m;
  std::vector<NodeState> old_state = {NodeState(m, 6, 600), NodeState(m, 6, 601)};
  write_v2(d.path, m, old_state, 10, "optimizer");
  std::vector<NodeState> writers = {NodeState(m, 7, 700), NodeState(m, 7, 701)};
  write_v2(d.path, m, writers, 20, "optimizer");
  // One flipped byte in node 1's adam_v/layers.0.w of step 20.
  const std::string sd = d.path + "/step-00000020";
  json sm = json::parse(read_text(sd + "/node-00001.json"));
  uint64_t off = 0;
  for (const json& t : sm["tensors"])
    if (t["name"] == "adam_v/layers.0.w") off = t["offset"].get<uint64_t>() + 12;
  ASSERT_GT(off, 0u);
  flip_byte(sd + "/node-00001.bin", off);
  // One node needs it: step 20 is skipped naming the file and the tensor, step 10 loads.
  {
    Targets tg(m);
    LoadResult r = load_latest(d.path, 0, 1, tg.t);
    ASSERT_TRUE(r.loaded) << r.message;
    EXPECT_EQ(r.step, 10);
    ASSERT_EQ(r.skipped.size(), 1u);
    EXPECT_NE(r.skipped[0].find("step-00000020: " + sd +
                                "/node-00001.bin: tensor 'adam_v/layers.0.w' checksum mismatch"),
              std::string::npos)
        << r.skipped[0];
    expect_loaded(m, old_state, tg, 0, 1);
  }
  // Node 0 of the same two nodes (shard optimizer) needs only its own shard: step 20 is fine.
  {
    std::vector<int> own = {0, 1};
    Targets tg(m, &own);
    LoadResult r = load_latest(d.path, 0, 2, tg.t);
    ASSERT_TRUE(r.loaded) << r.message;
    EXPECT_EQ(r.step, 20);
    EXPECT_TRUE(r.skipped.empty());
  }
}

TEST(ReshardLoad, LoadFromPathTakesAStepDirectoryOrARoot) {
  ring::test::TempDir d("ckpt-reshard");
  Model m;
  std::vector<NodeState> old_state = {NodeState(m, 6, 600), NodeState(m, 6, 601)};
  write_v2(d.path, m, old_state, 10, "optimizer");
  std::vector<NodeState> writers = {NodeState(m, 7, 700), NodeState(m, 7, 701)};
  write_v2(d.path, m, writers, 20, "optimizer");
  // The master tensors only (model.init_from), on one node, from two writers' shards.
  auto masters = [&](Targets& tg) {
    std::vector<LoadTarget> t;
    for (const LoadTarget& x : tg.t)
      if (x.name.rfind("master/", 0) == 0) t.push_back(x);
    return t;
  };
  {
    Targets tg(m);
    LoadResult r = load_from_path(d.path, 0, 1, masters(tg));  // the root: its newest step
    EXPECT_EQ(r.step, 20);
    for (const Param& p : m.params)
      EXPECT_TRUE(same_floats(tg.got.at("master", p), writers[0].at("master", p), p.size));
  }
  {
    Targets tg(m);
    LoadResult r = load_from_path(d.path + "/step-00000010/", 0, 1, masters(tg));
    EXPECT_EQ(r.step, 10);
    for (const Param& p : m.params)
      EXPECT_TRUE(same_floats(tg.got.at("master", p), old_state[0].at("master", p), p.size));
  }
  // A damaged step directory is an error, not a fallback to an older step.
  const std::string sd = d.path + "/step-00000020";
  json sm = json::parse(read_text(sd + "/node-00000.json"));
  uint64_t off = 0;
  for (const json& t : sm["tensors"])
    if (t["name"] == "master/head") off = t["offset"].get<uint64_t>() + 8;
  flip_byte(sd + "/node-00000.bin", off);
  {
    Targets tg(m);
    try {
      load_from_path(sd, 0, 1, masters(tg));
      ADD_FAILURE() << "a damaged step directory loaded";
    } catch (const CheckpointError& e) {
      EXPECT_NE(std::string(e.what()).find("no complete checkpoint of step 20 in " + d.path),
                std::string::npos)
          << e.what();
      EXPECT_NE(std::string(e.what()).find("tensor 'master/head' checksum mismatch"),
                std::string::npos)
          << e.what();
    }
  }
  Targets tg(m);
  EXPECT_THROW(load_from_path(d.path + "/nothing", 0, 1, masters(tg)), CheckpointError);
}
