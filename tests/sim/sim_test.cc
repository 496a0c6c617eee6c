// The simulator's exact parts: single flows and ring collectives against alpha-beta closed forms
// (1e-9 relative), max-min fairness on graphs solved by hand, routing hop counts on every
// topology, the workload's hops and bytes for configs/examples/tiny.yaml computed independently
// from the spec's numbers, and the symmetric reduction against the full simulation.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>

#include <nlohmann/json.hpp>

#include "common/contract/layout.h"
#include "common/contract/shard.h"
#include "common/plan/plan.h"
#include "common/spec/parse.h"
#include "fmt/format.h"
#include "common/topology/hostlist.h"
#include "sim/cluster.h"
#include "sim/engine.h"
#include "sim/network.h"
#include "sim/simulate.h"
#include "sim/workload.h"

namespace {

using namespace ring::sim;

void expect_rel(double got, double want, double tol = 1e-9) {
  EXPECT_LE(std::fabs(got - want), tol * std::fabs(want)) << "got " << got << " want " << want;
}

ring::spec::JobSpec load(const std::string& rel) {
  // As ringctl simulate loads a spec: a design beyond this build's limits (bf16) is fine.
  auto lo = ring::spec::job_spec_options();
  lo.runtime_limits_are_errors = false;
  auto r = ring::spec::load_spec_file(std::string(RING_SOURCE_DIR) + "/" + rel, lo);
  EXPECT_TRUE(r.ok()) << rel;
  return *r.spec;
}

struct TempDir {
  std::string path;
  TempDir() {
    std::string t = "/tmp/ring-sim-XXXXXX";
    EXPECT_NE(mkdtemp(t.data()), nullptr);
    path = t;
  }
  ~TempDir() { std::filesystem::remove_all(path); }
  std::string write(const std::string& name, const std::string& text) const {
    std::ofstream(path + "/" + name) << text;
    return path + "/" + name;
  }
};

// ---- single flows

TEST(SimFlow, SingleFlowIsLatencyPlusBytesOverBottleneck) {
  Network net;
  const int a = net.add_vertex("a"), b = net.add_vertex("b"), c = net.add_vertex("c");
  const int ab = net.add_link(a, b, 25e9, 2e-6, "x");
  const int bc = net.add_link(b, c, 10e9, 3e-6, "x");
  Engine e(&net);
  const int r = e.add_route({ab, bc});
  const int f = e.flow(r, 3e6, 0, 0);
  e.run();
  // 3 MB over min(25, 10) GB/s plus 2 + 3 us.
  expect_rel(e.task(f).end, 3e6 / 10e9 + 5e-6);
}

TEST(SimFlow, FlowAfterComputeAndDelay) {
  Network net;
  const int a = net.add_vertex("a"), b = net.add_vertex("b");
  const int ab = net.add_link(a, b, 1e9, 1e-6, "x");
  Engine e(&net);
  const int c = e.compute(0, 0.5, 0, 0);
  const int f = e.flow(e.add_route({ab}), 1e6, 0, 0, -1, -1, /*delay=*/0.25);
  e.depend(f, c);
  e.run();
  expect_rel(e.task(f).end, 0.5 + 0.25 + 1e-3 + 1e-6);
}

// ---- ring collectives against alpha-beta closed forms

struct RingNet {
  Network net;
  std::vector<std::vector<int>> routes;
  RingNet(int n, double bw, double alpha) {
    std::vector<int> v;
    for (int k = 0; k < n; ++k) v.push_back(net.add_vertex(fmt::format("p{}", k)));
    for (int k = 0; k < n; ++k) routes.push_back({net.add_link(v[k], v[(k + 1) % n], bw, alpha, "x")});
  }
};

double run_collective(int n, double bw, double alpha, int64_t steps, double chunk) {
  RingNet rn(n, bw, alpha);
  Engine e(&rn.net);
  std::vector<int> ids;
  for (auto& r : rn.routes) ids.push_back(e.add_route(r));
  const int done = add_ring_collective(e, ids, steps, chunk, -1, 0, 0);
  e.run();
  return e.task(done).end;
}

TEST(SimCollective, RingAllReduce) {
  for (int n : {2, 3, 4, 8, 16}) {
    const double bytes = 64e6, bw = 12.5e9, alpha = 4e-6;
    // 2 (n-1) steps of bytes / n each: 2 (n-1) (alpha + bytes / (n bw)).
    const double want = 2.0 * (n - 1) * (alpha + bytes / n / bw);
    expect_rel(run_collective(n, bw, alpha, 2 * (n - 1), bytes / n), want);
    expect_rel(ring_allreduce_time(n, bytes, alpha, bw), want);
  }
}

TEST(SimCollective, RingAllGatherAndReduceScatter) {
  for (int n : {2, 5, 8}) {
    const double per = 3e6, bw = 50e9, alpha = 1.5e-6;
    const double ag = (n - 1) * (alpha + per / bw);
    expect_rel(run_collective(n, bw, alpha, n - 1, per), ag);
    expect_rel(ring_allgather_time(n, per, alpha, bw), ag);
    const double bytes = 80e6;
    const double rs = (n - 1) * (alpha + bytes / n / bw);
    expect_rel(run_collective(n, bw, alpha, n - 1, bytes / n), rs);
    expect_rel(ring_reduce_scatter_time(n, bytes, alpha, bw), rs);
  }
}

// ---- max-min fairness, solved by hand

TEST(SimMaxMin, TwoLinksOneBottleneck) {
  // Link A (10) carries f0 and f1; link B (4) carries f1 only.
  // Fair shares: A 10/2 = 5, B 4/1 = 4 -> B is the bottleneck: f1 = 4.
  // A then has 10 - 4 = 6 for f0 alone: f0 = 6.
  std::vector<double> cap = {10, 4};
  std::vector<int> r0 = {0}, r1 = {0, 1};
  MaxMinSolver s;
  std::vector<double> rates;
  s.solve(cap, {&r0, &r1}, &rates);
  expect_rel(rates[0], 6);
  expect_rel(rates[1], 4);
}

TEST(SimMaxMin, ThreeFlowsParkingLot) {
  // Link 0 (1) carries f0, f1; link 1 (2) carries f0, f2; link 2 (3) carries f2, f3.
  // Shares: L0 1/2 = 0.5, L1 2/2 = 1, L2 3/2 = 1.5 -> L0: f0 = f1 = 0.5.
  // L1 left 2 - 0.5 = 1.5 for f2 alone -> 1.5; L2 left 3 - 1.5 = 1.5 for f3 -> 1.5.
  // (L1 and L2 both give 1.5 next; either order gives the same rates.)
  std::vector<double> cap = {1, 2, 3};
  std::vector<int> r0 = {0, 1}, r1 = {0}, r2 = {1, 2}, r3 = {2};
  MaxMinSolver s;
  std::vector<double> rates;
  s.solve(cap, {&r0, &r1, &r2, &r3}, &rates);
  expect_rel(rates[0], 0.5);
  expect_rel(rates[1], 0.5);
  expect_rel(rates[2], 1.5);
  expect_rel(rates[3], 1.5);
}

TEST(SimMaxMin, RatesChangeWhenAFlowEnds) {
  // One link of 10 B/s, no latency; flows of 10 and 30 bytes start together.
  // Both run at 5 until the first has sent 10 bytes: t = 2. The second has 30 - 10 = 20 left,
  // now alone at 10 B/s: it ends at 2 + 2 = 4.
  Network net;
  const int a = net.add_vertex("a"), b = net.add_vertex("b");
  const int l = net.add_link(a, b, 10, 0, "x");
  Engine e(&net);
  const int r = e.add_route({l});
  const int f0 = e.flow(r, 10, 0, 0), f1 = e.flow(r, 30, 1, 0);
  e.run();
  expect_rel(e.task(f0).end, 2);
  expect_rel(e.task(f1).end, 4);
}

TEST(SimMaxMin, LateFlowJoins) {
  // Link of 10 B/s. f0 (40 bytes) starts at 0; f1 (10 bytes) after a 1 s compute.
  // 0..1: f0 alone at 10 -> 30 left. Then both at 5: f1 ends at 1 + 10/5 = 3; f0 has
  // 30 - 10 = 20 left at 10 B/s: ends at 5.
  Network net;
  const int a = net.add_vertex("a"), b = net.add_vertex("b");
  const int l = net.add_link(a, b, 10, 0, "x");
  Engine e(&net);
  const int r = e.add_route({l});
  const int f0 = e.flow(r, 40, 0, 0);
  const int c = e.compute(0, 1.0, 1, 0);
  const int f1 = e.flow(r, 10, 1, 0);
  e.depend(f1, c);
  e.run();
  expect_rel(e.task(f1).end, 3);
  expect_rel(e.task(f0).end, 5);
  // The critical path of f0's end: f0 alone (started at 0).
  EXPECT_EQ(e.critical_path(f1), (std::vector<int>{f1, c}));
}

TEST(SimMaxMin, WeightedFlowStandsForAlikeFlows) {
  // Link 0 (12) carries f0 (weight 3) and f1; link 1 (2) carries f1 only. Unit shares: L0
  // 12 / 4 = 3, L1 2 / 1 = 2 -> L1 first: f1 = 2; L0 has 10 left for f0's 3 units: f0 = 10.
  std::vector<double> cap = {12, 2};
  std::vector<int> r0 = {0}, r1 = {0, 1};
  MaxMinSolver s;
  std::vector<double> rates;
  const std::vector<double> w = {3, 1};
  s.solve(cap, {&r0, &r1}, &rates, 1e30, &w);
  expect_rel(rates[0], 10);
  expect_rel(rates[1], 2);
  // In the engine: a flow of weight 3 carrying 3 x 10 bytes beside a flow of 10 bytes on a link
  // of 4 B/s ends with it, as four flows of 10 bytes would: 40 / 4 = 10 s.
  Network net;
  const int a = net.add_vertex("a"), b = net.add_vertex("b");
  const int l = net.add_link(a, b, 4, 0, "x");
  Engine e(&net);
  const int r = e.add_route({l});
  const int f0 = e.flow(r, 30, 0, 0), f1 = e.flow(r, 10, 1, 0);
  e.set_weight(f0, 3);
  e.run();
  expect_rel(e.task(f0).end, 10);
  expect_rel(e.task(f1).end, 10);
}

TEST(SimEngine, DeviceRunsOneComputeAtATime) {
  Network net;
  Engine e(&net);
  const int a = e.compute(0, 1.0, 0, 0), b = e.compute(0, 2.0, 0, 0), c = e.compute(1, 0.5, 1, 0);
  e.run();
  expect_rel(e.task(a).end, 1.0);
  expect_rel(e.task(b).end, 3.0);  // queued behind a
  expect_rel(e.task(c).end, 0.5);  // another device
  EXPECT_EQ(e.cause(b), a);
}

// Three devices on one host of 2 cores (ideal speeds min(1, 2 / n)), by hand:
//   a (1 s of work) and b (1 s) start at 0, c (1 s) is ready at 0.5 (after d, 0.5 s on its own
//   core). 0..0.5: a, b alone -> speed 1, 0.5 s done each. 0.5..: a, b, c at 2/3: a and b end
//   0.5 / (2/3) = 0.75 s later (1.25); c has 0.5 s done, then runs alone: ends at 1.75.
//   A second task on a's device (e, 0.25 s) waits for a and starts at 1.25 with c: 2 tasks at
//   speed 1: e ends at 1.5.
TEST(SimEngine, SharedHostDividesItsCores) {
  Network net;
  Engine e(&net);
  const int h = e.add_host({1.0, 1.0, 2.0 / 3, 0.5});
  for (int dev : {0, 1, 2}) e.set_device_host(dev, h);
  const int a = e.compute(0, 1.0, 0, 0), b = e.compute(1, 1.0, 1, 0);
  const int d = e.compute(3, 0.5, 3, 0);  // its own core
  const int c = e.compute(2, 1.0, 2, 0);
  e.depend(c, d);
  const int x = e.compute(0, 0.25, 0, 0);
  e.run();
  expect_rel(e.task(d).end, 0.5);
  expect_rel(e.task(a).end, 1.25);
  expect_rel(e.task(b).end, 1.25);
  expect_rel(e.task(x).start, 1.25);
  expect_rel(e.task(x).end, 1.5);
  expect_rel(e.task(c).end, 1.75);
  // Beyond the table: speed.back() x size / n (4 tasks at 0.5 -> 5 at 0.4).
  Engine f(&net);
  const int g = f.add_host({1.0, 1.0, 2.0 / 3, 0.5});
  std::vector<int> t;
  for (int dev = 0; dev < 5; ++dev) f.set_device_host(dev, g), t.push_back(f.compute(dev, 1.0, dev, 0));
  f.run();
  for (int id : t) expect_rel(f.task(id).end, 2.5);
}

TEST(SimEngine, RouteModelCreditLatencyAndHostLoad) {
  // One 100 B/s link of 1 ms latency. A route model with a 200-byte credit and 0.5 s per
  // message: 1000 bytes take 0.5 + 0.001 + 800 / 100 s.
  Network net;
  const int a = net.add_vertex("a"), b = net.add_vertex("b");
  const int l = net.add_link(a, b, 100, 1e-3, "link");
  {
    Engine e(&net);
    const int r = e.add_route({l});
    e.set_route_model(r, 200, 0.5);
    const int f = e.flow(r, 1000, 0, 0);
    const int g = e.flow(r, 150, 0, 0);  // within the credit: latencies only
    e.depend(g, f);
    e.run();
    expect_rel(e.task(f).end, 0.5 + 1e-3 + 8.0);
    expect_rel(e.task(g).end - e.task(g).start, 0.5 + 1e-3);
  }
  {
    // The transfer's CPU: 0.005 s per byte at 100 B/s loads the host as 0.5 process while it
    // moves. A 1 s compute task alone on the host (speed table 1, 0.5) runs at speed(1.5) = 0.75
    // during the flow's 10 s: it ends at 1 / 0.75 s.
    Engine e(&net);
    const int h = e.add_host({1.0, 0.5});
    e.set_device_host(0, h);
    const int r = e.add_route({l});
    e.set_route_model(r, 0, 0, h, 0.005);
    const int f = e.flow(r, 1000, 0, 0);
    const int c = e.compute(0, 1.0, 0, 0);
    // After the flow, the host is free again: a second task runs at full speed.
    const int c2 = e.compute(0, 1.0, 0, 0);
    e.depend(c2, f);
    e.run();
    expect_rel(e.task(f).end, 10.0 + 1e-3);
    expect_rel(e.task(c).end, 1.0 / 0.75);
    expect_rel(e.task(c2).end - e.task(c2).start, 1.0);
  }
}

// A calibration file in t with the required compute keys and `extra` (", key: value, ...").
std::string write_calibration(const TempDir& t, const std::string& extra) {
  const std::string path = t.path + "/cal.json";
  std::ofstream(path) << R"({"gemm_flops": 1e11, "attention_fwd_flops": 1e11,
      "attention_bwd_flops": 1e11, "intra_node_bytes_per_s": 1e10, "adamw_params_per_s": 1e9)"
                      << extra << "}";
  return path;
}

