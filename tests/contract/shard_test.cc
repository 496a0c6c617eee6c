// The division of the optimizer state between nodes (common/contract/shard.h): contiguous,
// bucket-aligned ranges that cover the layout, the largest one as small as a contiguous split of
// whole buckets allows (checked against brute force), and nodes beyond the buckets own nothing.
#include <gtest/gtest.h>

#include <algorithm>
#include <limits>

#include "common/contract/shard.h"
#include "tests/common/tiny_model.h"

namespace ring::contract {
namespace {

// The tests' tiny model without GQA (4 K/V heads) and with an MLP of 192.
ModelConfig config(int64_t layers, bool tie) {
  return test::tiny_model_config(
      {.layers = layers, .kv_heads = 4, .mlp_hidden = 192, .tie_embeddings = tie});
}

// The smallest possible largest part of a contiguous split of `sizes` into at most k parts.
int64_t brute_best(const std::vector<int64_t>& sizes, int k) {
  const int n = static_cast<int>(sizes.size());
  std::vector<std::vector<int64_t>> best(k + 1, std::vector<int64_t>(n + 1, std::numeric_limits<int64_t>::max()));
  best[0][0] = 0;
  for (int j = 1; j <= k; ++j)
    for (int i = 0; i <= n; ++i) {
      int64_t sum = 0;
      best[j][i] = best[j - 1][i];
      for (int p = i - 1; p >= 0; --p) {
        sum += sizes[p];
        if (best[j - 1][p] != std::numeric_limits<int64_t>::max())
          best[j][i] = std::min(best[j][i], std::max(best[j - 1][p], sum));
      }
    }
  return best[k][n];
}

TEST(ShardRanges, CoverTheLayoutInOrderAndAreOptimal) {
  for (int64_t layers : {1, 2, 5, 12})
    for (bool tie : {true, false}) {
      const ParamLayout layout(config(layers, tie));
      std::vector<int64_t> sizes;
      for (const GradBucket& b : layout.buckets()) sizes.push_back(b.end - b.begin);
      for (int nodes : {1, 2, 3, 4, 7, 16}) {
        const std::vector<NodeRange> r = shard_ranges(layout, nodes);
        ASSERT_EQ(static_cast<int>(r.size()), nodes);
        int64_t at = 0, largest = 0;
        int bucket = 0;
        for (int k = 0; k < nodes; ++k) {
          EXPECT_EQ(r[k].node, k);
          EXPECT_EQ(r[k].begin, at) << "layers " << layers << " nodes " << nodes << " node " << k;
          EXPECT_EQ(r[k].first_bucket, bucket);
          if (!r[k].empty()) {
            EXPECT_EQ(r[k].begin, layout.buckets()[r[k].first_bucket].begin);
            EXPECT_EQ(r[k].end, layout.buckets()[r[k].end_bucket - 1].end);
          }
          at = r[k].end;
          bucket = r[k].end_bucket;
          largest = std::max(largest, r[k].size());
          for (int b = r[k].first_bucket; b < r[k].end_bucket; ++b) EXPECT_EQ(bucket_owner(r, b), k);
        }
        EXPECT_EQ(at, layout.total());
        EXPECT_EQ(bucket, static_cast<int>(layout.buckets().size()));
        EXPECT_EQ(largest, brute_best(sizes, nodes)) << "layers " << layers << " nodes " << nodes;
        // No node is left empty while another holds two or more buckets.
        const int nb = static_cast<int>(sizes.size());
        const int nonempty = static_cast<int>(
            std::count_if(r.begin(), r.end(), [](const NodeRange& x) { return !x.empty(); }));
        EXPECT_EQ(nonempty, std::min(nodes, nb)) << describe(layout, r);
      }
    }
}

TEST(ShardRanges, OneNodeOwnsEverythingAndBadCountsAreRefused) {
  const ParamLayout layout(config(3, true));
  const std::vector<NodeRange> r = shard_ranges(layout, 1);
  EXPECT_EQ(r[0].begin, 0);
  EXPECT_EQ(r[0].end, layout.total());
  EXPECT_THROW(shard_ranges(layout, 0), std::invalid_argument);
  EXPECT_THROW(bucket_owner(r, 99), std::invalid_argument);
  EXPECT_NE(describe(layout, shard_ranges(layout, 9)).find("node 8: nothing"), std::string::npos);
}

}  // namespace
}  // namespace ring::contract
