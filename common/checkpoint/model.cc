#include "common/checkpoint/model.h"

#include <filesystem>
#include <optional>
#include <vector>

namespace ring::ckpt {

namespace fs = std::filesystem;

CheckpointModel read_checkpoint_model(const std::string& path) {
  std::error_code ec;
  std::optional<CheckpointInfo> pick;
  if (fs::exists(fs::path(path) / "checkpoint.json", ec)) {
    CheckpointInfo info = inspect_checkpoint(path, false);
    if (info.status != Status::kComplete)
      throw CheckpointError(path + ": not a complete checkpoint: " +
                            (info.problems.empty() ? std::string("?") : info.problems.front()));
    pick = std::move(info);
  } else {
    if (!fs::is_directory(path, ec)) throw CheckpointError(path + " is not a directory");
    const std::vector<CheckpointInfo> all = list_checkpoints(path, false);
    for (size_t i : current_lineage(all, read_latest(path)))
      if (all[i].status == Status::kComplete) {
        pick = all[i];
        break;
      }
    if (!pick) throw CheckpointError(path + ": holds no complete checkpoint");
  }
  if (!pick->layout || !pick->layout->model.is_object() || pick->layout->model.empty())
    throw CheckpointError(pick->path +
                          ": records no model config (a format 1 checkpoint): the spec it was "
                          "trained with must give the model");
  CheckpointModel m;
  m.step_dir = pick->path;
  m.step = pick->step;
  try {
    m.settings = contract::model_record_version(pick->layout->model) >= 2;
    m.config = contract::model_config_from_record(pick->layout->model);
  } catch (const contract::ModelError& e) {
    throw CheckpointError(pick->path + "/checkpoint.json: layout.model: " + e.what());
  }
  return m;
}

}  // namespace ring::ckpt