TEST(SimRates, CalibrationLinkModel) {
  TempDir t;
  const auto write = [&](const std::string& extra) { return write_calibration(t, extra); };
  EXPECT_FALSE(load_calibration(write("")).has_link_model);
  const Rates r = load_calibration(write(
      R"(, "link_rate_share": 0.9, "link_message_s": -0.002, "link_rate_share_loaded": 0.8,
         "link_message_s_loaded": 0.01, "link_loaded_processes": 4, "link_cpu_s_per_byte": 1e-9)"));
  EXPECT_TRUE(r.has_link_model);
  EXPECT_DOUBLE_EQ(r.link_rate_share, 0.9);
  EXPECT_DOUBLE_EQ(r.link_message_s, -0.002);
  EXPECT_DOUBLE_EQ(r.link_message_s_loaded, 0.01);
  try {
    load_calibration(write(R"(, "link_rate_share": 0.9)"));
    FAIL() << "a partial link model was accepted";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("link_message_s_loaded"), std::string::npos) << e.what();
  }
  try {
    load_calibration(write(
        R"(, "link_rate_share": 1.5, "link_message_s": 0, "link_rate_share_loaded": 0.8,
           "link_message_s_loaded": 0, "link_loaded_processes": 2, "link_cpu_s_per_byte": 0)"));
    FAIL() << "a share above 1 was accepted";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("'link_rate_share' must be in (0, 1]"), std::string::npos)
        << e.what();
  }
}

TEST(SimRates, CalibrationComputeRatesPerCpuSecond) {
  TempDir t;
  const auto write = [&](const std::string& extra) { return write_calibration(t, extra); };
  EXPECT_FALSE(load_calibration(write("")).compute_per_cpu_second);
  EXPECT_FALSE(load_calibration(write(R"(, "compute_rates_per": "wall_second")")).compute_per_cpu_second);
  const Rates r = load_calibration(write(
      R"(, "compute_rates_per": "cpu_second", "as_run_beside_compute": 7, "as_run_beside_pollers": 8)"));
  EXPECT_TRUE(r.compute_per_cpu_second);
  EXPECT_NE(r.source.find("per CPU-second"), std::string::npos) << r.source;
  try {
    load_calibration(write(R"(, "compute_rates_per": "second")"));
    FAIL() << "an unknown unit was accepted";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("'compute_rates_per' must be"), std::string::npos) << e.what();
  }
}

// ---- routing

ClusterOptions opts(Shape shape, int nodes, int gpn) {
  ClusterOptions o;
  o.shape = shape;
  o.nodes = nodes;
  o.gpus_per_node = gpn;
  o.node_bw = 200e9;
  return o;
}

TEST(SimRouting, FatTreeRailOptimised) {
  auto o = opts(Shape::kFatTree, 32, 8);
  o.pod_nodes = 16;
  auto c = Cluster::build(o);
  EXPECT_EQ(c->route(0, 0, 0, 5).size(), 2u);   // NVLink: GPU-NVSwitch-GPU
  EXPECT_EQ(c->route(0, 3, 7, 3).size(), 2u);   // same pod, same rail: NIC-leaf-NIC
  EXPECT_EQ(c->route(0, 3, 7, 4).size(), 4u);   // other rail: through the core
  EXPECT_EQ(c->route(0, 3, 20, 3).size(), 4u);  // other pod
  // Leaf uplink: 16 nodes x 25 GB/s, no oversubscription.
  EXPECT_DOUBLE_EQ(c->net().link(c->route(0, 3, 20, 3)[1]).bandwidth, 16 * 25e9);
  o.oversubscription = 4;
  auto c4 = Cluster::build(o);
  EXPECT_DOUBLE_EQ(c4->net().link(c4->route(0, 3, 20, 3)[1]).bandwidth, 16 * 25e9 / 4);
}

TEST(SimRouting, DragonflyPlusMinimalAndValiant) {
  auto o = opts(Shape::kDragonflyPlus, 64, 2);
  o.group_routers = 4;
  o.router_nodes = 4;  // 16 nodes per group, 4 groups
  auto c = Cluster::build(o);
  EXPECT_EQ(c->route(0, 0, 1, 0).size(), 2u);   // same router
  EXPECT_EQ(c->route(0, 0, 5, 1).size(), 4u);   // same group: leaf-spine-leaf
  EXPECT_EQ(c->route(0, 0, 40, 1).size(), 5u);  // minimal: local, global, local
  o.valiant = true;
  auto v = Cluster::build(o);
  const auto r = v->route(0, 0, 40, 1);
  EXPECT_EQ(r.size(), 6u);  // two global links through an intermediate group
  std::set<std::string> kinds;
  int globals = 0;
  for (int id : r) globals += v->net().link(id).kind == "global";
  EXPECT_EQ(globals, 2);
}

