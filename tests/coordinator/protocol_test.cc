// Every message type round-trips; malformed messages are refused with the field named.
#include "common/protocol/protocol.h"

#include <gtest/gtest.h>

#include <string>

namespace proto = ring::protocol;
using nlohmann::json;

namespace {

proto::Register sample_register() {
  proto::Register r;
  r.node = "node-01.cluster";
  r.gpus = {{0, "H100", 81559}, {1, "H100", 81559}};
  r.topology = {2, 128, 1048576, "leaf3", "2 sockets"};
  r.ringd_version = "0.1.0";
  r.jobs = {{7, 2, 140}};
  return r;
}

proto::Event died() {
  proto::Event e;
  e.node = "n0";
  e.kind = proto::EventKind::kWorkerDied;
  e.job = 3;
  e.attempt = 1;
  e.rank = 2;
  e.pid = 4242;
  e.signal = 9;
  e.last_log = {"step 10 loss 3.2", "CUDA error: out of memory"};
  return e;
}

// Encodes, parses, re-encodes: the two encodings must be identical.
void round_trip(const proto::Message& m) {
  std::string a = proto::encode(m);
  proto::Message back = proto::parse(a);
  EXPECT_EQ(std::string(proto::type_name(back)), proto::type_name(m));
  EXPECT_EQ(proto::encode(back), a) << a;
  json j = json::parse(a);
  EXPECT_EQ(j["v"], proto::kVersion);
  EXPECT_EQ(j["type"], proto::type_name(m));
}

// Expects a ProtocolError with this code and field, and the field in the message.
void expect_error(const std::string& wire, const std::string& code, const std::string& field) {
  try {
    proto::parse(wire);
    FAIL() << "accepted: " << wire.substr(0, 200);
  } catch (const proto::ProtocolError& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    EXPECT_EQ(e.field(), field) << e.what();
    if (!field.empty()) {
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
    }
  }
}

json base(const proto::Message& m) {
  return proto::to_json(m);
}

}  // namespace

TEST(Protocol, EveryMessageRoundTrips) {
  round_trip(sample_register());
  round_trip(proto::Heartbeat{"n0", 17, {{1, 1, 5}}});
  round_trip(proto::StepReport{"n0", 1, 1, 10, 2.5, 12345.5, 0.8, 0.1, {}});
  round_trip(proto::StepReport{"n0", 1, 1, 10, 2.5, 12345.5, 0.8, 0.1,
                               {{0, 0.8, 0.01, 0.5, 0.2, 0.09, 1 << 20}, {1, 0.7, 0, 0, 0, 0, 0}}});
  round_trip(died());
  proto::Event ck;
  ck.node = "n0";
  ck.kind = proto::EventKind::kCheckpointSaved;
  ck.job = 1;
  ck.attempt = 1;
  ck.step = 50;
  ck.path = "/ckpt/step-50";
  ck.bytes = 1 << 30;
  ck.complete = true;
  round_trip(ck);
  proto::Event started;
  started.node = "n0";
  started.kind = proto::EventKind::kWorkerStarted;
  started.job = 1;
  started.attempt = 1;
  started.rank = 0;
  started.pid = 99;
  round_trip(started);
  round_trip(proto::CommandAck{"n0", 5, false, "no such job"});
  round_trip(proto::Registered{"n0", 1.0, 10.0, {{1, 2, 50, "starting"}}});
  round_trip(proto::Command{3, proto::CommandKind::kRollBack, 1, 2, 50, "node lost"});
  round_trip(proto::Command{4, proto::CommandKind::kCheckpointNow, 1, 2, 0, ""});
  round_trip(proto::SubmitRequest{1, "job:\n  name: x\n", "x", "", std::nullopt});
  round_trip(proto::SubmitRequest{1, "job:\n  name: x\n", "", "/scratch/jobs/x", 12});
  round_trip(proto::StatusRequest{2, std::nullopt});
  round_trip(proto::StatusRequest{2, 5});
  round_trip(proto::EventsRequest{3, 5, 10, 50});
  round_trip(proto::CancelRequest{4, 5});
  round_trip(proto::RestartRequest{5, 5, 100, std::nullopt});
  round_trip(proto::RestartRequest{6, 5, std::nullopt, true});
  round_trip(proto::CheckpointRequest{6, 5});
  round_trip(proto::NodesRequest{7});
  round_trip(proto::SubmitReply{1, 5, "x", "sha256:ab", "pending"});
  proto::JobInfo ji;
  ji.job = 5;
  ji.name = "x";
  ji.owner_uid = 1000;
  ji.owner = "alice";
  ji.state = "running";
  ji.spec_hash = "sha256:ab";
  ji.loss = 2.0;
  ji.nodes = {"n0", "n1"};
  ji.created_at = 1.7e9;
  ji.updated_at = 1.7e9;
  round_trip(proto::StatusReply{2, {ji}});
  proto::EventRecord er;
  er.id = 9;
  er.time = 1.7e9;
  er.job = 5;
  er.kind = "state";
  er.data = {{"from", "pending"}};
  round_trip(proto::EventsReply{3, {er}});
  round_trip(proto::NodesReply{7, {{"n0", "up", 0, 1.7e9, 8, "0.1.0", {5}}}});
  round_trip(proto::OkReply{4, 5, "cancelling", "cancelled by root"});
  round_trip(proto::ErrorReply{4, "not_found", "job 5 does not exist", "job"});
}

