// st_forward CKPT_DIR TOKENS OUT: ringmaster's model forward (CPU backend, fp32) on the master
// weights of an imported checkpoint, for hf_parity.py.
//   CKPT_DIR  what `ringctl import -o` wrote (the model from its record, not model.yaml)
//   TOKENS    int32 [B, T] raw, B sequences of T tokens (T read from the file size and argv[4])
//   OUT       writes OUT.logits.f32 [B, T, vocab] and OUT.loss.f64 [B] (mean next-token
//             cross-entropy of each sequence, labels = the next token, the last ignored)
// Exit 0 on success, 1 with a message otherwise.
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <numeric>
#include <string>
#include <vector>


#include "common/checkpoint/checkpoint.h"
#include "common/checkpoint/model.h"
#include "kernels/backend.h"
#include "worker/model/attention.h"
#include "worker/model/model.h"

int main(int argc, char** argv) {
  if (argc != 5) {
    std::cerr << "usage: st_forward CKPT_DIR TOKENS OUT T\n";
    return 2;
  }
  const std::string dir = argv[1], tokens_path = argv[2], out = argv[3];
  const int64_t T = std::stoll(argv[4]);
  try {
    // The model as the checkpoint records it (the one reader generate and export use too).
    ring::contract::ModelConfig cfg = ring::ckpt::read_checkpoint_model(dir).config;
    cfg.dtype = ring::spec::DType::kFp32;
    cfg.check();

    std::string err;
    auto backend = ring::kernels::create_backend("cpu", 2, &err);
    if (!backend) throw std::runtime_error("cpu backend: " + err);
    ring::model::LocalAttention attention(backend.get());
    ring::model::Model model(cfg, backend.get(), &attention);
    const auto& pl = model.layout();
    std::vector<float> flat(static_cast<size_t>(pl.total()), 0.f);
    std::vector<ring::ckpt::LoadTarget> targets;
    for (const auto& v : pl.views())
      targets.emplace_back("master/" + v.name, ring::ckpt::DType::kF32, v.shape,
                           flat.data() + v.offset);
    auto lr = ring::ckpt::load_latest(dir, 0, 1, targets);
    if (!lr.loaded) throw std::runtime_error("load: " + lr.message);
    model.set_params(flat);

    std::ifstream in(tokens_path, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), {});
    std::vector<int32_t> tok(bytes.size() / 4);
    std::memcpy(tok.data(), bytes.data(), tok.size() * 4);
    const int64_t B = static_cast<int64_t>(tok.size()) / T;
    std::FILE* fl = std::fopen((out + ".logits.f32").c_str(), "wb");
    std::FILE* fo = std::fopen((out + ".loss.f64").c_str(), "wb");
    if (!fl || !fo) throw std::runtime_error("cannot write " + out);
    std::vector<int64_t> pos(T);
    std::iota(pos.begin(), pos.end(), 0);
    for (int64_t b = 0; b < B; ++b) {
      const int32_t* x = tok.data() + b * T;
      std::vector<int32_t> labels(T, -1);
      for (int64_t t = 0; t + 1 < T; ++t) labels[t] = x[t + 1];
      ring::model::Batch batch;
      batch.tokens = T;
      batch.ids = x;
      batch.labels = labels.data();
      batch.positions = pos.data();
      auto r = model.forward(batch, T - 1);
      std::vector<float> logits(static_cast<size_t>(T * cfg.vocab));
      backend->copy_to_host(logits.data(), model.logits(), logits.size() * sizeof(float));
      std::fwrite(logits.data(), 4, logits.size(), fl);
      double loss = r.loss;
      std::fwrite(&loss, 8, 1, fo);
    }
    std::fclose(fl);
    std::fclose(fo);
  } catch (const std::exception& e) {
    std::cerr << "st_forward: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
