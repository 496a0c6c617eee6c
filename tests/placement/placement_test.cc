// nvidia-smi parsers, placement policy, hwloc adapter, cpusets and discovery.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>

#include "daemon/placement/affinity.h"
#include "daemon/placement/cpu_topology.h"
#include "daemon/placement/discovery.h"
#include "daemon/placement/errors.h"
#include "daemon/placement/gpu_topology.h"
#include "daemon/placement/placement.h"
#include "tests/placement/test_util.h"

namespace ring::placement {
namespace {

using testing::fixture_path;
using testing::make_cpus;
using testing::read_fixture;

GpuTopology load(const std::string& name) {
  return parse_topo_matrix(read_fixture(name), name);
}

// Expects `f` to throw E whose message contains every fragment.
template <typename E, typename F>
void expect_error(F f, std::initializer_list<const char*> fragments) {
  try {
    f();
    ADD_FAILURE() << "no exception";
  } catch (const E& e) {
    for (const char* frag : fragments) {
      EXPECT_NE(std::string(e.what()).find(frag), std::string::npos)
          << "'" << e.what() << "' lacks '" << frag << "'";
    }
  }
}

// ---- topo -m --------------------------------------------------------------------------------

TEST(TopoMatrix, DgxA100) {
  GpuTopology t = load("dgx_a100_topo.txt");
  ASSERT_EQ(t.gpus.size(), 8u);
  ASSERT_EQ(t.nics.size(), 10u);
  EXPECT_EQ(t.nics[4].device, "mlx5_4");
  EXPECT_EQ(t.gpu_links[0][5], (Link{LinkKind::kNvLink, 12}));
  EXPECT_EQ(t.gpu_links[3][3].kind, LinkKind::kSelf);
  EXPECT_EQ(t.gpu_nic_links[0][0].kind, LinkKind::kPxb);
  EXPECT_EQ(t.gpu_nic_links[0][2].kind, LinkKind::kSys);
  EXPECT_EQ(t.gpus[0].numa_node, 3);
  EXPECT_EQ(t.gpus[4].numa_node, 7);
  EXPECT_EQ(format_cpu_list(t.gpus[2].cpu_affinity), "16-31,144-159");
}

TEST(TopoMatrix, DgxH100SpaceSeparated) {
  GpuTopology t = load("dgx_h100_topo.txt");
  ASSERT_EQ(t.gpus.size(), 8u);
  ASSERT_EQ(t.nics.size(), 10u);
  EXPECT_EQ(t.gpu_links[7][0], (Link{LinkKind::kNvLink, 18}));
  EXPECT_EQ(t.gpu_nic_links[4][6].kind, LinkKind::kPix);
  EXPECT_EQ(t.gpus[3].numa_node, 0);
  EXPECT_EQ(t.gpus[4].numa_node, 1);
  EXPECT_EQ(t.gpus[5].cpu_affinity.size(), 112u);
  EXPECT_EQ(t.nics[9].device, "mlx5_9");
}

TEST(TopoMatrix, HgxH200) {
  GpuTopology t = load("hgx_h200_topo.txt");
  ASSERT_EQ(t.gpus.size(), 8u);
  ASSERT_EQ(t.nics.size(), 4u);
  EXPECT_EQ(t.gpu_nic_links[5][2].kind, LinkKind::kPxb);
  EXPECT_EQ(t.gpus[6].numa_node, 1);
}

TEST(TopoMatrix, OldDriverPcieBox) {
  // No NUMA Affinity column; the NIC column is named by device (mlx5_0).
  GpuTopology t = load("pcie_8gpu_topo.txt");
  ASSERT_EQ(t.gpus.size(), 8u);
  ASSERT_EQ(t.nics.size(), 1u);
  EXPECT_EQ(t.nics[0].device, "mlx5_0");
  EXPECT_EQ(t.gpus[0].numa_node, -1);
  EXPECT_EQ(format_cpu_list(t.gpus[7].cpu_affinity), "24-47,72-95");
  EXPECT_EQ(t.gpu_links[0][1].kind, LinkKind::kPix);
  EXPECT_EQ(t.gpu_links[1][2].kind, LinkKind::kPxb);
  EXPECT_EQ(t.gpu_links[5][6].kind, LinkKind::kNode);
  EXPECT_EQ(t.gpu_links[3][4].kind, LinkKind::kSys);
}

TEST(TopoMatrix, TwoSocketAndSingleGpu) {
  GpuTopology t = load("two_socket_4gpu_topo.txt");
  EXPECT_EQ(t.gpus[1].numa_node, 1);
  EXPECT_EQ(t.gpu_links[1][3].kind, LinkKind::kPhb);
  GpuTopology s = load("single_gpu_topo.txt");
  ASSERT_EQ(s.gpus.size(), 1u);
  EXPECT_EQ(s.gpus[0].numa_node, -1);  // N/A
  EXPECT_EQ(format_cpu_list(s.gpus[0].cpu_affinity), "0-7");
}

TEST(TopoMatrix, LinkTokens) {
  EXPECT_EQ(parse_link("NV4"), (Link{LinkKind::kNvLink, 4}));
  EXPECT_EQ(parse_link("SOC")->kind, LinkKind::kSys);
  EXPECT_FALSE(parse_link("NV"));
  EXPECT_FALSE(parse_link("NVx"));
  EXPECT_FALSE(parse_link("PCI"));
  EXPECT_EQ(to_string(Link{LinkKind::kNvLink, 18}), "NV18");
}

TEST(TopoMatrix, MalformedInputsNameTheProblem) {
  auto parse = [](const std::string& s) { return parse_topo_matrix(s, "t.txt"); };
  expect_error<TopologyParseError>([&] { parse(""); }, {"t.txt:1", "empty"});
  expect_error<TopologyParseError>([&] { parse("\tCPU Affinity\nfoo\n"); },
                                   {"t.txt:1", "no GPU columns"});
  expect_error<TopologyParseError>([&] { parse("\tGPU0\tGPU1\nGPU0\t X \tNVX\nGPU1\tNV2\t X \n"); },
                                   {"t.txt:2", "unknown link 'NVX'", "GPU1"});
  expect_error<TopologyParseError>([&] { parse("\tGPU0\tGPU1\nGPU0\tNV2\tNV2\nGPU1\tNV2\t X \n"); },
                                   {"t.txt:2", "diagonal"});
  expect_error<TopologyParseError>([&] { parse("\tGPU0\tGPU1\nGPU0\t X \tPIX\n"); },
                                   {"no row for GPU1"});
  expect_error<TopologyParseError>([&] { parse("\tGPU0\tGPU1\nGPU0\t X \nGPU1\tPIX\t X \n"); },
                                   {"t.txt:2", "1 link entries, expected 2"});
  expect_error<TopologyParseError>([&] { parse("\tGPU0\tCPU Affinity\nGPU0\t X \t0-3\t7\n"); },
                                   {"t.txt:2", "at most 2"});
  expect_error<TopologyParseError>([&] { parse("\tGPU0\tCPU Affinity\nGPU0\t X \t3-1\n"); },
                                   {"t.txt:2", "bad CPU list"});
  expect_error<TopologyParseError>([&] { parse("\tGPU0\tGPU2\n"); }, {"out of order"});
  expect_error<TopologyParseError>([&] { parse("\tGPU0\nGPU7\t X \n"); },
                                   {"t.txt:2", "row 'GPU7'"});
  expect_error<TopologyParseError>([&] { parse("\tGPU0\nGPU0\t X \nGPU0\t X \n"); },
                                   {"t.txt:3", "duplicate row GPU0"});
  // Truncated output (a killed nvidia-smi): the header survives, the rows do not.
  std::string cut = read_fixture("dgx_h100_topo.txt").substr(0, 400);
  EXPECT_THROW(parse(cut), TopologyParseError);
}

TEST(CpuList, ParseAndFormat) {
  EXPECT_EQ(parse_cpu_list("0-2,5"), (std::vector<int>{0, 1, 2, 5}));
  EXPECT_EQ(format_cpu_list({5, 0, 1, 2, 2}), "0-2,5");
  EXPECT_EQ(format_cpu_list({}), "");
  EXPECT_THROW(parse_cpu_list(""), TopologyParseError);
  EXPECT_THROW(parse_cpu_list("1,,2"), TopologyParseError);
  EXPECT_THROW(parse_cpu_list("0-99999999"), TopologyParseError);
}

// ---- --query-gpu CSV -------------------------------------------------------------------------

TEST(SmiCsv, DgxH100Inventory) {
  std::vector<GpuInfo> g = parse_smi_csv(read_fixture("dgx_h100_gpus.csv"), "gpus.csv");
  ASSERT_EQ(g.size(), 8u);
  EXPECT_EQ(g[0].name, "NVIDIA H100 80GB HBM3");
  EXPECT_EQ(g[3].index, 3);
  EXPECT_EQ(g[3].pci_bus_id, "00000000:5D:00.0");
  EXPECT_EQ(g[7].uuid, "GPU-6b4f2f1e-8a07-4c39-9d1e-3a7c5b0e0007");
  EXPECT_EQ(g[7].memory_mib, 81559u);
  GpuTopology t = load("dgx_h100_topo.txt");
  merge_gpu_inventory(t, g);
  EXPECT_EQ(t.gpus[7].uuid, g[7].uuid);
  EXPECT_EQ(t.gpus[7].numa_node, 1);  // kept from topo -m
  expect_error<TopologyParseError>([&] { merge_gpu_inventory(t, {g[0]}); },
                                   {"--query-gpu lists 1 GPUs but topo -m lists 8"});
}

TEST(SmiCsv, UnknownFieldsCommasInNamesAndBlankLines) {
  auto g = parse_smi_csv(
      "0, [N/A], 00000000:01:00.0, [Not Supported], Tesla T4, rev. b\r\n"
      "\n"
      "1, GPU-x, N/A, 16384, [N/A]\n",
      "x");
  ASSERT_EQ(g.size(), 2u);
  EXPECT_EQ(g[0].name, "Tesla T4, rev. b");
  EXPECT_EQ(g[0].uuid, "");
  EXPECT_EQ(g[0].pci_bus_id, "00000000:01:00.0");
  EXPECT_EQ(g[0].memory_mib, 0u);
  EXPECT_EQ(g[1].uuid, "GPU-x");
  EXPECT_EQ(g[1].pci_bus_id, "");
  EXPECT_EQ(g[1].memory_mib, 16384u);
  EXPECT_EQ(g[1].name, "");
  EXPECT_TRUE(parse_smi_csv("", "x").empty());
}

TEST(SmiCsv, MalformedInputsNameTheLineAndField) {
  auto parse = [](const std::string& s) { return parse_smi_csv(s, "gpus.csv"); };
  expect_error<TopologyParseError>(
      [&] { parse("0, GPU-a, 00000000:01:00.0, 80, A\n1, GPU-b, 00000000:02:00.0\n"); },
      {"gpus.csv:2", "3 fields, expected 5 (index, uuid, pci.bus_id, memory.total, name)"});
  expect_error<TopologyParseError>(
      [&] { parse("0, GPU-a, 00000000:01:00.0, 80 MiB, A\n"); },
      {"gpus.csv:1", "field memory.total is '80 MiB'", "nounits"});
  expect_error<TopologyParseError>([&] { parse("0, GPU-a, 00000000:01:00.0, -5, A\n"); },
                                   {"gpus.csv:1", "field memory.total is '-5'"});
  expect_error<TopologyParseError>(
      [&] { parse("0, a, b, 1, A\n2, a, b, 1, B\n"); },
      {"gpus.csv:2", "field index is '2', expected 1"});
  expect_error<TopologyParseError>([&] { parse("index, uuid, pci.bus_id, memory.total, name\n"); },
                                   {"gpus.csv:1", "field index is 'index'"});
  // A recording cut mid-line: the last line is short.
  std::string csv = read_fixture("dgx_h100_gpus.csv");
  expect_error<TopologyParseError>([&] { parse(csv.substr(0, csv.size() / 2 + 20)); },
                                   {"gpus.csv:5", "fields, expected 5"});
}

// ---- placement ------------------------------------------------------------------------------

TEST(Placement, DgxH100EightGpuWorkers) {
  GpuTopology t = load("dgx_h100_topo.txt");
  merge_gpu_inventory(t, parse_smi_csv(read_fixture("dgx_h100_gpus.csv"), "gpus.csv"));
  CpuTopology cpus = make_cpus(2, 56);
  Placement p = place_workers(t, cpus, {.workers = 8, .cpus_per_worker = 0});
  ASSERT_EQ(p.workers.size(), 8u);
  std::set<int> gpus, cores;
  for (const auto& w : p.workers) {
    gpus.insert(w.gpu);
    EXPECT_EQ(w.cuda_visible_devices, t.gpus[w.gpu].uuid);
    EXPECT_EQ(w.numa_node, t.gpus[w.gpu].numa_node);
    EXPECT_EQ(w.cores.size(), 14u);  // 56 cores / 4 GPUs per NUMA node
    EXPECT_EQ(w.cpus.size(), 28u);   // with their hyperthreads
    EXPECT_FALSE(w.shared);
    for (int c : w.cores) {
      EXPECT_TRUE(cores.insert(c).second) << "core " << c << " given twice";
      EXPECT_EQ(cpus.cores[c].numa_node, w.numa_node);
    }
    // NUMA-local: every CPU is in the GPU's affinity list from nvidia-smi.
    for (int pu : w.cpus) {
      EXPECT_TRUE(std::binary_search(t.gpus[w.gpu].cpu_affinity.begin(),
                                     t.gpus[w.gpu].cpu_affinity.end(), pu));
    }
  }
  EXPECT_EQ(gpus.size(), 8u);
  EXPECT_TRUE(p.notes.empty());
  // Worker k is GPU path[k]: local ranks are ring order.
  for (int k = 0; k < 8; ++k) EXPECT_EQ(p.workers[k].gpu, p.ring.path[k]);
}

TEST(Placement, FewerWorkersThanGpusStayOnOneSocket) {
  GpuTopology t = load("pcie_8gpu_topo.txt");
  CpuTopology cpus = make_cpus(2, 24);
  // NUMA affinity is absent in this old output: the home node comes from CPU Affinity.
  Placement p = place_workers(t, cpus, {.workers = 4, .cpus_per_worker = 4});
  std::set<int> gpus;
  for (const auto& w : p.workers) {
    gpus.insert(w.gpu);
    EXPECT_EQ(w.numa_node, 0);
    EXPECT_EQ(w.cuda_visible_devices, std::to_string(w.gpu));  // no UUID known
  }
  EXPECT_EQ(gpus, (std::set<int>{0, 1, 2, 3}));
  Placement two = place_workers(t, cpus, {.workers = 2});
  std::set<int> pair{two.workers[0].gpu, two.workers[1].gpu};
  EXPECT_EQ(pair, (std::set<int>{0, 1}));  // a PIX pair
}

TEST(Placement, SpillsToAnotherNumaNodeWithANote) {
  GpuTopology t = load("hgx_h200_topo.txt");
  CpuTopology cpus = make_cpus(2, 8);  // 4 workers on NUMA node 0 x 3 cores > its 8 cores
  Placement p = place_workers(t, cpus, {.workers = 4, .cpus_per_worker = 3});
  std::set<int> cores;
  for (const auto& w : p.workers) {
    EXPECT_EQ(w.numa_node, 0);
    EXPECT_EQ(w.cores.size(), 3u);
    EXPECT_FALSE(w.shared);
    for (int c : w.cores) EXPECT_TRUE(cores.insert(c).second);
  }
  EXPECT_EQ(cores.size(), 12u);
  ASSERT_FALSE(p.notes.empty());
  EXPECT_NE(p.notes[0].find("outside its NUMA node"), std::string::npos) << p.notes[0];
}

TEST(Placement, CpuWorkersGetDisjointCoresInNumaBlocks) {
  CpuTopology cpus = make_cpus(2, 8);
  Placement p =
      place_workers({}, cpus, {.workers = 4, .cpus_per_worker = 0, .device = Device::kCpu});
  std::set<int> cores;
  for (const auto& w : p.workers) {
    EXPECT_EQ(w.gpu, -1);
    EXPECT_TRUE(w.cuda_visible_devices.empty());
    EXPECT_EQ(w.numa_node, w.local_rank / 2);  // consecutive ranks share a node
    EXPECT_EQ(w.cores.size(), 4u);
    for (int c : w.cores) EXPECT_TRUE(cores.insert(c).second);
  }
  EXPECT_EQ(cores.size(), 16u);
}

TEST(Placement, TooFewCoresAreSharedAndSaidSo) {
  CpuTopology cpus = make_cpus(1, 4, 1);
  Placement p =
      place_workers({}, cpus, {.workers = 6, .cpus_per_worker = 1, .device = Device::kCpu});
  int shared = 0;
  for (const auto& w : p.workers) {
    EXPECT_EQ(w.cores.size(), 1u);
    shared += w.shared;
  }
  EXPECT_GE(shared, 2);
  ASSERT_FALSE(p.notes.empty());
  EXPECT_NE(p.notes.back().find("shares cores"), std::string::npos);
}

TEST(Placement, ImpossibleRequestsAreErrors) {
  CpuTopology cpus = make_cpus(1, 4);
  GpuTopology t = load("two_socket_4gpu_topo.txt");
  expect_error<PlacementError>([&] { place_workers({}, cpus, {.workers = 2}); },
                               {"no GPUs", "CPU workers"});
  expect_error<PlacementError>([&] { place_workers(t, cpus, {.workers = 5}); },
                               {"5 GPU workers", "4 GPUs"});
  expect_error<PlacementError>([&] { place_workers(t, cpus, {.workers = 0}); }, {"at least 1"});
  expect_error<PlacementError>(
      [&] { place_workers(t, cpus, {.workers = 1, .cpus_per_worker = -1}); }, {"got -1"});
  expect_error<PlacementError>([&] { place_workers(t, CpuTopology{}, {.workers = 1}); },
                               {"no CPU cores"});
}

// ---- hwloc ----------------------------------------------------------------------------------

TEST(Hwloc, SyntheticTwoSocketMachine) {
  CpuTopology t = discover_cpu_topology("pack:2 numa:1 core:4 pu:2");
  ASSERT_EQ(t.cores.size(), 8u);
  EXPECT_EQ(t.numa_nodes, (std::vector<int>{0, 1}));
  EXPECT_EQ(t.cores_of(1).size(), 4u);
  for (const auto& c : t.cores) EXPECT_EQ(c.pus.size(), 2u);
  EXPECT_THROW(discover_cpu_topology("bogus:3"), PlacementError);
}

TEST(Hwloc, ThisMachine) {
  CpuTopology t = discover_cpu_topology();
  ASSERT_FALSE(t.cores.empty());
  ASSERT_FALSE(t.numa_nodes.empty());
  // Only CPUs this process may use are listed.
  std::vector<int> allowed = get_cpuset(0);
  for (const auto& c : t.cores)
    for (int pu : c.pus) EXPECT_TRUE(std::binary_search(allowed.begin(), allowed.end(), pu));
  Placement p = place_workers({}, t, {.workers = 2, .device = Device::kCpu});
  EXPECT_EQ(p.workers.size(), 2u);
}

// A daemon bound to some CPUs (taskset, srun --cpu-bind) places within them, not on the
// machine's first cores: a child binds itself to the last allowed CPU and discovers.
TEST(Hwloc, ThisMachineWithinTheAffinityMask) {
  std::vector<int> allowed = get_cpuset(0);
  if (allowed.size() < 2) GTEST_SKIP() << "needs 2 CPUs to bind to one of them";
  const int last = allowed.back();
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(last, &one);
    if (sched_setaffinity(0, sizeof(one), &one) != 0) _exit(2);
    CpuTopology t = discover_cpu_topology();
    if (t.cores.size() != 1 || t.cores[0].pus != std::vector<int>{last}) _exit(3);
    Placement p = place_workers({}, t, {.workers = 1, .device = Device::kCpu});
    if (p.workers.size() != 1 || p.workers[0].cpus != std::vector<int>{last}) _exit(4);
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "2: bind failed, 3: topology not limited to CPU " << last
                                    << ", 4: worker not placed on it";
}

// ---- cpusets --------------------------------------------------------------------------------

TEST(Affinity, AppliesToAChildProcess) {
  std::vector<int> allowed = get_cpuset(0);
  ASSERT_FALSE(allowed.empty());
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    pause();
    _exit(0);
  }
  apply_cpuset(child, {allowed.back()});
  EXPECT_EQ(get_cpuset(child), std::vector<int>{allowed.back()});
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
}

TEST(Affinity, AppliesToThisProcessAndRestores) {
  std::vector<int> allowed = get_cpuset(0);
  apply_cpuset(0, {allowed.front()});
  EXPECT_EQ(get_cpuset(0), std::vector<int>{allowed.front()});
  apply_cpuset(0, allowed);
  EXPECT_EQ(get_cpuset(0), allowed);
}

TEST(Affinity, ErrorsNameThePidAndCpus) {
  expect_error<PlacementError>([] { apply_cpuset(0, {}); }, {"empty cpuset"});
  expect_error<PlacementError>([] { apply_cpuset(0, {100000}); }, {"CPU 100000 is out of range"});
  // A pid that does not exist (pid_max is at most 4194304).
  expect_error<PlacementError>([] { apply_cpuset(4194305, {0}); }, {"4194305"});
  // A CPU that exists in the mask range but not on this machine.
  expect_error<PlacementError>([] { apply_cpuset(0, {8000}); }, {"8000", "sched_setaffinity"});
}

// ---- discovery ------------------------------------------------------------------------------

class FakeSmi : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("ring_fake_smi_" + std::to_string(getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string script(const std::string& body) {
    std::string p = (dir_ / "nvidia-smi").string();
    std::ofstream(p) << "#!/bin/sh\n" << body;
    std::filesystem::permissions(p, std::filesystem::perms::owner_all);
    return p;
  }
  std::filesystem::path dir_;
};

TEST_F(FakeSmi, AbsentMeansNoGpus) {
  GpuDiscovery d = discover_gpus(
      {.nvidia_smi = "ring-no-such-nvidia-smi", .nvml_library = "libring-no-such-nvml.so.1"});
  EXPECT_EQ(d.source, "none");
  EXPECT_TRUE(d.topology.gpus.empty());
  ASSERT_EQ(d.notes.size(), 2u);
  EXPECT_NE(d.notes[1].find("NVML not loaded"), std::string::npos);
}

TEST_F(FakeSmi, ThisMachineHasNoGpusOrFallsBackCleanly) {
  // Whatever this machine has, discovery either finds GPUs or says why not; it never throws
  // for a missing tool or library.
  GpuDiscovery d = discover_gpus();
  if (d.source == "none") {
    EXPECT_TRUE(d.topology.gpus.empty());
  }
}

TEST_F(FakeSmi, ParsesRecordedOutput) {
  std::string smi =
      script("case \"$1 $2\" in\n  'topo -m') cat '" + fixture_path("dgx_h100_topo.txt") +
             "' ;;\n  '--query-gpu=index,uuid,pci.bus_id,memory.total,name "
             "--format=csv,noheader,nounits') cat '" +
             fixture_path("dgx_h100_gpus.csv") + "' ;;\n  *) exit 2 ;;\nesac\n");
  GpuDiscovery d = discover_gpus({.nvidia_smi = smi});
  EXPECT_EQ(d.source, "nvidia-smi");
  ASSERT_EQ(d.topology.gpus.size(), 8u);
  EXPECT_EQ(d.topology.gpus[2].pci_bus_id, "00000000:3A:00.0");
  EXPECT_EQ(d.topology.gpus[2].numa_node, 0);
  EXPECT_EQ(d.topology.gpus[2].uuid, "GPU-6b4f2f1e-8a02-4c39-9d1e-3a7c5b0e0002");
  EXPECT_EQ(d.topology.gpus[2].memory_mib, 81559u);
}

TEST_F(FakeSmi, FailureAndGarbageAreErrors) {
  std::string smi = script(
      "echo \"NVIDIA-SMI has failed because it couldn't communicate with the "
      "NVIDIA driver.\" >&2\nexit 9\n");
  expect_error<PlacementError>([&] { discover_gpus({.nvidia_smi = smi}); },
                               {"exit 9", "couldn't communicate"});
  smi = script("echo 'garbage'\n");
  expect_error<TopologyParseError>([&] { discover_gpus({.nvidia_smi = smi}); },
                                   {"topo -m:1", "no GPU columns"});
}

TEST_F(FakeSmi, HangIsATimeout) {
  std::string smi = script("exec sleep 30\n");
  expect_error<PlacementError>([&] { discover_gpus({.nvidia_smi = smi, .timeout_ms = 200}); },
                               {"did not finish within 200 ms"});
}

}  // namespace
}  // namespace ring::placement