TEST(Protocol, SizeIsCheckedBeforeParsing) {
  std::string big(proto::kMaxMessageBytes + 1, ' ');  // not even JSON: size comes first
  expect_error(big, "too_large", "");
  json j = base(proto::SubmitRequest{1, std::string(proto::kMaxSpecBytes + 1, 'a'), "", "", {}});
  expect_error(j.dump(), "bad_field", "submit.spec");
  // The job directory must be absolute: daemons on other nodes resolve it the same way.
  json rel = base(proto::SubmitRequest{1, "job:\n  name: x\n", "", "jobs/x", {}});
  expect_error(rel.dump(), "bad_field", "submit.job_dir");
}

TEST(Protocol, NotJsonOrTooDeep) {
  expect_error("", "bad_json", "");
  expect_error("{\"v\":1,", "bad_json", "");
  expect_error("[1,2]", "bad_json", "");
  expect_error(std::string(100, '[') + std::string(100, ']'), "bad_json", "");
  // Brackets inside strings do not count as nesting.
  json hb = base(proto::Heartbeat{"n0", 1, {}});
  proto::SubmitRequest s{1, std::string(200, '['), "", "", {}};
  EXPECT_NO_THROW(proto::parse(proto::encode(s)));
  (void)hb;
}

TEST(Protocol, VersionAndType) {
  json j = base(proto::Heartbeat{"n0", 1, {}});
  j.erase("v");
  expect_error(j.dump(), "bad_field", "v");
  j["v"] = "1";
  expect_error(j.dump(), "bad_field", "v");
  j["v"] = 2;
  expect_error(j.dump(), "unsupported_version", "v");
  j["v"] = 1;
  j["type"] = "reboot";
  expect_error(j.dump(), "unknown_type", "type");
  j.erase("type");
  expect_error(j.dump(), "bad_field", "type");
}