TEST(SimRouting, Torus3dDimensionOrder) {
  auto o = opts(Shape::kTorus3d, 64, 1);  // 4 x 4 x 4
  auto c = Cluster::build(o);
  // Slot s = x + 4 (y + 4 z). From (0,0,0) to (2,1,3): x 2, y 1, z 1 (wrap) + 2 NIC links.
  const int to = 2 + 4 * (1 + 4 * 3);
  const auto r = c->route(0, 0, to, 0);
  EXPECT_EQ(r.size(), 2u + 2 + 1 + 1);
  // Dimension order: the x links come first (router0 -> router1 -> router2).
  EXPECT_EQ(c->net().vertex_name(c->net().link(r[1]).to), "router1");
  EXPECT_EQ(c->net().vertex_name(c->net().link(r[2]).to), "router2");
  int dims[3];
  torus_dims(2048, dims);
  EXPECT_EQ(dims[0] * dims[1] * dims[2], 2048);
  EXPECT_EQ(dims[0], 16);
}

TEST(SimRouting, GraphFileAndTopologyConf) {
  TempDir t;
  const std::string g = t.write("g.yaml",
                                "nodes: [a, b, c]\nswitches: [s1, s2]\nlinks:\n"
                                "  - {from: a, to: s1, gbytes_per_s: 25}\n"
                                "  - {from: b, to: s1, gbytes_per_s: 25}\n"
                                "  - {from: s1, to: s2, gbytes_per_s: 10, latency_us: 3}\n"
                                "  - {from: c, to: s2, gbytes_per_s: 25}\n");
  auto o = opts(Shape::kGraphFile, 1, 1);
  o.file = g;
  auto c = Cluster::build(o);
  EXPECT_EQ(c->nodes(), 3);
  // GPU -> a -> s1 -> b -> GPU ; and to c through s2.
  EXPECT_EQ(c->route(0, 0, 1, 0).size(), 4u);
  EXPECT_EQ(c->route(0, 0, 2, 0).size(), 5u);
  const std::string bad = t.write("bad.yaml", "nodes: [a]\nlinks:\n  - {from: a, to: z, gbytes_per_s: 1}\n");
  o.file = bad;
  try {
    Cluster::build(o);
    FAIL() << "expected an error";
  } catch (const ring::topology::TopologyError& e) {
    EXPECT_NE(std::string(e.what()).find(bad + ":3"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("'z'"), std::string::npos) << e.what();
  }
  const std::string conf = t.write("topology.conf",
                                   "SwitchName=root Switches=leaf[1-2]\n"
                                   "SwitchName=leaf1 Nodes=n[1-2] LinkSpeed=5\n"
                                   "SwitchName=leaf2 Nodes=n[3-4]\n");
  o.shape = Shape::kSlurmConf;
  o.file = conf;
  auto s = Cluster::build(o);
  EXPECT_EQ(s->nodes(), 4);
  EXPECT_EQ(s->route(0, 0, 1, 0).size(), 4u);  // GPU-host-leaf-host-GPU
  const auto r = s->route(0, 0, 2, 0);
  EXPECT_EQ(r.size(), 6u);  // up through root
  EXPECT_DOUBLE_EQ(s->net().link(r[2]).bandwidth, 5e9);  // leaf1's LinkSpeed
}

// ---- the workload of tiny.yaml, computed independently

// RingAttention's key_range from token positions and document ids (brute force).
std::pair<int64_t, int64_t> brute_rows(const std::vector<int64_t>& q, const std::vector<int64_t>& k,
                                       int64_t doc) {
  int64_t lo = -1, hi = -1;
  for (size_t j = 0; j < k.size(); ++j)
    for (int64_t p : q)
      if (p / doc == k[j] / doc && k[j] <= p) {
        if (lo < 0) lo = static_cast<int64_t>(j);
        hi = static_cast<int64_t>(j) + 1;
        break;
      }
  return lo < 0 ? std::make_pair(int64_t{0}, int64_t{0}) : std::make_pair(lo, hi);
}

TEST(SimWorkload, TinyHopsAndBytesMatchTheRing) {
  const auto spec = load("configs/examples/tiny.yaml");
  // tiny: 4 layers, d_model 256, 8 heads (head_dim 32), 4 K/V heads, seq 16384, packed documents
  // of 4096, zigzag over 4 ranks: 8 chunks of 2048; rank r holds chunks r and 7 - r.
  const int64_t P = 4, L = 4, T = 4096, kvd = 4 * 32, seq = 16384, doc = 4096, chunk = 2048;
  std::vector<std::vector<int64_t>> tok(P);
  for (int64_t r = 0; r < P; ++r)
    for (int64_t c : {r, 2 * P - 1 - r})
      for (int64_t i = c * chunk; i < (c + 1) * chunk; ++i) tok[r].push_back(i);
  // K/V block: 64 header + T int64 positions + T int32 doc ids + K and V fp32.
  const double kv_bytes = 64 + T * 8 + T * 4 + 2.0 * T * kvd * 4;
  // dK/dV accumulators of rank 0 per layer: steps s = 0..P-1, s = 0 empty; block origin
  // o = -s mod P carries the hull of the rows ranks o+1..o+s attended.
  double dkv0 = 0;
  for (int64_t s = 1; s < P; ++s) {
    const int64_t o = (0 - s + P) % P;
    int64_t lo = -1, hi = -1;
    for (int64_t k = 1; k <= s; ++k) {
      auto [a, b] = brute_rows(tok[(o + k) % P], tok[o], doc);
      if (b > a) lo = lo < 0 ? a : std::min(lo, a), hi = std::max(hi, b);
    }
    if (hi > lo) dkv0 += 64 + 2.0 * (hi - lo) * kvd * 4;
  }
  const double rank0_bytes = L * ((P - 1) * kv_bytes * 2 + dkv0);

  SimOptions o;
  o.rates = preset_rates("H100");
  o.expand = Expand::kFull;
  const SimResult r = simulate(spec, o);
  EXPECT_EQ(r.ranks, 4);
  EXPECT_EQ(r.hop_forward.count, P * L * (P - 1));
  EXPECT_EQ(r.hop_backward_kv.count, P * L * (P - 1));
  EXPECT_EQ(r.hop_dkv.count, P * L * P);
  EXPECT_DOUBLE_EQ(r.hop_forward.bytes, kv_bytes);
  EXPECT_DOUBLE_EQ(r.ring_bytes_per_rank, rank0_bytes);
  (void)seq;

  // The workload's attention pairs against brute force on a small packed sequence.
  auto s2 = spec;
  s2.data.seq_len = 96;
  s2.data.max_doc_len = 20;
  const Workload w = make_workload(s2);
  std::vector<std::vector<int64_t>> t2(P);
  for (int64_t r = 0; r < P; ++r)
    for (const auto& rg : w.ranges[r])
      for (int64_t i = rg.begin; i < rg.end; ++i) t2[r].push_back(i);
  for (int64_t q = 0; q < P; ++q)
    for (int64_t k = 0; k < P; ++k) {
      double pairs = 0;
      for (int64_t a : t2[q])
        for (int64_t b : t2[k]) pairs += (a / 20 == b / 20 && b <= a);
      EXPECT_DOUBLE_EQ(w.pairs(q, k), pairs) << q << " " << k;
      EXPECT_EQ(w.key_rows(q, k), brute_rows(t2[q], t2[k], 20)) << q << " " << k;
    }
}

// With model.recompute the backward replays the forward ring of every layer but the last one,
// whose activations the model still holds: (L - 1) x P recomputed blocks per rank, and hops.
TEST(SimWorkload, RecomputeReplaysEveryLayerButTheLast) {
  auto spec = load("configs/examples/tiny.yaml");
  spec.model.recompute = true;
  const int64_t P = 4, L = 4;
  ASSERT_EQ(spec.model.layers, L);
  ASSERT_EQ(spec.parallel.context_ranks, P);
  SimOptions o;
  o.rates = preset_rates("H100");
  o.expand = Expand::kFull;
  o.keep_trace = true;
  const SimResult r = simulate(spec, o);
  int64_t attn = 0, proj = 0;
  for (const auto& e : r.trace) {
    attn += e.name == "attention recompute";
    proj += e.name == "projections+MLP recompute";
  }
  EXPECT_EQ(attn, (L - 1) * P * P);
  EXPECT_EQ(proj, 2 * (L - 1) * P);  // before and after the layer's attention
  spec.model.recompute = false;
  const SimResult plain = simulate(spec, o);
  EXPECT_GT(r.step_s, plain.step_s);
}

// Selective recompute (model.recompute_policy selective) re-runs only the output projection and
// the MLP's gate/up: one "projections+MLP recompute" task per rank and layer but the last, no
// attention recompute and no recompute hop, so its step is shorter than full recompute's.
TEST(SimWorkload, SelectiveRecomputeRunsNoAttentionAgain) {
  auto spec = load("configs/examples/tiny.yaml");
  spec.model.recompute = true;
  const int64_t P = 4, L = 4;
  SimOptions o;
  o.rates = preset_rates("H100");
  o.expand = Expand::kFull;
  o.keep_trace = true;
  const SimResult full = simulate(spec, o);
  spec.model.recompute_policy = ring::spec::RecomputePolicy::kSelective;
  const SimResult r = simulate(spec, o);
  int64_t attn = 0, proj = 0, hop = 0;
  for (const auto& e : r.trace) {
    attn += e.name == "attention recompute";
    proj += e.name == "projections+MLP recompute";
    hop += e.name == "ring K/V hop (recompute)";
  }
  EXPECT_EQ(attn, 0);
  EXPECT_EQ(hop, 0);
  EXPECT_EQ(proj, (L - 1) * P);
  EXPECT_LT(r.step_s, full.step_s);
  EXPECT_LT(r.hardware_flops_per_step, full.hardware_flops_per_step);
}

// The 7B example (model.recompute: true): full recompute puts the attention recompute on the
// critical path; selective takes it off and the step gets shorter.
TEST(SimWorkload, SelectiveTakesTheAttentionRecomputeOffTheCriticalPath) {
  auto spec = load("configs/examples/llama7b-1m-64x8-h100.yaml");
  ASSERT_TRUE(spec.model.recompute);
  SimOptions o;
  o.rates = preset_rates("H100");
  const SimResult full = simulate(spec, o);
  spec.model.recompute_policy = ring::spec::RecomputePolicy::kSelective;
  const SimResult sel = simulate(spec, o);
  auto on_path = [](const SimResult& r, const std::string& name) {
    double s = 0;
    for (const auto& c : r.critical_path)
      if (c.name == name) s += c.seconds;
    return s;
  };
  EXPECT_GT(on_path(full, "attention recompute"), 0.1 * full.step_s);
  EXPECT_EQ(on_path(sel, "attention recompute"), 0.0);
  EXPECT_LT(sel.step_s, 0.9 * full.step_s);
  EXPECT_GT(sel.mfu, full.mfu);
}

TEST(SimWorkload, ReducedAgreesWithFull) {
  // 70b at 64 nodes: every ring is alike, so 8 positions of one ring stand for all 512 ranks.
  // The full simulation of a smaller version (2 layers, 8 nodes) must give the same step. Shard
  // optimizer: with shard full the owner nodes break the symmetry (SimShardFull below).
  // The single ring (head ranks: SimHeadGroups.ReducedAgreesWithFull).
  auto spec = load("configs/examples/70b-1m-64x8-h100.yaml");
  spec.parallel.head_ranks = 1;
  spec.parallel.shard = ring::spec::ShardMode::kOptimizer;
  spec.model.layers = 2;
  spec.data.seq_len = 65536;
  spec.resources.nodes = 16;
  spec.parallel.data_replicas = 2;
  SimOptions o;
  o.rates = preset_rates("H100");
  o.expand = Expand::kFull;
  const SimResult full = simulate(spec, o);
  o.expand = Expand::kReduced;
  const SimResult red = simulate(spec, o);
  EXPECT_LT(red.simulated_positions, full.simulated_positions);
  expect_rel(red.step_s, full.step_s, 1e-3);
}

// parallel.head_ranks U: the reduced simulation holds one period of each of the U head-slot
// rings (whole head groups), so the simulated nodes' NICs carry every slot's hops and ringd's
// exchange as in full. Simulating one slot's ring alone put the others' hops on those links
// as a static share, which slowed the exchange after the backward (1.441 s against 0.795 s at
// U = 2). Now 794.850 ms against 794.874 ms (U 2), 772.11 / 772.09 (4), 763.11 / 763.09 (8).
TEST(SimHeadGroups, ReducedAgreesWithFull) {
  auto spec = load("configs/examples/70b-1m-64x8-h100.yaml");
  spec.parallel.shard = ring::spec::ShardMode::kOptimizer;
  spec.model.layers = 2;
  spec.data.seq_len = 65536;
  spec.resources.nodes = 16;
  spec.parallel.data_replicas = 2;
  SimOptions o;
  o.rates = preset_rates("H100");
  for (const int64_t u : {2, 4, 8}) {
    spec.parallel.head_ranks = u;
    o.expand = Expand::kFull;
    const SimResult full = simulate(spec, o);
    o.expand = Expand::kReduced;
    const SimResult red = simulate(spec, o);
    EXPECT_LT(red.simulated_positions, full.simulated_positions);
    EXPECT_EQ(red.simulated_positions % u, 0) << "whole head groups";
    expect_rel(red.step_s, full.step_s, 1e-2);
    expect_rel(red.exchange_s, full.exchange_s, 1e-2);
  }
}

TEST(SimWorkload, WhatIfsMoveTheStep) {
  // Compute-bound as shard optimizer (shard full's block gathers would dominate at 2 layers).
  auto spec = load("configs/examples/70b-1m-64x8-h100.yaml");
  spec.parallel.shard = ring::spec::ShardMode::kOptimizer;
  spec.model.layers = 2;
  SimOptions o;
  o.rates = preset_rates("H100");
  const SimResult base = simulate(spec, o);
  o.stragglers = {{5, 2.0}};
  const SimResult slow = simulate(spec, o);
  EXPECT_GT(slow.step_s, 1.5 * base.step_s);
  o.stragglers.clear();
  o.stragglers = {{100000, 2.0}};
  EXPECT_THROW(simulate(spec, o), std::invalid_argument);
}

// Top-k's exchange between nodes: at the owner the dense gradient is reduced to the owners (half
// a ring all-reduce's bytes) plus the owners' small sparse sets; at the sender only the nodes'
// sparse sets travel (density 0.001 here: 8 bytes a pair against 4 a float).
TEST(SimWorkload, TopkAtTheOwnerMovesTheReduceScatter) {
  auto base = load("configs/examples/llama7b-1m-64x8-h100.yaml");
  base.parallel.shard = ring::spec::ShardMode::kNone;  // every node exchanges the whole gradient
  SimOptions o;
  o.rates = preset_rates("H100");
  auto with = [&](ring::spec::Compression c, ring::spec::CompressAt at) {
    auto s = base;
    s.optimizer.compression = c;
    s.optimizer.compress_at = at;
    return simulate(s, o).exchange_s;
  };
  const double dense = with(ring::spec::Compression::kNone, ring::spec::CompressAt::kOwner);
  const double owner = with(ring::spec::Compression::kTopk, ring::spec::CompressAt::kOwner);
  const double sender = with(ring::spec::Compression::kTopk, ring::spec::CompressAt::kSender);
  EXPECT_GT(owner, 0.45 * dense);
  EXPECT_LT(owner, 0.6 * dense);
  EXPECT_LT(sender, 0.2 * owner);
  EXPECT_GT(sender, 0.0);
}

// Nodes declared on one host (a graph's host_cores, as bench/emulated_cluster.py writes it): the
// ranks' compute divides the cores. tiny.yaml on 4 nodes of 1 worker: with 4 cores (one each)
// the step is the unshared one; with 1 core it is longer, and a table of measured speeds
// (calibration host_speed) is used instead of the ideal min(1, cores / n).
TEST(SimWorkload, SharedHostSlowsConcurrentCompute) {
  TempDir t;
  auto spec = load("configs/examples/tiny.yaml");
  spec.resources.nodes = 4;
  spec.resources.workers_per_node = 1;
  auto graph = [&](const std::string& cores) {
    return t.write("g" + cores + ".yaml",
                   "gpus_per_node: 1\n" + (cores.empty() ? "" : "host_cores: " + cores + "\n") +
                       "nodes: [n0, n1, n2, n3]\nswitches: [s]\nlinks:\n"
                       "  - {from: n0, to: s, gbytes_per_s: 1000}\n  - {from: n1, to: s, gbytes_per_s: 1000}\n"
                       "  - {from: n2, to: s, gbytes_per_s: 1000}\n  - {from: n3, to: s, gbytes_per_s: 1000}\n");
  };
  SimOptions o;
  o.rates = preset_rates("A100");
  o.cluster.shape = Shape::kGraphFile;
  o.cluster.file = graph("");
  const SimResult own = simulate(spec, o);
  o.cluster.file = graph("4");
  const SimResult four = simulate(spec, o);
  o.cluster.file = graph("1");
  const SimResult one = simulate(spec, o);
  expect_rel(four.step_s, own.step_s, 1e-9);
  EXPECT_GT(one.step_s, 2.0 * own.step_s);
  o.rates.host_speed = {1.0, 0.5, 1.0 / 3, 0.25};  // the same as one ideal core, measured
  const SimResult measured = simulate(spec, o);
  expect_rel(measured.step_s, one.step_s, 1e-9);
  o.cluster.file = t.write("bad.yaml", "host_cores: 0\nnodes: [a]\nlinks: []\n");
  try {
    simulate(spec, o);
    FAIL() << "expected an error";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("host_cores must be > 0"), std::string::npos) << e.what();
  }
}

