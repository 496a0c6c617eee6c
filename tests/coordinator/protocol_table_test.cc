// The protocol's field tables (common/protocol/protocol.cc, fields.h): every message type makes a
// round trip with every field set, and every malformed top-level field - missing when required,
// of the wrong JSON type, out of range, unknown - is refused with an error naming the message and
// the field ("step.loss"). The malformed cases are generated from the table itself, so a new
// message or field is covered without editing this file.
#include <gtest/gtest.h>

#include <set>

#include <nlohmann/json.hpp>

#include "common/protocol/fields.h"
#include "common/protocol/protocol.h"

namespace p = ring::protocol;
using nlohmann::json;

namespace {

// One message of every type, every field set to a value other than its default.
const char* const kSamples[] = {
    R"({"type":"register","node":"n-0","gpus":[{"index":1,"model":"H100","memory_mib":81920}],
        "topology":{"numa_nodes":2,"cpus":64,"host_memory_mib":512000,"leaf_switch":"s1",
                    "summary":"2x CPU"},"ringd_version":"0.1.0",
        "jobs":[{"job":7,"attempt":2,"step":30}]})",
    R"({"type":"heartbeat","node":"n-0","seq":9,"jobs":[{"job":7,"attempt":2,"step":31}]})",
    R"({"type":"step","node":"n-0","job":7,"attempt":2,"step":31,"loss":0.30000000000000004,
        "tokens_per_s":1234.5,"step_time_s":0.25,"comm_time_s":0.125,
        "ranks":[{"rank":1,"step_time_s":0.25,"data_s":0.01,"compute_s":0.125,"wait_s":0.0625,
                  "comm_s":0.03125,"hop_bytes":65536,"prev":0}]})",
    R"({"type":"event","node":"n-0","kind":"worker_exited","job":7,"attempt":2,"rank":3,"pid":4242,
        "signal":9,"exit_code":1,"step":31,"bytes":100,"path":"/ck/31","complete":false,
        "last_log":["a","b"],"message":"oom","seconds":1.5,"steps":3,"behind_s":0.25,"deadline_s":30,
        "missing":[2],"deleted":[4],"resumable":true,"waiting":[{"rank":1,"where":"ring recv from rank 2, layer 0 hop 0"}]})",
    R"({"type":"command_ack","node":"n-0","cmd":5,"ok":false,"error":"busy"})",
    R"({"type":"registered","node":"n-0","heartbeat_interval_s":0.5,"heartbeat_timeout_s":5,
        "jobs":[{"job":7,"attempt":2,"resume_step":20,"state":"running"}]})",
    R"({"type":"command","cmd":5,"command":"roll_back","job":7,"attempt":3,"step":20,
        "reason":"node lost"})",
    R"({"type":"submit","id":1,"spec":"job: {}","name":"tiny","job_dir":"/tmp/j","steps":5})",
    R"({"type":"status","id":2,"job":7})",
    R"({"type":"events","id":3,"job":7,"after":10,"limit":50})",
    R"({"type":"cancel","id":4,"job":7})",
    R"({"type":"restart","id":5,"job":7,"from_step":20,"requeue":false})",
    R"({"type":"checkpoint","id":6,"job":7})",
    R"({"type":"nodes","id":7})",
    R"({"type":"submit_reply","id":1,"job":7,"name":"tiny","spec_hash":"sha256:ab",
        "state":"pending"})",
    R"({"type":"status_reply","id":2,"jobs":[{"job":7,"name":"tiny","owner_uid":1000,
        "owner":"ada","state":"running","state_reason":"first step","spec_hash":"sha256:ab",
        "attempt":2,"restarts":1,"max_restarts":3,"step":31,"total_steps":100,
        "loss":2.5,"tokens_per_s":1000.5,"last_checkpoint_step":20,"slurm_job_id":"123_4",
        "nodes":["n-0","n-1"],"ring_order":["n-1","n-0"],"excluded_nodes":["n-2"],"job_dir":"/tmp/j",
        "checkpoint_dir":"/tmp/j/ck","created_at":1700000000.5,"updated_at":1700000100.25}]})",
    R"({"type":"events_reply","id":3,"events":[{"id":11,"time":1700000000.5,"job":7,
        "attempt":2,"node":"n-0","kind":"worker_died","data":{"rank":3}}]})",
    R"({"type":"nodes_reply","id":7,"nodes":[{"name":"n-0","state":"up","uid":1000,
        "last_heartbeat":1700000000.5,"gpus":8,"ringd_version":"0.1.0","jobs":[7,8]}]})",
    R"({"type":"ok","id":4,"job":7,"state":"cancelling","message":"cancelled by ada",
        "requeue_without":["n-2"]})",
    R"({"type":"error","id":4,"code":"not_found","message":"job 9 does not exist",
        "field":"job"})",
    R"({"type":"slurm_job","id":8,"job":7,"event":"started","slurm_job_id":"123_4",
        "restarts":2,"nodes":"n[0-1]","message":"requeued","unhealthy_nodes":["n-2"]})",
    R"({"type":"steps","id":9,"job":7,"after":3,"limit":20,"ranks":true})",
    R"({"type":"steps_reply","id":9,"job":7,"steps":[{"attempt":2,"step":31,"node":"n-0",
        "loss":0.30000000000000004,"tokens_per_s":1234.5,"step_time_s":0.25,
        "comm_time_s":0.125,"time":1700000000.5}],
        "ranks":[{"attempt":2,"step":31,"node":"n-0","rank":1,"step_time_s":0.25,"data_s":0.01,
                  "compute_s":0.125,"wait_s":0.0625,"comm_s":0.03125,"hop_bytes":65536,
                  "time":1700000000.5}]})",
};