TEST(Protocol, FieldsAreValidated) {
  struct Case {
    json msg;
    const char* field;
  };
  json reg = base(sample_register());
  json step = base(proto::StepReport{"n0", 1, 1, 10, 2.5, 100, 0.8, 0.1, {}});
  json ev = base(died());
  std::vector<Case> cases;
  auto with = [](json j, const std::string& ptr, json v) {
    j[json::json_pointer(ptr)] = v;
    return j;
  };
  auto without = [](json j, const std::string& key) {
    j.erase(key);
    return j;
  };
  cases.push_back({without(reg, "node"), "register.node"});
  cases.push_back({with(reg, "/node", ""), "register.node"});
  cases.push_back({with(reg, "/node", "bad name!"), "register.node"});
  cases.push_back({with(reg, "/node", 5), "register.node"});
  cases.push_back({with(reg, "/gpus/1/memory_mib", -5), "register.gpus[1].memory_mib"});
  cases.push_back({with(reg, "/gpus/0/index", 1.5), "register.gpus[0].index"});
  cases.push_back({with(reg, "/gpus", "8"), "register.gpus"});
  cases.push_back({with(reg, "/topology/numa_nodes", 0), "register.topology.numa_nodes"});
  cases.push_back({with(reg, "/topology/extra", 1), "register.topology.extra"});
  cases.push_back({without(reg, "topology"), "register.topology"});
  cases.push_back({with(reg, "/jobs/0/job", 0), "register.jobs[0].job"});
  cases.push_back({with(reg, "/surprise", true), "register.surprise"});
  cases.push_back({with(step, "/loss", "nan"), "step.loss"});
  cases.push_back({with(step, "/tokens_per_s", -1), "step.tokens_per_s"});
  cases.push_back({with(step, "/attempt", 0), "step.attempt"});
  cases.push_back({with(step, "/step", 18446744073709551615ull), "step.step"});
  cases.push_back({without(step, "comm_time_s"), "step.comm_time_s"});
  cases.push_back({with(ev, "/kind", "exploded"), "event.kind"});
  cases.push_back({with(ev, "/signal", 65), "event.signal"});
  cases.push_back({with(ev, "/exit_code", 1), "event.signal"});  // both signal and exit code
  cases.push_back({without(ev, "rank"), "event.rank"});
  cases.push_back({with(ev, "/last_log", json::array({1})), "event.last_log[0]"});
  cases.push_back({with(ev, "/last_log", std::vector<std::string>(51, "x")), "event.last_log"});
  cases.push_back({with(ev, "/last_log/0", std::string(600, 'x')), "event.last_log[0]"});
  cases.push_back({with(base(proto::CommandAck{"n0", 5, true, ""}), "/ok", 1), "command_ack.ok"});
  cases.push_back(
      {with(base(proto::Command{3, proto::CommandKind::kStop, 1, 1, 0, ""}), "/command", "reboot"),
       "command.command"});
  cases.push_back({with(base(proto::EventsRequest{3, 5, 0, 50}), "/limit", 5000), "events.limit"});
  cases.push_back({without(base(proto::CancelRequest{4, 5}), "job"), "cancel.job"});
  cases.push_back({with(base(proto::CancelRequest{4, 5}), "/id", -1), "cancel.id"});
  cases.push_back(
      {with(base(proto::RestartRequest{5, 5, 1, std::nullopt}), "/from_step", -1), "restart.from_step"});
  cases.push_back({with(base(proto::StatusRequest{2, 5}), "/job", "5"), "status.job"});
  cases.push_back({without(base(proto::ErrorReply{1, "x", "y", ""}), "code"), "error.code"});
  for (const auto& c : cases) {
    SCOPED_TRACE(c.field);
    expect_error(c.msg.dump(), "bad_field", c.field);
  }
  // Per-kind requirements of events.
  proto::Event ck;
  ck.node = "n0";
  ck.kind = proto::EventKind::kCheckpointSaved;
  ck.job = 1;
  ck.step = 5;
  expect_error(proto::encode(ck), "bad_field", "event.path");
}

TEST(Protocol, ErrorsReadable) {
  try {
    json j = base(proto::StepReport{"n0", 1, 1, 10, 2.5, 100, 0.8, 0.1, {}});
    j["tokens_per_s"] = -3;
    proto::parse(j.dump());
  } catch (const proto::ProtocolError& e) {
    EXPECT_STREQ(e.what(), "field 'step.tokens_per_s': -3 is out of range [0, 1e+15]");
  }
  EXPECT_EQ(proto::peek_request_id(R"({"v":1,"type":"cancel","id":42,"job":"x"})"), 42);
  EXPECT_EQ(proto::peek_request_id("not json"), 0);
}

