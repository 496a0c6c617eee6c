// The model a checkpoint was written for, read from its layout record (the `model` object:
// contract::model_record). The one reader of a checkpoint's model config: `ringctl generate`
// (alone and over ranks), `ringctl export`, and the test forward (tests/safetensors/st_forward)
// take the shape and the settings (RoPE theta and scaling, norm eps, tied head, max positions,
// dtype) from here; a resume and model.init_from compare the job's record with the same record
// (load_latest / load_from_path with a job layout). docs/checkpoints.md, "The model record".
#pragma once

#include <cstdint>
#include <string>

#include "common/checkpoint/checkpoint.h"
#include "common/contract/model_config.h"

namespace ring::ckpt {

struct CheckpointModel {
  contract::ModelConfig config;
  // Record 2: the settings are the checkpoint's. Record 1 (written before settings were
  // recorded): only the shape is, and the settings are the spec's defaults (rope_theta 10000,
  // norm_eps 1e-5, no RoPE scaling, fp32).
  bool settings = false;
  std::string step_dir;  // the step directory the record was read from
  int64_t step = -1;
};

// path: a step directory (it holds checkpoint.json: that step) or a checkpoint root (the newest
// complete step of its current lineage). Throws CheckpointError naming the path and the rule:
// not a complete checkpoint, no complete checkpoint in the root, no layout record (format 1:
// the spec it was trained with must say the model), a model record that does not parse (the key
// and the rule).
CheckpointModel read_checkpoint_model(const std::string& path);

}  // namespace ring::ckpt
