// Writes the checkpoint the generation tests use (format 2, its layout record naming the model):
// the tests' tiny model (tests/common/tiny_model.h: 2 layers, d_model 64, 4 query heads over 2
// K/V heads of 16, swiglu 128, byte vocab), random weights of seed 21 with attention and embedding
// scaled x8 so that greedy tokens are decided by clear margins.
//   write_test_checkpoint DIR [bf16]   (DIR/step-00000002 appears; bf16: its model record says
//                                      model.dtype bf16, as a checkpoint trained in bf16 does)
// Used by tests/slurm/generate_slurm_test.sh. Exit 0 ok, 1 failure (message on stderr), 2 usage.
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "tests/common/tiny_model.h"
#include "tests/common/tiny_weights.h"

int main(int argc, char** argv) {
  if (argc < 2 || argc > 3 || (argc == 3 && std::string(argv[2]) != "bf16")) {
    std::fprintf(stderr, "usage: %s DIR [bf16]\n", argv[0]);
    return 2;
  }
  try {
    auto c = ring::test::tiny_model_config();
    if (argc == 3) c.dtype = ring::spec::DType::kBf16;
    std::string err;
    auto be = ring::kernels::create_backend("cpu", 1, &err);
    if (!be) throw std::runtime_error(err);
    const std::vector<float> params =
        ring::test::tiny_params(c, be.get(), 21, ring::test::kSharpAttentionAndEmbedding);
    if (!ring::test::write_checkpoint(argv[1], c, params).ok)
      throw std::runtime_error("the checkpoint was not written");
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "write_test_checkpoint: %s\n", e.what());
    return 1;
  }
}