TEST(Protocol, NodeNames) {
  EXPECT_TRUE(proto::valid_node_name("gpu-node_01.example"));
  EXPECT_FALSE(proto::valid_node_name("-lead"));
  EXPECT_FALSE(proto::valid_node_name("a b"));
  EXPECT_FALSE(proto::valid_node_name(std::string(254, 'a')));
}

// Random mutations of valid messages never crash the parser: they parse or throw ProtocolError.
TEST(Protocol, MutationsNeverCrash) {
  std::vector<std::string> seeds = {proto::encode(sample_register()), proto::encode(died()),
                                    proto::encode(proto::StepReport{"n0", 1, 1, 1, 1, 1, 1, 1, {}})};
  uint64_t x = 88172645463325252ull;
  auto rnd = [&] {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return x;
  };
  int parsed = 0, refused = 0;
  for (int i = 0; i < 20000; ++i) {
    std::string s = seeds[rnd() % seeds.size()];
    int edits = 1 + rnd() % 4;
    for (int k = 0; k < edits && !s.empty(); ++k) {
      size_t pos = rnd() % s.size();
      switch (rnd() % 3) {
        case 0:
          s[pos] = static_cast<char>(rnd());
          break;
        case 1:
          s.erase(pos, 1 + rnd() % 8);
          break;
        case 2:
          s.insert(pos, 1, "{}[]\",:0-e.\\"[rnd() % 12]);
          break;
      }
    }
    try {
      proto::parse(s);
      ++parsed;
    } catch (const proto::ProtocolError&) {
      ++refused;
    }
  }
  EXPECT_EQ(parsed + refused, 20000);
  EXPECT_GT(refused, 10000);
}

// Fields added later are optional: messages of a peer that predates them read as before (the
// field absent), and the new fields are checked like any other.
TEST(Protocol, MessagesWithoutTheLaterOptionalFieldsStillParse) {
  using namespace ring::protocol;
  auto step = std::get<StepReport>(parse(
      R"({"v":1,"type":"step","node":"n0","job":1,"attempt":1,"step":2,"loss":1,)"
      R"("tokens_per_s":1,"step_time_s":1,"comm_time_s":0,"ranks":[{"rank":0,"step_time_s":1,)"
      R"("data_s":0,"compute_s":1,"wait_s":0,"comm_s":0,"hop_bytes":0}]})"));
  ASSERT_EQ(step.ranks.size(), 1u);
  EXPECT_FALSE(step.ranks[0].prev);
  auto ev = std::get<Event>(
      parse(R"({"v":1,"type":"event","node":"n0","kind":"checkpoint_saved","job":1,"attempt":1,)"
            R"("step":4,"path":"/ck/4","bytes":10,"complete":true})"));
  EXPECT_FALSE(ev.seconds);
  auto req = std::get<StepsRequest>(parse(R"({"v":1,"type":"steps","id":1,"job":1})"));
  EXPECT_FALSE(req.ranks);
  auto rep =
      std::get<StepsReply>(parse(R"({"v":1,"type":"steps_reply","id":1,"job":1,"steps":[]})"));
  EXPECT_TRUE(rep.ranks.empty());
  // Written only when set: an old reader sees the same bytes as before.
  EXPECT_EQ(encode(step).find("prev"), std::string::npos);
  EXPECT_EQ(encode(ev).find("seconds"), std::string::npos);
  EXPECT_EQ(encode(req).find("ranks"), std::string::npos);
  EXPECT_EQ(encode(rep).find("ranks"), std::string::npos);
  // The new fields are checked.
  try {
    parse(R"({"v":1,"type":"event","node":"n0","kind":"checkpoint_saved","job":1,"attempt":1,)"
          R"("step":4,"path":"/ck/4","bytes":10,"complete":true,"seconds":-1})");
    ADD_FAILURE() << "negative seconds accepted";
  } catch (const ProtocolError& e) {
    EXPECT_EQ(e.field(), "event.seconds");
  }
}