// ---- ring communication and what of it compute hides, on a ring worked out by hand
//
// The representative rank's ring communication is the time some ring transfer it sends or
// receives is in flight (from its post to its completion; the union, so each transfer counts
// once), hidden the part of it during which the rank computes, exposed the rest (issue 35).
//
// The ring: tiny.yaml as one ring of P = 3 GPUs of one node, L = 2 layers, one causal document
// of 6144 tokens (zigzag: 6 chunks of c = 1024, rank r holds chunks r and 5 - r, T = 2048 tokens),
// no recompute, one micro-batch, fp32; NVLink at B = 100 GB/s without latency (the GPUs' links
// carry nothing else: one node, no exchange between nodes); projections, LM head and AdamW take
// no time (1e30 FLOP/s). Per rank and layer:
//   K/V block   64 + 8 T + 4 T + 2 x 4 T kvd (kvd = 4 x 32)  = 2,121,792 B: h = 21.21792 us
//   dK/dV, 2c rows  64 + 2 x 4 x 2048 x 128              = 2,097,216 B: a = 20.97216 us
//   dK/dV, c rows   64 + 2 x 4 x 1024 x 128              = 1,048,640 B: b = 10.48640 us
// Attention pairs: a rank's own block (step 0) 2c^2 + c (its two chunks causally, and its late
// chunk over its early one), any other block 2c^2 (both chunks over one of the block's). The
// accumulator of block o after ranks o+1 .. o+s carries c rows while none of them wrapped past
// P - 1, else 2c: rank 0 sends 0, 2c, 2c rows at steps 0, 1, 2 (blocks 0, 2, 1), rank 1 0, c, 2c,
// rank 2 0, c, c. The attention rates are set so that an off-diagonal block takes k x h (forward
// and backward alike), the own block k h (1 + 1 / 2c).
struct HandRing {
  static constexpr int64_t P = 3, L = 2, c = 1024, T = 2 * c, kvd = 4 * 32, heads_hd = 8 * 32;
  static constexpr double B = 100e9;
  static constexpr double kv_bytes = 64 + 8.0 * T + 4.0 * T + 2 * 4.0 * T * kvd;
  static constexpr double dkv2c_bytes = 64 + 2 * 4.0 * (2 * c) * kvd;
  static constexpr double h = kv_bytes / B, a = dkv2c_bytes / B, b = (64 + 2 * 4.0 * c * kvd) / B;

