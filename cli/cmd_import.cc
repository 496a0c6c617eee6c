// `ringctl import DIR_OR_FILE -o CKPT_DIR [--dtype fp32|bf16] [--config FILE]` and
// `ringctl export CKPT_DIR -o DIR [--dtype bf16|fp32] [--shard-size GB] [--model-yaml FILE]`:
// Hugging Face Llama / Mistral safetensors <-> ringmaster checkpoints (common/hf/hf_llama.h).
// Exit 0 on success, 1 when the input cannot be converted (the message names the file and the
// rule), 2 usage.
#include <cmath>
#include <iostream>

#include <fmt/format.h>

#include "cli/commands.h"
#include "cli/exit_codes.h"
#include "common/hf/hf_llama.h"

namespace ring::cli {

namespace {
void progress(const std::string& cmd, const std::string& line) {
  std::cerr << "ringctl " << cmd << ": " << line << "\n";
}
}  // namespace

Subcommand add_import(CLI::App& app) {
  auto* sc = app.add_subcommand(
      "import",
      "Convert a Hugging Face Llama/Mistral model (config.json + safetensors) into a ringmaster "
      "checkpoint at step 0 and OUT/model.yaml (the spec's model section; see docs/models.md)");
  auto o = std::make_shared<hf::ImportOptions>();
  sc->add_option("source", o->src,
                 "A model directory (config.json, model.safetensors or shards with "
                 "model.safetensors.index.json) or one .safetensors file")
      ->required();
  sc->add_option("-o,--output", o->out, "The checkpoint directory to create (absent or empty)")
      ->required();
  sc->add_option("--dtype", o->dtype,
                 "The model's compute precision, recorded in the checkpoint and model.yaml "
                 "(default: bf16 for a torch_dtype bfloat16 model, else fp32); the weights keep "
                 "the source's precision")
      ->check(CLI::IsMember({"fp32", "bf16"}));
  sc->add_option("--config", o->config, "config.json (default: next to the safetensors)");
  return {sc, [o]() {
            try {
              hf::ImportResult r =
                  hf::import_model(*o, [](const std::string& l) { progress("import", l); });
              const auto& m = r.config.model;
              std::cout << fmt::format(
                  "imported {} ({} layers, d_model {}, heads {}/{}, vocab {}, {}tied, dtype {}, "
                  "rope_theta {}, rope_scaling {}): {} parameters in {:.2f} s\n  checkpoint {}\n"
                  "  model section {}/model.yaml\n",
                  r.config.architecture, m.layers, m.d_model, m.heads, m.kv_heads, m.vocab,
                  m.tie_embeddings ? "" : "un", spec::to_string(m.dtype), m.rope_theta,
                  r.config.rope_scaling, r.params, r.seconds, r.step_dir, o->out);
              return 0;
            } catch (const hf::ConvertError& e) {
              std::cerr << "ringctl import: " << e.what() << "\n";
              return kExitFailed;
            }
          }};
}

Subcommand add_export(CLI::App& app) {
  auto* sc = app.add_subcommand(
      "export",
      "Write a ringmaster checkpoint's weights as a Hugging Face Llama model (config.json + "
      "safetensors, sharded with an index above --shard-size)");
  auto o = std::make_shared<hf::ExportOptions>();
  auto shard_gb = std::make_shared<double>(5.0);
  sc->add_option("checkpoint", o->ckpt,
                 "A checkpoint directory (its newest complete step) or one step directory")
      ->required();
  sc->add_option("-o,--output", o->out, "The directory to write")->required();
  sc->add_option("--dtype", o->dtype,
                 "Tensor type of the safetensors files (default: the model's dtype, as its "
                 "checkpoint records it)")
      ->check(CLI::IsMember({"bf16", "fp32"}));
  sc->add_option("--shard-size", *shard_gb, "Largest file in GB before splitting (default 5)")
      ->check(CLI::Range(0.000001, 1e6));
  sc->add_option("--model-yaml", o->model_yaml,
                 "For a checkpoint that records only the model's shape: the model section with "
                 "its settings (default: model.yaml in the checkpoint directory); a checkpoint "
                 "that records its settings is its own config");
  return {sc, [o, shard_gb]() {
            o->shard_bytes = static_cast<uint64_t>(std::llround(*shard_gb * 1e9));
            try {
              hf::ExportResult r =
                  hf::export_model(*o, [](const std::string& l) { progress("export", l); });
              std::cout << fmt::format(
                  "exported step {}: {} parameters, {} file(s), {} bytes in "
                  "{:.2f} s to {}\n",
                  r.step, r.params, r.files.size(), r.bytes, r.seconds, o->out);
              return 0;
            } catch (const hf::ConvertError& e) {
              std::cerr << "ringctl export: " << e.what() << "\n";
              return kExitFailed;
            }
          }};
}

}  // namespace ring::cli
