// The loader against plugins that follow or break transport.h's versioning rule: tiny plugins
// built from abi_plugins/abi_test_plugin.c, one per case, loaded by path.
#include <cstddef>
#include <string>

#include <gtest/gtest.h>

#include "plugins/transport/loader.h"

namespace ring::transport {
namespace {

// Loads `path` and returns the error message, or "" when it loaded.
std::string load_error(const std::string& path, ring_transport_status_t* status = nullptr) {
  try {
    TransportPlugin::load(path);
    return "";
  } catch (const TransportError& e) {
    if (status) *status = e.status();
    return e.what();
  }
}

void expect_refused(const std::string& path, const std::string& why) {
  ring_transport_status_t status = RING_TRANSPORT_OK;
  std::string msg = load_error(path, &status);
  ASSERT_NE(msg, "") << path << " loaded";
  EXPECT_EQ(status, RING_TRANSPORT_ERR_INTERNAL);
  EXPECT_NE(msg.find(path), std::string::npos) << "names the file: " << msg;
  EXPECT_NE(msg.find(why), std::string::npos) << "says what is wrong: " << msg;
  EXPECT_NE(msg.find("rule: a plugin exports ring_transport_plugin, a ring_transport_t with this "
                     "loader's abi_version"),
            std::string::npos)
      << "states the rule: " << msg;
}

TEST(TransportAbi, CorrectPluginLoads) {
  TransportPlugin p = TransportPlugin::load(RING_ABI_PLUGIN_GOOD);
  EXPECT_EQ(p.name(), "abi_test");
  EXPECT_EQ(p->abi_version, RING_TRANSPORT_ABI_VERSION);
  EXPECT_EQ(p->struct_size, sizeof(ring_transport_t));
  EXPECT_EQ(p.path(), RING_ABI_PLUGIN_GOOD);
  char reason[8] = "x";
  EXPECT_EQ(p->probe(reason, sizeof reason), RING_TRANSPORT_OK);
}

// A plugin built against a later header (one member appended) loads; the loader reads only the
// members it knows.
TEST(TransportAbi, NewerPluginWithALargerStructLoads) {
  TransportPlugin p = TransportPlugin::load(RING_ABI_PLUGIN_NEWER);
  EXPECT_GT(p->struct_size, sizeof(ring_transport_t));
  EXPECT_EQ(p.name(), "abi_test");
  ASSERT_NE(p->last_error, nullptr);
  EXPECT_STREQ(p->last_error(nullptr), "");
}

TEST(TransportAbi, SmallerStructIsRefused) {
  expect_refused(RING_ABI_PLUGIN_SMALL,
                 "less than the " + std::to_string(RING_TRANSPORT_MIN_SIZE) + " bytes");
}

TEST(TransportAbi, OtherAbiVersionIsRefused) {
  expect_refused(RING_ABI_PLUGIN_VERSION,
                 "built for transport ABI version " +
                     std::to_string(RING_TRANSPORT_ABI_VERSION + 98) + ", this program speaks " +
                     "version " + std::to_string(RING_TRANSPORT_ABI_VERSION));
}

TEST(TransportAbi, MissingSymbolIsRefused) {
  expect_refused(RING_ABI_PLUGIN_NO_SYMBOL,
                 "does not export ring_transport_plugin (it exports ring_transport_v1");
}

TEST(TransportAbi, NullRequiredMemberIsRefused) {
  expect_refused(RING_ABI_PLUGIN_NULL_MEMBER, "leaves required members");
}

// The struct-size rule without dlopen: members beyond the plugin's struct_size are not read.
TEST(TransportAbi, AdoptReadsOnlyThePluginsBytes) {
  const ring_transport_t* good = TransportPlugin::load(RING_ABI_PLUGIN_GOOD).operator->();
  struct {
    ring_transport_t api;
    char tail[64];
  } bigger{};
  bigger.api = *good;
  bigger.api.struct_size = sizeof(bigger);
  const ring_transport_t* copy = adopt_plugin_struct(&bigger, "in-memory");
  EXPECT_NE(copy, &bigger.api) << "the loader keeps its own copy";
  EXPECT_EQ(copy->init, good->init);
  EXPECT_EQ(copy->last_error, good->last_error);

  // A plugin of the layout before all_to_all (struct_size up to arm_wakeup): the member reads as
  // NULL, which head-parallel attention refuses (worker/ring/head_attention.h).
  ring_transport_t before_a2a = *good;
  before_a2a.all_to_all = good->all_to_all ? good->all_to_all : reinterpret_cast<decltype(
      before_a2a.all_to_all)>(good->barrier);  // a non-NULL value beyond the declared size
  before_a2a.struct_size =
      static_cast<uint32_t>(offsetof(ring_transport_t, arm_wakeup) + sizeof(void*));
  const ring_transport_t* old = adopt_plugin_struct(&before_a2a, "in-memory");
  EXPECT_EQ(old->all_to_all, nullptr) << "a member beyond struct_size was read";
  EXPECT_EQ(old->barrier, good->barrier);

  ring_transport_t short_one = *good;
  short_one.struct_size = static_cast<uint32_t>(RING_TRANSPORT_MIN_SIZE - sizeof(void*));
  try {
    adopt_plugin_struct(&short_one, "in-memory");
    ADD_FAILURE() << "a struct without last_error was accepted";
  } catch (const TransportError& e) {
    EXPECT_NE(std::string(e.what()).find("transport plugin in-memory declares struct_size"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace ring::transport