  static ring::spec::JobSpec spec() {
    auto s = load("configs/examples/tiny.yaml");
    s.model.layers = L;
    s.model.recompute = false;
    s.data.seq_len = 2 * P * c;
    s.data.pack = false;
    s.parallel.context_ranks = P;
    s.parallel.data_replicas = 1;
    s.resources.nodes = 1;
    s.resources.workers_per_node = P;
    s.train.micro_batches = 1;
    s.checkpoint.every_steps = 0;
    return s;
  }
  // Off-diagonal attention block: k x h.
  static SimResult run(double k, bool trace = false) {
    SimOptions o;
    o.rates = preset_rates("H100");
    o.rates.intra_node_bw = B;
    o.rates.intra_node_latency = 0;
    o.rates.gemm_flops = o.rates.gemm_bwd_flops = 1e30;
    o.rates.adamw_params_per_s = 1e30;
    const double pairs = 2.0 * c * c;
    o.rates.attention_fwd_flops = pairs * 4 * heads_hd / (k * h);
    o.rates.attention_bwd_flops = pairs * 10 * heads_hd / (k * h);
    o.stagger_us = 0;
    o.expand = Expand::kFull;
    o.keep_trace = trace;
    return simulate(spec(), o);
  }
};

TEST(SimRingHidden, TheHandRingIsTheWorkload) {
  using H = HandRing;
  const Workload w = make_workload(H::spec());
  ASSERT_EQ(w.P, H::P);
  EXPECT_DOUBLE_EQ(w.kv_block_bytes, H::kv_bytes);
  for (int64_t r = 0; r < H::P; ++r)
    for (int64_t o = 0; o < H::P; ++o)
      EXPECT_DOUBLE_EQ(w.pairs(r, o), 2.0 * H::c * H::c + (o == r ? H::c : 0)) << r << " " << o;
  // (origin, s) -> rows, as rank origin + s sends them.
  EXPECT_EQ(w.dkv_rows(2, 1), 2 * H::c);  // rank 0, step 1
  EXPECT_EQ(w.dkv_rows(1, 2), 2 * H::c);  // rank 0, step 2
  EXPECT_EQ(w.dkv_rows(0, 1), H::c);      // rank 1, step 1
  EXPECT_EQ(w.dkv_rows(2, 2), 2 * H::c);  // rank 1, step 2
  EXPECT_EQ(w.dkv_rows(1, 1), H::c);      // rank 2, step 1
  EXPECT_EQ(w.dkv_rows(0, 2), H::c);      // rank 2, step 2
}

// Compute ~0: every moment of the ring is communication and none of it is hidden. Per layer,
// times from the pass's start (every rank alike but for the accumulators' sizes):
//   forward: hops at [0, h] and [h, 2h] (in and out at once): 2h.
//   backward: K/V hops [0, h], [h, 2h]; the step-0 accumulators are empty. Step 1's leave at 2h
//   (each waits for the next rank's step 2 to begin): rank 0's out [2h, 2h + a], rank 2's into
//   rank 0 [2h, 2h + b]. Step 2 begins at 2h and a rank's accumulator is ready when its
//   predecessor's has arrived: rank 0 at 2h + b, rank 1 at 2h + a, rank 2 at 2h + b; each sends
//   when the next rank is ready too: rank 0 (to rank 1) over [2h + a, 2h + 2a], rank 2 (to
//   rank 0) over [2h + b, 2h + 2b]. The last is each block's trip home; every rank's backward
//   of the layer ends with rank 0's, at 2h + 2a.
// So ring communication = exposed = L (4h + 2a) = the step; the backward is L ((P-1) h + the P
// accumulators rank 0 sends: 0 + a + a). (The old account, per ring step from its start to its
// last flow's end, counted rank 0's step-1 accumulator in steps 1 and 2: backward 2h + 3a; and
// the step's outlasting of its compute as exposed: 2h + b; "hidden" 3a - b with nothing to hide
// behind, 35 % of the ring.)
TEST(SimRingHidden, ComputeNearZeroHidesNothingAndEachTransferCountsOnce) {
  using H = HandRing;
  const SimResult r = H::run(1e-9);
  const double L = H::L, h = H::h, a = H::a;
  expect_rel(r.ring_comm_s, L * (4 * h + 2 * a), 1e-6);
  expect_rel(r.ring_exposed_s, L * (4 * h + 2 * a), 1e-6);
  EXPECT_LT(r.hidden_share, 1e-6);
  expect_rel(r.backward_s, L * (2 * h + 2 * a), 1e-6);
  expect_rel(r.step_s, L * (4 * h + 2 * a), 1e-6);
  EXPECT_DOUBLE_EQ(r.ring_bytes_per_rank, L * (4 * H::kv_bytes + 2 * H::dkv2c_bytes));
}

// Compute just above the hops (k = 1.1: a block takes 1.1 h > h > a > b). Per layer: each K/V
// hop runs beside its block (forward and backward, 4h hidden); step 1's accumulators leave when
// block 1 is done and arrive during block 2 (a, and b into rank 0: hidden); step 2's leave after
// block 2, the last block, and nothing runs beside them: rank 0's [E, E + a] (and rank 2's into
// it, [E, E + b]) are exposed, and the layer's backward waits for them (its projections begin
// at E + a). Ring communication L (4h + 2a), hidden L (4h + a), exposed L a; the step is the
// compute (3 forward and 3 backward blocks a layer) plus L a.
TEST(SimRingHidden, ComputeJustAboveTheHopHidesAllButTheTripHome) {
  using H = HandRing;
  const double k = 1.1, L = H::L, h = H::h, a = H::a;
  const double own = k * h * (1 + 1.0 / (2 * H::c));  // step 0's block
  const SimResult r = H::run(k, /*trace=*/true);
  expect_rel(r.ring_comm_s, L * (4 * h + 2 * a), 1e-6);
  expect_rel(r.ring_exposed_s, L * a, 1e-6);
  expect_rel(r.ring_comm_s - r.ring_exposed_s, L * (4 * h + a), 1e-6);
  expect_rel(r.step_s, L * (2 * (own + 2 * k * h) + a), 1e-6);
  // The step ends with the last trip home (nothing after it takes time).
  double last_dkv = 0;
  for (const auto& ev : r.trace)
    if (ev.name == "ring dK/dV hop") last_dkv = std::max(last_dkv, ev.end);
  expect_rel(last_dkv, r.step_s, 1e-9);
  expect_rel(r.forward_s + r.backward_s, r.step_s, 1e-6);
}

// Compute just below the hops (k = 0.9: 0.9 h < a < h; 0.9 h > b). Per layer: forward steps 0
// and 1 last h each, their blocks (own and k h) hidden; block 2 runs alone. Backward: steps 0
// and 1 last h each (blocks hidden); rank 0's step-1 accumulator waits from h + k h (posted) to
// 2h + a, so block 2, [2h, 2h + k h], runs beside it (hidden); rank 0's step-2 send is posted at
// 2h + k h (its block and rank 2's accumulator, in at 2h + b, done), leaves at 2h + a (rank 1
// ready) and is home at 2h + 2a. Ring communication L (4h + 2a), as above; hidden = every block
// that ran beside a transfer = L (2 own + 3 k h) = the compute but the forward's last blocks;
// exposed the rest.
TEST(SimRingHidden, ComputeJustBelowTheHopIsHiddenWhole) {
  using H = HandRing;
  const double k = 0.9, L = H::L, h = H::h, a = H::a;
  const double own = k * h * (1 + 1.0 / (2 * H::c));
  const SimResult r = H::run(k);
  const double hidden = L * (2 * own + 3 * k * h);
  expect_rel(r.ring_comm_s, L * (4 * h + 2 * a), 1e-6);
  expect_rel(r.ring_comm_s - r.ring_exposed_s, hidden, 1e-6);
  expect_rel(r.attention_compute_s - L * k * h, hidden, 1e-6);  // all but forward block 2
  expect_rel(r.step_s, L * (4 * h + 2 * a + k * h), 1e-6);
}

// ---- parallel.shard full (worker/ring/full_shard.h)

// tiny.yaml as two rings of one rank (no ring hops), untied embeddings, on `nodes` nodes of
// `wpn` workers: the only transfers are the block gathers and reduce-scatters (and shard none's
// node exchange). AdamW and checkpoints take no time.
ring::spec::JobSpec shard_spec(int64_t layers, int64_t nodes, int64_t wpn) {
  auto s = load("configs/examples/tiny.yaml");
  s.model.layers = layers;
  s.model.tie_embeddings = false;
  s.model.recompute = false;
  s.parallel.context_ranks = 1;
  s.parallel.data_replicas = nodes * wpn;
  s.resources.nodes = nodes;
  s.resources.workers_per_node = wpn;
  s.parallel.shard = ring::spec::ShardMode::kFull;
  s.checkpoint.every_steps = 0;
  s.train.micro_batches = 1;
  return s;
}

