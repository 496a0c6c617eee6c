// The control messages between ringd and its workers (common/contract/control.h): every message
// kind round-trips through its line, and every field of every message, taken from the field
// table itself, is refused when missing (if required), of the wrong type or out of range, with an
// error naming the message and the field. A field added to a table is covered without a new test.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "common/contract/control.h"

namespace ring::contract::control {
namespace {

using nlohmann::json;

constexpr int64_t kN = 1000;  // the model size the ringd -> worker side is checked against

// One message of every kind, every field set away from its default.
std::vector<WorkerMessage> worker_samples() {
  return {Hello{.rank = 3, .local = 1, .pid = 4242, .n = kN},
          Mapped{},
          Init{},
          Heartbeat{},
          Bucket{.step = 7, .b = 2},
          Done{.step = 7,
               .loss_sum = 12.5,
               .valid = 100,
               .tokens = 128,
               .step_ms = 3.25,
               .ring_wait_ms = 0.5,
               .bytes_sent = 4096,
               .cursor = json{{"epoch", 1}, {"offset", 99}},
               .stop = true}};
}
std::vector<RingdMessage> ringd_samples() {
  return {Welcome{.shm = "/ringmaster-job-n0-p1-a0",
                  .start_step = 5,
                  .need_init = true,
                  .cursor = json{{"epoch", 0}}},
          Params{.step = 6, .changed = 17, .stop = true}, Stop{.reason = "job cancelled"}};
}

// The sample's JSON for a table entry.
json sample_json(const MessageInfo& m) {
  for (const WorkerMessage& w : worker_samples())
    if (to_json(w)["t"] == m.kind) return to_json(w);
  for (const RingdMessage& r : ringd_samples())
    if (to_json(r)["t"] == m.kind) return to_json(r);
  ADD_FAILURE() << "no sample for message kind " << m.kind;
  return json::object();
}

// Parses j as the side that reads m's direction; returns the ControlError (field, message) or
// ("", "") when it parsed.
std::pair<std::string, std::string> parse_error(const MessageInfo& m, const json& j) {
  try {
    if (m.from_worker)
      (void)worker_from_json(j);
    else
      (void)ringd_from_json(j, kN);
  } catch (const ControlError& e) {
    return {e.field(), e.what()};
  }
  return {"", ""};
}

TEST(ControlTable, CoversEveryMessageKindOnce) {
  std::set<std::string> kinds;
  for (const MessageInfo& m : message_table()) EXPECT_TRUE(kinds.insert(m.kind).second) << m.kind;
  EXPECT_EQ(kinds, (std::set<std::string>{"hello", "mapped", "init", "hb", "bucket", "done",
                                          "welcome", "params", "stop"}));
  EXPECT_EQ(message_table().size(),
            std::variant_size_v<WorkerMessage> + std::variant_size_v<RingdMessage>);
}

TEST(ControlTable, EveryWorkerMessageRoundTrips) {
  for (const WorkerMessage& m : worker_samples()) {
    const std::string line = encode(m);
    ASSERT_EQ(line.back(), '\n');
    const WorkerMessage again = parse_worker_line(line.substr(0, line.size() - 1));
    EXPECT_EQ(again.index(), m.index()) << line;
    EXPECT_EQ(to_json(again), to_json(m)) << line;
    EXPECT_EQ(encode(again), line);
  }
  // Field by field for the two messages with most fields.
  const auto h = std::get<Hello>(
      parse_worker_line(R"({"t":"hello","rank":3,"local":1,"pid":9,"n":5,"proto":1})"));
  EXPECT_EQ(h.rank, 3);
  EXPECT_EQ(h.local, 1);
  EXPECT_EQ(h.pid, 9);
  EXPECT_EQ(h.n, 5);
  EXPECT_EQ(h.proto, kProtocolVersion);
  const std::string done_line = encode(worker_samples().back());
  const Done d = std::get<Done>(parse_worker_line(done_line.substr(0, done_line.size() - 1)));
  EXPECT_EQ(d.step, 7);
  EXPECT_EQ(d.loss_sum, 12.5);
  EXPECT_EQ(d.valid, 100);
  EXPECT_EQ(d.tokens, 128);
  EXPECT_EQ(d.step_ms, 3.25);
  EXPECT_EQ(d.ring_wait_ms, 0.5);
  EXPECT_EQ(d.bytes_sent, 4096);
  EXPECT_EQ(d.cursor, (json{{"epoch", 1}, {"offset", 99}}));
  EXPECT_TRUE(d.stop);
}

TEST(ControlTable, EveryRingdMessageRoundTrips) {
  for (const RingdMessage& m : ringd_samples()) {
    const std::string line = encode(m);
    const RingdMessage again = parse_ringd_line(line.substr(0, line.size() - 1), kN);
    EXPECT_EQ(again.index(), m.index()) << line;
    EXPECT_EQ(to_json(again), to_json(m)) << line;
    EXPECT_EQ(encode(again), line);
  }
  const Welcome w = std::get<Welcome>(ringd_from_json(to_json(ringd_samples()[0]), kN));
  EXPECT_EQ(w.shm, "/ringmaster-job-n0-p1-a0");
  EXPECT_EQ(w.start_step, 5);
  EXPECT_TRUE(w.need_init);
  EXPECT_EQ(w.cursor, (json{{"epoch", 0}}));
  const Params p = std::get<Params>(ringd_from_json(to_json(ringd_samples()[1]), kN));
  EXPECT_EQ(p.step, 6);
  EXPECT_EQ(p.changed, 17);
  EXPECT_TRUE(p.stop);
  EXPECT_EQ(std::get<Stop>(ringd_from_json(to_json(ringd_samples()[2]), kN)).reason,
            "job cancelled");
}

TEST(ControlTable, WriterFollowsTheTable) {
  // A NaN loss travels as null and reads back as NaN; a false `done.stop` is left out; optional
  // fields that are absent read as their defaults.
  Done d;
  d.step = 1;
  d.loss_sum = std::numeric_limits<double>::quiet_NaN();
  const json j = to_json(WorkerMessage{d});
  EXPECT_TRUE(j.at("loss_sum").is_null());
  EXPECT_FALSE(j.contains("stop"));
  EXPECT_TRUE(std::isnan(std::get<Done>(worker_from_json(j)).loss_sum));
  const Done bare = std::get<Done>(parse_worker_line(R"({"t":"done","step":2})"));
  EXPECT_EQ(bare.valid, 0);
  EXPECT_FALSE(bare.stop);
  EXPECT_TRUE(bare.cursor.is_null());
  EXPECT_EQ(to_json(RingdMessage{Params{.step = 1}}),
            (json{{"t", "params"}, {"step", 1}, {"changed", -1}, {"stop", false}}));
  EXPECT_EQ(to_json(WorkerMessage{Hello{.rank = 0, .local = 0, .pid = 1, .n = 2}})["proto"],
            kProtocolVersion);
}

// A value of another JSON type than the field's.
json wrong_type(FieldType t) {
  switch (t) {
    case FieldType::kInteger:
      return 1.5;
    case FieldType::kNumber:
      return "1";
    case FieldType::kBoolean:
      return 1;
    case FieldType::kString:
      return 5;
    case FieldType::kObjectOrNull:
      return json::array({1});
  }
  return nullptr;
}

void expect_named(const MessageInfo& m, const FieldInfo& f, const json& j, const std::string& rule,
                  const std::string& what) {
  const auto [field, message] = parse_error(m, j);
  EXPECT_EQ(field, m.kind + "." + f.key) << what << ": " << j.dump();
  EXPECT_NE(message.find("control message '" + m.kind + "': " + f.key + ": "), std::string::npos)
      << what << ": " << message;
  EXPECT_NE(message.find(rule), std::string::npos) << what << ": " << message;
}

TEST(ControlTable, EveryMalformedFieldIsNamed) {
  int checked = 0;
  for (const MessageInfo& m : message_table()) {
    const json good = sample_json(m);
    ASSERT_EQ(parse_error(m, good).first, "") << good.dump();
    for (const FieldInfo& f : m.fields) {
      SCOPED_TRACE(m.kind + "." + f.key);
      ASSERT_TRUE(good.contains(f.key)) << "the writer leaves out " << f.key << ": " << good.dump();
      // Missing.
      json j = good;
      j.erase(f.key);
      if (f.required) {
        expect_named(m, f, j, "missing", "missing");
      } else {
        EXPECT_EQ(parse_error(m, j).second, "") << "optional field missing: " << j.dump();
      }
      // Wrong type.
      j = good;
      j[f.key] = wrong_type(f.type);
      expect_named(m, f, j, "must be", "wrong type");
      ++checked;
      // Out of range.
      if (f.type == FieldType::kInteger) {
        const int64_t hi = f.bounded_by_n ? kN : f.hi;
        if (f.version) {
          j[f.key] = f.lo + 1;
          expect_named(m, f, j, "speaks control protocol", "other version");
        } else {
          if (f.lo > std::numeric_limits<int64_t>::min()) {
            j[f.key] = f.lo - 1;
            expect_named(m, f, j, "is outside [", "below range");
          }
          if (hi < std::numeric_limits<int64_t>::max()) {
            j[f.key] = hi + 1;
            expect_named(m, f, j, "is outside [", "above range");
          } else {
            j[f.key] = uint64_t{1} << 63;
            expect_named(m, f, j, "out of range", "above int64");
          }
        }
      }
      if (f.type == FieldType::kNumber) {
        if (f.non_negative) {
          j[f.key] = -1.0;
          expect_named(m, f, j, "must not be negative", "negative");
        }
        if (!f.null_is_nan) {
          j[f.key] = std::numeric_limits<double>::infinity();
          expect_named(m, f, j, "must be finite", "infinite");
          j[f.key] = nullptr;
          expect_named(m, f, j, "must be a number", "null");
        }
      }
    }
  }
  EXPECT_GE(checked, 20);  // every field of every message went through the loop
}

TEST(ControlTable, StringRulesAndKinds) {
  const MessageInfo* welcome = nullptr;
  for (const MessageInfo& m : message_table())
    if (m.kind == "welcome") welcome = &m;
  ASSERT_NE(welcome, nullptr);
  for (const char* bad : {"no-slash", "/", "/a/b", "/.", "/has space"}) {
    json j = sample_json(*welcome);
    j["shm"] = bad;
    expect_named(*welcome, welcome->fields[0], j, "must be a shared-memory name", bad);
  }
  try {
    (void)parse_worker_line(R"({"t":"welcome"})");  // a ringd message on the worker's side
    ADD_FAILURE() << "accepted";
  } catch (const ControlError& e) {
    EXPECT_EQ(e.field(), "t");
    EXPECT_NE(std::string(e.what()).find("unknown kind 'welcome'"), std::string::npos);
  }
  EXPECT_THROW((void)parse_worker_line("[1]"), ControlError);
  EXPECT_THROW((void)parse_worker_line(R"({"t":3})"), ControlError);
  EXPECT_THROW((void)parse_ringd_line("not json", kN), ControlError);
}

TEST(ControlTable, HelloOfAnotherProtocolVersionNamesBoth) {
  try {
    (void)parse_worker_line(R"({"t":"hello","rank":0,"local":0,"pid":7,"n":9,"proto":2})");
    ADD_FAILURE() << "accepted a hello of protocol 2";
  } catch (const ControlError& e) {
    EXPECT_EQ(e.field(), "hello.proto");
    EXPECT_NE(std::string(e.what()).find("the worker speaks control protocol 2, ringd speaks " +
                                         std::to_string(kProtocolVersion)),
              std::string::npos)
        << e.what();
  }
  try {  // a worker from before the version existed
    (void)parse_worker_line(R"({"t":"hello","rank":0,"local":0,"pid":7,"n":9})");
    ADD_FAILURE() << "accepted a hello without proto";
  } catch (const ControlError& e) {
    EXPECT_EQ(e.field(), "hello.proto");
  }
}

}  // namespace
}  // namespace ring::contract::control