json sample(const std::string& type) {
  for (const char* s : kSamples) {
    json j = json::parse(s);
    if (j["type"] == type) {
      j["v"] = p::kVersion;
      return j;
    }
  }
  ADD_FAILURE() << "no sample of " << type;
  return json::object();
}

// The error parsing `j`, or "" when it parses.
std::string refusal(const json& j, std::string* field = nullptr) {
  try {
    p::parse(j.dump());
  } catch (const p::ProtocolError& e) {
    if (field) *field = e.field();
    EXPECT_EQ(e.code(), p::code::kBadField) << e.what();
    return e.what();
  }
  return "";
}

// A JSON value of the wrong type for a field of this kind.
json wrong_type(const std::string& kind) {
  if (kind == "string" || kind == "node" || kind == "enum") return 12;
  if (kind == "boolean") return "yes";
  if (kind == "object") return json::array({1});
  return "12";  // integer, number, strings, integers, objects
}

void expect_refused(const json& j, const std::string& type, const std::string& key,
                    const std::string& why) {
  std::string field;
  std::string what = refusal(j, &field);
  EXPECT_EQ(field, type + "." + key) << why << ": " << j.dump() << " -> " << what;
  EXPECT_NE(what.find("field '" + type + "." + key + "'"), std::string::npos)
      << why << ": " << what;
}

}  // namespace

TEST(ProtocolTable, EveryMessageTypeHasASampleAndMakesARoundTrip) {
  auto types = p::message_types();
  ASSERT_EQ(types.size(), std::variant_size_v<p::Message>);
  ASSERT_EQ(std::size(kSamples), types.size());
  std::set<std::string> seen;
  for (const auto& type : types) {
    json j = sample(type);
    p::Message m = p::parse(j.dump());
    EXPECT_EQ(p::type_name(m), type);
    seen.insert(type);
    // struct -> wire -> struct -> wire: the same JSON, every field kept.
    EXPECT_EQ(p::to_json(m), j) << type;
    p::Message again = p::parse(p::encode(m));
    EXPECT_EQ(p::encode(again), p::encode(m)) << type;
    // Every field the table lists is in the sample (so the round trip covered it).
    for (const auto& rule : p::field_rules(type))
      EXPECT_TRUE(j.contains(rule.key)) << type << "." << rule.key << " missing from its sample";
  }
  EXPECT_EQ(seen.size(), types.size());
}