// Two nodes of one GPU on one switch: 10 GB/s links of 5 us (both directions apart).
std::string two_node_graph(const TempDir& t) {
  return t.write("two.yaml",
                 "gpus_per_node: 1\nnodes: [n0, n1]\nswitches: [s]\nlinks:\n"
                 "  - {from: n0, to: s, gbytes_per_s: 10, latency_us: 5}\n"
                 "  - {from: n1, to: s, gbytes_per_s: 10, latency_us: 5}\n");
}

SimOptions shard_options(double compute_scale) {
  SimOptions o;
  o.rates = preset_rates("A100");
  for (double* r : {&o.rates.gemm_flops, &o.rates.gemm_bwd_flops, &o.rates.attention_fwd_flops,
                    &o.rates.attention_bwd_flops})
    *r *= compute_scale;
  o.rates.adamw_params_per_s = 1e30;
  return o;
}

// The bytes one rank receives in the gathers and sends in the reduce-scatters are what the
// worker's store moves (counted here from the contract objects it is built on: ParamLayout,
// worker_shards; head once, layers twice, the tied embedding twice, fp32) and what `ringctl
// plan` prints; and the nodes' ringd exchange nothing (shard optimizer: they do).
TEST(SimShardFull, GatherBytesArePlansAndNodesExchangeNothing) {
  auto s = load("configs/examples/slurm-2node.yaml");
  s.parallel.shard = ring::spec::ShardMode::kFull;
  s.train.micro_batches = 2;
  ASSERT_TRUE(s.model.tie_embeddings);
  SimOptions o;
  o.rates = preset_rates("H100");
  o.keep_trace = true;
  const SimResult r = simulate(s, o);
  ASSERT_TRUE(r.shard_full);
  // Per micro-batch: embedding, 4 layers, head, the embedding again; 4 layers in the backward.
  EXPECT_EQ(r.shard_gathers, 2 * 11);
  EXPECT_EQ(r.shard_scatters, 2 * 6);
  const ring::plan::Plan p = ring::plan::make_plan(s);
  EXPECT_EQ(r.shard_gathered_bytes, p.shard_gathered_per_rank);
  EXPECT_EQ(r.shard_scattered_bytes, p.shard_scattered_per_rank);
  const ring::contract::ParamLayout layout(ring::contract::ModelConfig::from_spec(s));
  std::set<double> gathered, scattered;
  for (const auto& w : ring::contract::worker_shards(layout, 2, 2)) {
    double g = 0, x = 0;
    for (const auto& b : layout.buckets()) {
      const int64_t mine = std::max<int64_t>(0, std::min(b.end, w.end) - std::max(b.begin, w.begin));
      const int times = &b == &layout.head_bucket() ? 1 : 2;  // tied: the embedding twice
      g += times * 4.0 * static_cast<double>(b.end - b.begin - mine);
      x += 4.0 * static_cast<double>(b.end - b.begin - mine);
    }
    gathered.insert(2 * g);
    scattered.insert(2 * x);
  }
  EXPECT_TRUE(gathered.count(r.shard_gathered_bytes)) << r.shard_gathered_bytes;
  // The gather flows into rank 0 (simulated in full: one flow per part) carry those bytes.
  double into0 = 0;
  for (const auto& t : r.trace)
    if (t.name == "shard full: block all-gather" && t.pid == 3 && t.tid == 0) into0 += t.bytes;
  EXPECT_EQ(into0, r.shard_gathered_bytes);
  EXPECT_TRUE(scattered.count(r.shard_scattered_bytes)) << r.shard_scattered_bytes;
  EXPECT_EQ(r.exchange_s, 0);
  int exchange = 0, gathers = 0;
  for (const auto& t : r.trace) {
    exchange += t.name == "gradient exchange";
    gathers += t.name == "shard full: block all-gather";
  }
  EXPECT_EQ(exchange, 0);
  EXPECT_GT(gathers, 0);
  s.parallel.shard = ring::spec::ShardMode::kOptimizer;
  const SimResult opt = simulate(s, o);
  EXPECT_FALSE(opt.shard_full);
  EXPECT_GT(opt.exchange_s, 0);
}

// The bytes by hand, plan and simulate alike (common/cp/shard_messages.h). tiny.yaml with one
// layer, untied, two nodes of one worker: d 256, 8 heads of 32, 4 K/V heads, SwiGLU of
// ceil(8 x 256 / 3) rounded to 64 = 704, vocab 256. Buckets: head = final norm 256 + LM head
// 256 x 256 = 65,792; layer 0 = norms 2 x 256 + wq, wo 2 x 256 x 256 + wk, wv 2 x 256 x 128 +
// gate, up, down 3 x 256 x 704 = 737,792; embedding 256 x 256 = 65,536. Node 0 owns the head,
// node 1 the layer and the embedding. Rank 0 receives the layer twice and the embedding once
// (1,541,120 values), rank 1 the head once; rank 0 reduce-scatters the layer's and the
// embedding's gradient (803,328 values, fp32), rank 1 the head's. bf16 gathers: 2 bytes a value.
TEST(SimShardFull, GatherBytesByHandBf16HalfOfFp32) {
  auto s = shard_spec(1, 2, 1);
  const ring::plan::FullShardLayout fs = ring::plan::full_shard_layout(s);
  ASSERT_EQ(fs.owner, (std::vector<int>{0, 1, 1}));
  ASSERT_EQ(fs.size(0), 65792);
  ASSERT_EQ(fs.size(1), 737792);
  ASSERT_EQ(fs.size(2), 65536);
  const SimOptions o = shard_options(1.0);
  for (const auto dtype : {ring::spec::DType::kFp32, ring::spec::DType::kBf16}) {
    s.model.dtype = dtype;
    const double e = dtype == ring::spec::DType::kBf16 ? 2.0 : 4.0;
    const ring::plan::Plan p = ring::plan::make_plan(s);
    EXPECT_EQ(p.shard_gathered_per_rank, e * 1541120) << ring::spec::to_string(dtype);
    EXPECT_EQ(p.shard_scattered_per_rank, 4.0 * 803328) << ring::spec::to_string(dtype);
    const SimResult r = simulate(s, o);
    EXPECT_EQ(r.shard_gathered_bytes, e * 1541120) << ring::spec::to_string(dtype);
    EXPECT_EQ(r.shard_scattered_bytes, 4.0 * 803328) << ring::spec::to_string(dtype);
  }
}

// A very slow link (compute 1e20 times A100's: nothing): every gather and reduce-scatter is
// exposed and the step is their chain, by hand. Two ranks, one per node; layers = 1: buckets
// head, layer 0, embedding; node 0 owns the head, node 1 layer 0 and the embedding. A transfer
// of bucket b alone takes t_b = latency + 4 size_b / bandwidth. Forward: the embedding, layer
// 0 and head gathers one after another (T = tE + tL + tH). Then layer 0's gather again (node 1
// to 0) beside the head's reduce-scatter (node 1 to its owner 0): one route, shared half and
// half until the head's 4 size_H bytes are through, so both are in after
// latency + 4 (size_L + size_H) / bandwidth. Then layer 0's and the embedding's
// reduce-scatters (node 0 to 1), one after the other.
TEST(SimShardFull, SlowLinkExposesTheChain) {
  TempDir t;
  const auto s = shard_spec(1, 2, 1);
  SimOptions o = shard_options(1e20);
  o.cluster.shape = Shape::kGraphFile;
  o.cluster.file = two_node_graph(t);
  const SimResult r = simulate(s, o);
  const ring::plan::FullShardLayout fs = ring::plan::full_shard_layout(s);
  ASSERT_EQ(fs.owner, (std::vector<int>{0, 1, 1}));
  ASSERT_LT(fs.size(0), fs.size(1));
  ClusterOptions co = o.cluster;
  co.gpus_per_node = 1;
  co.nodes = 2;
  co.nvlink_bw = o.rates.intra_node_bw;
  const auto cl = Cluster::build(co);
  const auto route = cl->route(0, 0, 1, 0);
  const double alpha = cl->net().route_latency(route), bw = cl->net().route_bandwidth(route);
  expect_rel(alpha, 2 * 5e-6 + 2 * 2e-6);  // two links, two NICs
  auto tb = [&](size_t b) { return alpha + 4.0 * static_cast<double>(fs.size(b)) / bw; };
  const double tH = tb(0), tL = tb(1), tE = tb(2);
  const double shared = alpha + 4.0 * static_cast<double>(fs.size(0) + fs.size(1)) / bw;
  expect_rel(r.step_s, tE + tL + tH + shared + tL + tE, 1e-9);
  expect_rel(r.shard_gather_exposed_s, tE + tL + tH + shared, 1e-9);
  expect_rel(r.shard_scatter_exposed_s, tL + tE, 1e-9);
  EXPECT_LT(r.shard_hidden_share, 0.1);  // only the head's reduce-scatter is hidden
}

// Very slow compute: each gather is prefetched while the block before it computes, so only the
// embedding's (at the pass start) and layer 0's (the embedding's own compute is nothing) are
// waited for, each for exactly its transfer time; the other 6 of 8 are hidden.
TEST(SimShardFull, SlowComputeHidesThePrefetchedGathers) {
  TempDir t;
  const auto s = shard_spec(3, 2, 1);
  SimOptions o = shard_options(1e-6);
  o.cluster.shape = Shape::kGraphFile;
  o.cluster.file = two_node_graph(t);
  const SimResult r = simulate(s, o);
  const ring::plan::FullShardLayout fs = ring::plan::full_shard_layout(s);
  ClusterOptions co = o.cluster;
  co.gpus_per_node = 1;
  co.nodes = 2;
  co.nvlink_bw = o.rates.intra_node_bw;
  const auto cl = Cluster::build(co);
  const auto route = cl->route(0, 0, 1, 0);
  const double alpha = cl->net().route_latency(route), bw = cl->net().route_bandwidth(route);
  auto tb = [&](size_t b) { return alpha + 4.0 * static_cast<double>(fs.size(b)) / bw; };
  EXPECT_EQ(r.shard_gathers, 8);
  // Buckets: head, layers 2, 1, 0, embedding.
  expect_rel(r.shard_gather_exposed_s, tb(4) + tb(3), 1e-9);
  EXPECT_GT(r.shard_gather_s, r.shard_gather_exposed_s + 5 * tb(3));
  EXPECT_GT(r.step_s, 100 * r.shard_gather_s);
}

