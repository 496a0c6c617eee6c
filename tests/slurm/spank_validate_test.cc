// Value rules of the SPANK plugin (plugins/slurm/ring_validate.c), without Slurm: what each
// option and plugstack argument accepts, and the message for what it refuses.
#include "plugins/slurm/ring_validate.h"

#include <gtest/gtest.h>

#include <string>

namespace {

struct Result {
  ring_status_t status;
  std::string err;
};

Result job_id(const std::string& s) {
  char err[RING_ERR_MAX] = "";
  auto st = ring_validate_job_id(s.c_str(), err, sizeof(err));
  return {st, err};
}

Result endpoint(const std::string& s, int allow_tcp = 1) {
  char err[RING_ERR_MAX] = "";
  auto st = ring_validate_endpoint(s.c_str(), allow_tcp, err, sizeof(err));
  return {st, err};
}

ring_order_t order_;  // 8 KiB: not on the stack

Result order(const std::string& s) {
  char err[RING_ERR_MAX] = "";
  auto st = ring_parse_order(s.c_str(), &order_, err, sizeof(err));
  return {st, err};
}

std::string formatted() {
  char buf[64];
  EXPECT_EQ(ring_format_order(&order_, buf, sizeof(buf)), 0);
  return buf;
}

TEST(SpankValidate, JobId) {
  for (const std::string& ok : {std::string("a"), std::string("job-1"), std::string("J.2_x"),
                                std::string("0abc"), std::string(64, 'x')})
    EXPECT_EQ(job_id(ok).status, RING_OK) << ok;
  EXPECT_EQ(job_id("").status, RING_E_INVALID);
  EXPECT_EQ(job_id(std::string(65, 'x')).status, RING_E_TOO_LONG);
  auto r = job_id("-x");
  EXPECT_EQ(r.status, RING_E_INVALID);
  EXPECT_NE(r.err.find("must start with a letter or digit"), std::string::npos) << r.err;
  r = job_id("bad id");
  EXPECT_EQ(r.err, "character 4 is not one of [A-Za-z0-9._-]");
  EXPECT_EQ(job_id("a/b").status, RING_E_INVALID);
  EXPECT_EQ(job_id("a\nb").status, RING_E_INVALID);
}

TEST(SpankValidate, OrderWords) {
  for (auto [text, kind] : {std::pair{"topology", RING_ORDER_TOPOLOGY},
                            {"slurm", RING_ORDER_SLURM},
                            {"natural", RING_ORDER_NATURAL}}) {
    ASSERT_EQ(order(text).status, RING_OK) << text;
    EXPECT_EQ(order_.kind, kind);
    EXPECT_EQ(formatted(), text);
  }
  EXPECT_EQ(ring_order_position(&order_, 5), 5);  // natural
  ASSERT_EQ(order("topology").status, RING_OK);
  EXPECT_EQ(ring_order_position(&order_, 0), -1);  // ring-coord decides
  for (const char* bad : {"", "Topology", "topology ", "list", "lists:0", "random"})
    EXPECT_EQ(order(bad).status, RING_E_INVALID) << bad;
  EXPECT_NE(order("bogus").err.find("must be topology, slurm, natural or list:I,J,..."),
            std::string::npos);
}

TEST(SpankValidate, OrderList) {
  ASSERT_EQ(order("list:2,0,1").status, RING_OK);
  EXPECT_EQ(order_.kind, RING_ORDER_LIST);
  EXPECT_EQ(order_.n, 3u);
  EXPECT_EQ(formatted(), "list:2,0,1");
  EXPECT_EQ(ring_order_position(&order_, 2), 0);
  EXPECT_EQ(ring_order_position(&order_, 0), 1);
  EXPECT_EQ(ring_order_position(&order_, 1), 2);
  EXPECT_EQ(ring_order_position(&order_, 3), -1);
  char err[RING_ERR_MAX];
  EXPECT_EQ(ring_check_order_nodes(&order_, 3, err, sizeof(err)), RING_OK);
  EXPECT_EQ(ring_check_order_nodes(&order_, 2, err, sizeof(err)), RING_E_RANGE);
  EXPECT_STREQ(
      err, "list: names 3 node(s) but the step runs on 2: give each node rank 0..1 exactly once");
  ASSERT_EQ(order("list:0").status, RING_OK);

  EXPECT_EQ(order("list:").err,
            "list: names no node: must be topology, slurm, natural or list:I,J,... "
            "(a permutation of the node ranks 0..N-1)");
  EXPECT_EQ(order("list:0,0").err,
            "list: rank 0 appears twice: a list of 2 nodes holds each rank 0..1 exactly once");
  EXPECT_EQ(
      order("list:0,2").err,
      "list: entry 2 (2) is out of range: a list of 2 nodes holds each rank 0..1 exactly once");
  EXPECT_EQ(order("list:0,,1").status, RING_E_INVALID);
  EXPECT_EQ(order("list:0,1,").status, RING_E_INVALID);
  EXPECT_EQ(order("list:01,0").status, RING_E_INVALID);  // leading zero
  EXPECT_EQ(order("list:-1,0").status, RING_E_INVALID);
  EXPECT_EQ(order("list:+1,0").status, RING_E_INVALID);
  EXPECT_EQ(order("list: 0").status, RING_E_INVALID);
  EXPECT_EQ(order("list:4096").status, RING_E_RANGE);
  EXPECT_EQ(order("list:99999").status, RING_E_INVALID);  // more than 4 digits

  // the largest list: every rank 0..4095 once, reversed
  std::string big = "list:";
  for (int i = RING_ORDER_MAX_NODES - 1; i >= 0; i--) big += std::to_string(i) + (i ? "," : "");
  ASSERT_EQ(order(big).status, RING_OK);
  EXPECT_EQ(order_.n, static_cast<uint32_t>(RING_ORDER_MAX_NODES));
  EXPECT_EQ(ring_order_position(&order_, 0), RING_ORDER_MAX_NODES - 1);
  EXPECT_EQ(order(big + ",0").status, RING_E_TOO_LONG);
  EXPECT_EQ(order(std::string(100000, '1')).status, RING_E_TOO_LONG);
}

TEST(SpankValidate, Endpoint) {
  for (const char* ok : {"ipc:///tmp/c.sock", "ipc:///run/ring/coord", "tcp://head:5555",
                         "tcp://10.0.0.1:1", "tcp://node-01.cluster.example:65535",
                         "tcp://[::1]:5555", "tcp://[fe80::1]:80", "tcp://localhost:6000"})
    EXPECT_EQ(endpoint(ok).status, RING_OK) << ok;
  struct Bad {
    const char* text;
    ring_status_t status;
    const char* message;
  };
  for (const Bad& b : std::initializer_list<Bad>{
           {"", RING_E_INVALID, "is empty: must be ipc:///absolute/path or tcp://host:port"},
           {"http://h:1", RING_E_INVALID, "must be ipc:///absolute/path or tcp://host:port"},
           {"ipc://rel", RING_E_INVALID,
            "ipc:// needs an absolute path (ipc:///run/ring/coord.sock)"},
           {"ipc:///tmp/", RING_E_INVALID, "ipc:// path names a directory, not a socket"},
           {"tcp://head", RING_E_INVALID, "tcp:// needs host:port"},
           {"tcp://:5", RING_E_INVALID, "tcp:// needs a host before ':port'"},
           {"tcp://head:0", RING_E_RANGE, "port 0 is outside 1-65535"},
           {"tcp://head:65536", RING_E_RANGE, "port 65536 is outside 1-65535"},
           {"tcp://head:80x", RING_E_INVALID, "port '80x' is not a decimal number"},
           {"tcp://head:080", RING_E_INVALID, "port '080' is not a decimal number"},
           {"tcp://*:5", RING_E_INVALID,
            "host '*' binds, it does not connect: name the coordinator's host"},
           {"tcp://a_b:5", RING_E_INVALID,
            "host 'a_b': character '_' is not allowed (a DNS name, an IPv4 address or [IPv6])"},
           {"tcp://-a:5", RING_E_INVALID, "host '-a' has a label starting with '-'"},
           {"tcp://a..b:5", RING_E_INVALID, "host 'a..b' has an empty label or one ending in '-'"},
           {"tcp://1.2.3.256:5", RING_E_INVALID,
            "host '1.2.3.256' is not an IPv4 address (four numbers 0-255)"},
           {"tcp://1.2.3:5", RING_E_INVALID,
            "host '1.2.3' is not an IPv4 address (four numbers 0-255)"},
           {"tcp://::1:5", RING_E_INVALID, "write an IPv6 host in brackets: tcp://[::1]:port"},
           {"tcp://[::1]5", RING_E_INVALID, "tcp:// needs ':port' after the host"},
           {"tcp://[xyz]:5", RING_E_INVALID, "'xyz' is not an IPv6 address"},
           {"tcp://h:5 ", RING_E_INVALID, "contains a space or control character at position 10"},
       }) {
    auto r = endpoint(b.text);
    EXPECT_EQ(r.status, b.status) << b.text;
    EXPECT_EQ(r.err, b.message) << b.text;
  }
  EXPECT_EQ(endpoint("ipc:///" + std::string(106, 'p')).status, RING_OK);  // 107-byte path
  EXPECT_EQ(endpoint("ipc:///" + std::string(107, 'p')).err,
            "ipc:// path is 108 bytes, a unix socket path holds at most 107");
  EXPECT_EQ(endpoint("tcp://" + std::string(300, 'a') + ":1").status, RING_E_TOO_LONG);
  EXPECT_EQ(endpoint("tcp://" + std::string(64, 'a') + ":1").status, RING_E_TOO_LONG);  // label
  // allow_tcp=0: syntax first, then the cluster's refusal
  auto r = endpoint("tcp://head:5555", 0);
  EXPECT_EQ(r.status, RING_E_REFUSED);
  EXPECT_EQ(
      r.err,
      "tcp:// endpoints are disabled on this cluster (plugstack.conf allow_tcp=0): use ipc://");
  EXPECT_EQ(endpoint("tcp://head:0", 0).status, RING_E_RANGE);
  EXPECT_EQ(endpoint("ipc:///tmp/x", 0).status, RING_OK);
}

TEST(SpankValidate, Bool01) {
  int v = -1;
  char err[RING_ERR_MAX];
  EXPECT_EQ(ring_parse_bool01("0", &v, err, sizeof(err)), RING_OK);
  EXPECT_EQ(v, 0);
  EXPECT_EQ(ring_parse_bool01("1", &v, err, sizeof(err)), RING_OK);
  EXPECT_EQ(v, 1);
  for (const char* bad : {"", "yes", "true", "01", "2", " 1"}) {
    EXPECT_EQ(ring_parse_bool01(bad, &v, err, sizeof(err)), RING_E_INVALID) << bad;
    EXPECT_STREQ(err, "must be 0 or 1");
  }
  EXPECT_EQ(ring_parse_bool01(nullptr, &v, err, sizeof(err)), RING_E_INVALID);
}

TEST(SpankValidate, PickGpu) {
  char gpu[RING_GPU_MAX + 1], err[RING_ERR_MAX];
  int ord = 7;
  auto pick = [&](const char* visible, uint32_t local) {
    auto st = ring_pick_gpu(visible, local, gpu, sizeof(gpu), &ord, err, sizeof(err));
    return st == RING_OK ? std::string(gpu) + "@" + std::to_string(ord)
                         : "error: " + std::string(err);
  };
  EXPECT_EQ(pick(nullptr, 0), "none@-1");
  EXPECT_EQ(pick("", 3), "none@-1");
  EXPECT_EQ(pick("NoDevFiles", 0), "none@-1");
  EXPECT_EQ(pick("3", 0), "3@0");
  EXPECT_EQ(pick("3", 5), "3@0");  // one GPU for the task: whatever its local rank
  EXPECT_EQ(pick("0,1", 0), "0@0");
  EXPECT_EQ(pick("0,1", 1), "1@1");
  EXPECT_EQ(pick("4,5,6,7", 6), "6@2");
  EXPECT_EQ(pick("GPU-8f3e2a1b-0000-1111-2222-333344445555", 0),
            "GPU-8f3e2a1b-0000-1111-2222-333344445555@0");
  EXPECT_EQ(pick("0,,1", 0), "error: CUDA_VISIBLE_DEVICES='0,,1' has an empty or over-long entry");
  EXPECT_EQ(pick("0;1", 0), "error: CUDA_VISIBLE_DEVICES='0;1': entries are GPU indices or UUIDs");
  EXPECT_EQ(pick(std::string(64, '1').c_str(), 0).rfind("error:", 0), 0u);
}

}  // namespace