TEST(ProtocolTable, EveryMalformedFieldIsRefusedNamingMessageAndField) {
  int cases = 0;
  for (const auto& type : p::message_types()) {
    const json good = sample(type);
    ASSERT_EQ(refusal(good), "") << type;
    // Unknown field.
    json unknown = good;
    unknown["no_such_field"] = 1;
    expect_refused(unknown, type, "no_such_field", "unknown");
    ++cases;
    for (const auto& rule : p::field_rules(type)) {
      const std::string& key = rule.key;
      // Missing: refused when required, accepted when optional.
      json missing = good;
      missing.erase(key);
      if (rule.required) {
        expect_refused(missing, type, key, "missing");
        EXPECT_NE(refusal(missing).find("required field is missing"), std::string::npos);
      } else if (type != "event" && type != "slurm_job") {
        // (event and slurm_job have fields required per kind or per event: below.)
        EXPECT_EQ(refusal(missing), "") << type << "." << key << " is optional";
      }
      ++cases;
      // Wrong JSON type.
      json wrong = good;
      wrong[key] = wrong_type(rule.kind);
      expect_refused(wrong, type, key, "wrong type");
      EXPECT_NE(refusal(wrong).find("expected "), std::string::npos) << type << "." << key;
      ++cases;
      // Out of range.
      if (rule.kind == "integer" && rule.hi && *rule.hi < 9.2e18) {
        json over = good;
        over[key] = static_cast<int64_t>(*rule.hi) + 1;
        expect_refused(over, type, key, "above range");
        EXPECT_NE(refusal(over).find("out of range"), std::string::npos);
        ++cases;
      }
      if (rule.kind == "integer" && rule.lo && *rule.lo > -9.2e18) {
        json under = good;
        under[key] = static_cast<int64_t>(*rule.lo) - 1;
        expect_refused(under, type, key, "below range");
        ++cases;
      }
      if (rule.kind == "number" && rule.hi) {
        json over = good;
        over[key] = *rule.hi * 2 + 1;
        expect_refused(over, type, key, "above range");
        ++cases;
      }
      if ((rule.kind == "string" || rule.kind == "node") && rule.hi) {
        json too_long = good;
        too_long[key] = std::string(static_cast<size_t>(*rule.hi) + 1, 'a');
        expect_refused(too_long, type, key, "too long");
        ++cases;
      }
      if (rule.kind == "string" && rule.required && rule.lo && *rule.lo >= 1) {
        json empty = good;
        empty[key] = "";
        expect_refused(empty, type, key, "empty");
        ++cases;
      }
      if (rule.kind == "enum") {
        json other = good;
        other[key] = "no_such_value";
        expect_refused(other, type, key, "not a choice");
        EXPECT_NE(refusal(other).find(rule.choices.at(0)), std::string::npos);
        ++cases;
      }
      if (rule.kind == "node") {
        json bad = good;
        bad[key] = "-bad name";
        expect_refused(bad, type, key, "not a node name");
        ++cases;
      }
    }
  }
  // Rules across fields: an event kind's required fields, a Slurm job id.
  json ev = sample("event");
  ev["kind"] = "worker_died";
  ev.erase("signal");
  ev.erase("exit_code");
  expect_refused(ev, "event", "signal", "worker_died without signal or exit code");
  json saved = sample("event");
  saved["kind"] = "checkpoint_saved";
  saved.erase("bytes");
  expect_refused(saved, "event", "bytes", "checkpoint_saved without bytes");
  // The observability kinds: a sample of each parses, and each refuses its missing field.
  json straggler = sample("event");
  straggler["kind"] = "straggler";
  EXPECT_EQ(refusal(straggler), "");
  straggler.erase("behind_s");
  expect_refused(straggler, "event", "behind_s", "straggler without behind_s");
  json cleared = sample("event");
  cleared["kind"] = "straggler_cleared";
  EXPECT_EQ(refusal(cleared), "");
  cleared.erase("rank");
  expect_refused(cleared, "event", "rank", "straggler_cleared without rank");
  json hang = sample("event");
  hang["kind"] = "hang";
  EXPECT_EQ(refusal(hang), "");
  hang.erase("deadline_s");
  expect_refused(hang, "event", "deadline_s", "hang without deadline_s");
  json bad_missing = sample("event");
  bad_missing["kind"] = "hang";
  bad_missing["missing"] = json::array({-1});
  expect_refused(bad_missing, "event", "missing", "hang with a negative rank");
  json bad_where = sample("event");
  bad_where["waiting"][0]["where"] = "";
  expect_refused(bad_where, "event", "waiting[0].where", "empty where");
  json sj = sample("slurm_job");
  sj["slurm_job_id"] = "12x";
  expect_refused(sj, "slurm_job", "slurm_job_id", "not a Slurm job id");
  json sub = sample("submit");
  sub["job_dir"] = "relative/dir";
  expect_refused(sub, "submit", "job_dir", "relative job dir");
  // Nested objects name their path.
  json reg = sample("register");
  reg["gpus"][0]["memory_mib"] = -1;
  expect_refused(reg, "register", "gpus[0].memory_mib", "nested out of range");
  EXPECT_GT(cases, 200);
}