// Shard none and full with no network between nodes (one node of two workers, two rings of one
// rank: no ring, no node exchange, the same AdamW) differ by exactly the time the ranks waited
// for the gathers and reduce-scatters (on NVLink).
TEST(SimShardFull, NoneAndFullDifferByTheShardWaits) {
  auto s = shard_spec(4, 1, 2);
  const SimOptions o = shard_options(1.0);
  const SimResult full = simulate(s, o);
  s.parallel.shard = ring::spec::ShardMode::kNone;
  const SimResult none = simulate(s, o);
  EXPECT_FALSE(none.shard_full);
  ASSERT_GT(full.shard_gather_exposed_s + full.shard_scatter_exposed_s, 0);
  expect_rel(full.step_s - none.step_s, full.shard_gather_exposed_s + full.shard_scatter_exposed_s, 1e-9);
}

// The reduced simulation folds the ranks it does not simulate into weighted flows; on a job
// small enough to simulate whole, it agrees with the full one.
TEST(SimShardFull, ReducedAgreesWithFull) {
  for (const auto dtype : {ring::spec::DType::kFp32, ring::spec::DType::kBf16}) {
    auto spec = load("configs/examples/70b-1m-64x8-h100.yaml");
    spec.parallel.head_ranks = 1;  // the single ring (head ranks: the test below)
    spec.model.layers = 2;
    spec.data.seq_len = 65536;
    spec.resources.nodes = 16;
    spec.parallel.data_replicas = 2;
    spec.parallel.shard = ring::spec::ShardMode::kFull;
    spec.model.dtype = dtype;
    SimOptions o;
    o.rates = preset_rates("H100");
    o.expand = Expand::kFull;
    const SimResult full = simulate(spec, o);
    o.expand = Expand::kReduced;
    const SimResult red = simulate(spec, o);
    EXPECT_LT(red.simulated_positions, full.simulated_positions);
    // Reduced places every bucket on the simulated ring's node and folds the others (see
    // docs/simulation.md): 23 % short of the full simulation in fp32 (14.8 s against 19.4 s),
    // 31 % with bf16 gathers, half the bytes (10.0 s against 14.5 s).
    const bool bf16 = dtype == ring::spec::DType::kBf16;
    std::printf("%s: reduced %.3f s, full %.3f s\n", ring::spec::to_string(dtype), red.step_s,
                full.step_s);
    expect_rel(red.step_s, full.step_s, bf16 ? 0.35 : 0.25);
    expect_rel(red.shard_gathered_bytes, full.shard_gathered_bytes, 1e-12);
  }
}

// With head ranks the reduced simulation holds one period of every head slot's ring (whole
// head groups, so whole nodes): shard full's senders contend on a simulated node as in full,
// and the gap is the single ring's (above: the folded reduce-scatters), not larger. The
// example's bf16: reduced 10.00 s against 15.02 s full (head ranks 2), 9.97 s against 15.08 s
// (8); head ranks 1: 10.05 s against 14.50 s.
TEST(SimShardFull, ReducedAgreesWithFullHeadRanks) {
  auto spec = load("configs/examples/70b-1m-64x8-h100.yaml");
  spec.model.layers = 2;
  spec.data.seq_len = 65536;
  spec.resources.nodes = 16;
  spec.parallel.data_replicas = 2;
  spec.parallel.shard = ring::spec::ShardMode::kFull;
  SimOptions o;
  o.rates = preset_rates("H100");
  double ratio1 = 0;  // reduced / full, head ranks 1
  for (const int64_t u : {1, 2, 8}) {
    spec.parallel.head_ranks = u;
    o.expand = Expand::kFull;
    const SimResult full = simulate(spec, o);
    o.expand = Expand::kReduced;
    const SimResult red = simulate(spec, o);
    std::printf("head ranks %lld: reduced %.3f s, full %.3f s\n", static_cast<long long>(u),
                red.step_s, full.step_s);
    EXPECT_LT(red.simulated_positions, full.simulated_positions);
    expect_rel(red.step_s, full.step_s, 0.35);
    expect_rel(red.shard_gathered_bytes, full.shard_gathered_bytes, 1e-12);
    if (u == 1) ratio1 = red.step_s / full.step_s;
    expect_rel(red.step_s / full.step_s, ratio1, 0.05);  // head ranks add no error of their own
  }
}

TEST(SimTrace, WritesChromeJson) {
  TempDir t;
  const auto spec = load("configs/examples/tiny.yaml");
  SimOptions o;
  o.rates = preset_rates("A100");
  o.keep_trace = true;
  const SimResult r = simulate(spec, o);
  write_trace(r, t.path + "/trace.json");
  std::ifstream in(t.path + "/trace.json");
  const auto j = nlohmann::json::parse(in);
  ASSERT_TRUE(j.contains("traceEvents"));
  int complete = 0;
  double last = 0;
  for (const auto& e : j["traceEvents"])
    if (e["ph"] == "X") ++complete, last = std::max(last, e["ts"].get<double>() + e["dur"].get<double>());
  EXPECT_GT(complete, 100);
  expect_rel(last, r.step_s * 1e6, 1e-9);
}

// ---- two-level context parallelism (parallel.head_ranks U, worker/ring/head_attention.h)
//
// tiny.yaml (8 heads, 4 K/V heads, head_dim 32, fp32) on 2 nodes x 2 GPUs, context_ranks 4,
// head_ranks U = 2: the groups are the nodes (ranks 0, 1 and 2, 3), R = 2 groups, and two rings
// (slot 0: ranks 0 -> 2 -> 0, slot 1: ranks 1 -> 3 -> 1). One causal document of 8192 tokens
// (zigzag over 4 ranks: 8 chunks of c = 1024, rank r holds chunks r and 7 - r, T = 2048), L = 2
// layers, no recompute, one micro-batch. Worked by hand:
//   slot heads: H / U = 4 query heads, K / U = 2 K/V heads (kvd 64);
//   group 0 = chunks 0, 1 and 6, 7 ([0, 2048) and [6144, 8192)), group 1 = chunks 2..5
//   ([2048, 6144)): U T = 4096 tokens each;
//   ring K/V block: 64 + 8 x 4096 + 4 x 4096 + 2 x 4 x 4096 x 64 = 2,146,368 B; per layer R - 1 = 1
//   K/V hop forward and 1 backward, and R = 2 dK/dV sends: rank 0's at step 0 carries nothing,
//   at step 1 group 1's block (which group 0's late queries [6144, 8192) attend whole): 4096
//   rows, 64 + 2 x 4 x 4096 x 64 = 2,097,216 B;
//   all-to-all, to the one other member per layer (T = 2048, 4 heads of 32, 2 K/V heads):
//     forward gather  8 T + 4 T + 4 T 128 + 2 x 4 T 64 = 16,384 + 8,192 + 1,048,576 + 1,048,576
//                     = 2,121,728 B
//     forward return  4 T 128 + 4 T 4 = 1,081,344 B
//     backward gather 2,121,728 + 2 x 1,048,576 (o, dout) + 32,768 (lse) = 4,251,648 B
//     backward return 1,048,576 (dq) + 2 x 524,288 (dk, dv) = 2,097,152 B
//   = 9,551,872 B per layer, 4 all-to-alls.
// On NVLink at B = 100 GB/s without latency each all-to-all is one transfer out of and one into
// every GPU's link: bytes / B, and blocking, so all of it exposed.
struct HandGroups {
  static constexpr int64_t L = 2, c = 1024, T = 2 * c, U = 2, R = 2;
  static constexpr double B = 100e9;
  static constexpr double kv = 64 + 8.0 * 4096 + 4.0 * 4096 + 2 * 4.0 * 4096 * 64;
  static constexpr double dkv = 64 + 2 * 4.0 * 4096 * 64;
  static constexpr double a2a_layer = 2121728.0 + 1081344.0 + 4251648.0 + 2097152.0;

  static ring::spec::JobSpec spec(int64_t u) {
    auto s = load("configs/examples/tiny.yaml");
    s.model.layers = L;
    s.model.recompute = false;
    s.data.seq_len = 8 * c;
    s.data.pack = false;
    s.parallel.context_ranks = 4;
    s.parallel.data_replicas = 1;
    s.parallel.head_ranks = u;
    s.resources.nodes = 2;
    s.resources.workers_per_node = 2;
    s.train.micro_batches = 1;
    s.checkpoint.every_steps = 0;
    return s;
  }
  static SimResult run(int64_t u, bool fast_compute) {
    SimOptions o;
    o.rates = preset_rates("H100");
    o.rates.intra_node_bw = B;
    o.rates.intra_node_latency = 0;
    if (fast_compute) {
      o.rates.gemm_flops = o.rates.gemm_bwd_flops = 1e30;
      o.rates.attention_fwd_flops = o.rates.attention_bwd_flops = 1e30;
      o.rates.adamw_params_per_s = 1e30;
    }
    o.stagger_us = 0;
    o.expand = Expand::kFull;
    return simulate(spec(u), o);
  }
};

TEST(SimHeadGroups, TheGroupsAreTheWorkload) {
  using H = HandGroups;
  const Workload w = make_workload(H::spec(2));
  ASSERT_EQ(w.P, H::R);
  EXPECT_EQ(w.D, H::U);
  EXPECT_EQ(w.head_ranks, H::U);
  EXPECT_EQ(w.heads, 4);
  EXPECT_EQ(w.kvd, 64);
  EXPECT_EQ(w.tokens, 4096);
  EXPECT_DOUBLE_EQ(w.kv_block_bytes, H::kv);
  EXPECT_DOUBLE_EQ(w.a2a_gather_fwd + w.a2a_return_fwd + w.a2a_gather_bwd + w.a2a_return_bwd,
                   H::a2a_layer);
  EXPECT_EQ(w.dkv_rows(1, 1), 4096);  // group 0 adds to group 1's block: all of it
  EXPECT_EQ(w.dkv_rows(0, 1), 2048);  // group 1 adds to group 0's early chunks only
  // Attention work: every (query, key) causal pair once over the groups, as over the ranks; the
  // projections stay per rank.
  const Workload one = make_workload(H::spec(1));
  double pairs_u = 0, pairs_1 = 0;
  for (int64_t q = 0; q < w.P; ++q)
    for (int64_t o = 0; o < w.P; ++o) pairs_u += w.pairs(q, o);
  for (int64_t q = 0; q < one.P; ++q)
    for (int64_t o = 0; o < one.P; ++o) pairs_1 += one.pairs(q, o);
  const double n = 8.0 * H::c;
  EXPECT_DOUBLE_EQ(pairs_u, n * (n + 1) / 2);
  EXPECT_DOUBLE_EQ(pairs_1, n * (n + 1) / 2);
  EXPECT_DOUBLE_EQ(w.pre_fwd_flops, one.pre_fwd_flops);
  EXPECT_DOUBLE_EQ(w.post_fwd_flops, one.post_fwd_flops);
}

TEST(SimHeadGroups, AllToAllBytesAndRingHopsOfTheHandCase) {
  using H = HandGroups;
  const SimResult r = H::run(2, /*fast_compute=*/true);
  EXPECT_EQ(r.head_ranks, 2);
  EXPECT_EQ(r.ring_size, H::R);
  EXPECT_EQ(r.rings, H::U);
  // 4 positions (every rank) x L layers x (R - 1) K/V hops a pass; R dK/dV sends a layer.
  EXPECT_EQ(r.hop_forward.count, 4 * H::L * (H::R - 1));
  EXPECT_EQ(r.hop_backward_kv.count, 4 * H::L * (H::R - 1));
  EXPECT_EQ(r.hop_dkv.count, 4 * H::L * H::R);
  EXPECT_DOUBLE_EQ(r.hop_forward.bytes, H::kv);
  EXPECT_DOUBLE_EQ(r.hop_dkv.bytes, H::dkv);
  EXPECT_DOUBLE_EQ(r.ring_bytes_per_rank, H::L * (2 * H::kv + H::dkv));
  EXPECT_EQ(r.a2a_count, 4 * H::L);
  EXPECT_DOUBLE_EQ(r.a2a_bytes_per_rank, H::L * H::a2a_layer);
  expect_rel(r.a2a_s, H::L * H::a2a_layer / H::B, 1e-9);
  expect_rel(r.a2a_exposed_s, r.a2a_s, 1e-9);
  const auto json = to_json(r);
  EXPECT_EQ(json["head_groups"]["head_ranks"], 2);
  EXPECT_EQ(json["head_groups"]["ring_groups"], H::R);
  EXPECT_DOUBLE_EQ(json["head_groups"]["all_to_all_s"].get<double>(), r.a2a_s);
  EXPECT_NE(to_text(r).find("head all-to-all (inside the node)"), std::string::npos);
}

// The same attention FLOPs per rank as the single ring (zigzag balances groups as it does ranks):
// U times more per hop, R - 1 instead of P - 1 hops.
TEST(SimHeadGroups, SameAttentionComputePerRankAsTheSingleRing) {
  using H = HandGroups;
  const SimResult one = H::run(1, false), two = H::run(2, false);
  expect_rel(two.attention_compute_s, one.attention_compute_s, 1e-9);
  expect_rel(two.projection_compute_s, one.projection_compute_s, 1e-9);
  EXPECT_EQ(one.a2a_count, 0);
  EXPECT_TRUE(to_json(one)["head_groups"].is_null());
}

// A head group must sit inside one node: a listed ring order that pairs ranks of two nodes is
// refused, naming the key.
TEST(SimHeadGroups, AGroupAcrossNodesIsRefused) {
  auto s = HandGroups::spec(2);
  s.parallel.ring_order = ring::spec::RingOrder::kList;
  s.parallel.ring_order_list = {0, 2, 1, 3};
  SimOptions o;
  o.rates = preset_rates("H100");
  try {
    simulate(s, o);
    FAIL() << "expected an error";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("parallel.head_ranks"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("inside one node"), std::string::npos) << e.what();
  }
}

// Accounting (docs/simulation.md, "Accounting") on configs/examples/tiny.yaml (fp32, 4 ranks, one
// sequence of N = 16384 per step, no recompute) at the H100 preset: the model FLOPs are
// 6 x params x N + 6 x layers x d_model x N^2 = 6 x params x 16384 + 6 x 4 x 256 x 16384^2;
// the MFU is those over (step x 4 GPUs x 494.7 TFLOP/s, the H100's dense TF32 peak for fp32);
// the compute-only step (the busiest rank's kernels back to back) is at most the predicted step,
// at least rank 0's compute, and the step itself once communication and the optimizer are free.
TEST(SimAccounting, FlopsMfuAndComputeOnlyStep) {
  const auto spec = load("configs/examples/tiny.yaml");
  const double params = static_cast<double>(ring::plan::make_plan(spec).params);
  const double N = 16384;
  const double model = 6 * params * N + 6 * 4 * 256 * N * N;
  SimOptions o;
  o.rates = preset_rates("H100");
  o.expand = Expand::kFull;
  const SimResult r = simulate(spec, o);
  EXPECT_DOUBLE_EQ(r.model_flops_per_step, model);
  EXPECT_DOUBLE_EQ(r.hardware_flops_per_step, model);  // recompute: false
  EXPECT_DOUBLE_EQ(r.peak_flops_per_gpu, 494.7e12);
  EXPECT_EQ(r.ranks, 4);
  EXPECT_NEAR(r.mfu, model / (r.step_s * 4 * 494.7e12), 1e-12 * r.mfu);
  EXPECT_GT(r.compute_only_step_s, 0);
  EXPECT_LE(r.compute_only_step_s, r.step_s * (1 + 1e-12));
  EXPECT_GE(r.compute_only_step_s * (1 + 1e-12), r.attention_compute_s + r.projection_compute_s);

  // bf16: the peak is the dense BF16 one, and recompute adds a third of the model's FLOPs
  // (one more forward of three: 2 x params x N + 2 x layers x d_model x N^2).
  auto b = spec;
  b.model.dtype = ring::spec::DType::kBf16;
  b.model.recompute = true;
  const SimResult rb = simulate(b, o);
  EXPECT_DOUBLE_EQ(rb.peak_flops_per_gpu, 989.4e12);
  EXPECT_NEAR(rb.hardware_flops_per_step, model * 4 / 3, 1e-12 * model);
  EXPECT_NEAR(rb.mfu, model / (rb.step_s * 4 * 989.4e12), 1e-12 * rb.mfu);

  // Communication and the optimizer free, one causal document (zigzag gives every rank the same
  // work at every ring step, so no rank waits for another's block): the step is its
  // compute-only step. (With packed documents the ranks' work differs from step to step and a
  // rank waits for a slower neighbour's block: the step exceeds the busiest rank's kernels.)
  auto one_doc = spec;
  one_doc.data.pack = false;
  SimOptions f = o;
  f.rates.intra_node_bw = 1e30;
  f.rates.intra_node_latency = 0;
  f.rates.adamw_params_per_s = 1e30;
  f.stagger_us = 0;
  const SimResult rf = simulate(one_doc, f);
  EXPECT_LE(rf.compute_only_step_s, rf.step_s * (1 + 1e-12));
  EXPECT_NEAR(rf.step_s / rf.compute_only_step_s, 1.0, 0.02) << rf.step_s << " " << rf.compute_only_step_s;

  // --json carries it all; the text states the efficiencies and their sources.
  const nlohmann::json j = to_json(r);
  for (const char* k : {"model_flops_per_step", "hardware_flops_per_step", "compute_only_step_s",
                        "mfu", "peak_flops_per_gpu", "kernel_efficiency", "exposed"})
    EXPECT_TRUE(j.contains(k)) << k;
  EXPECT_DOUBLE_EQ(j["kernel_efficiency"]["gemm"]["fraction_of_peak"].get<double>(), 0.60);
  EXPECT_DOUBLE_EQ(j["kernel_efficiency"]["attention_forward"]["fraction_of_peak"].get<double>(), 0.45);
  EXPECT_DOUBLE_EQ(j["kernel_efficiency"]["attention_backward"]["fraction_of_peak"].get<double>(), 0.35);
  EXPECT_NE(j["kernel_efficiency"]["attention_forward"]["source"].get<std::string>().find("FlashAttention-3"),
            std::string::npos);
  EXPECT_DOUBLE_EQ(j["exposed"]["ring"]["seconds"].get<double>(), r.ring_exposed_s * r.micro_batches);
  EXPECT_DOUBLE_EQ(j["exposed"]["optimizer"]["share"].get<double>(), r.optimizer_exposed_s / r.step_s);
  const std::string t = to_text(r);
  for (const char* k : {"model FLOPs per step", "compute-only step", "MFU", "exposed: ring",
                        "kernel efficiencies assumed", "attention backward"})
    EXPECT_NE(t.find(k), std::string::npos) << k;
}

}  // namespace
