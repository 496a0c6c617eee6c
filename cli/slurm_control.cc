#include "cli/slurm_control.h"

namespace ring::cli {

std::map<std::string, slurm::JobView> slurm_views(const std::vector<protocol::JobInfo>& jobs) {
  std::vector<std::string> ids;
  for (const auto& j : jobs)
    if (!j.slurm_job_id.empty() && slurm::valid_job_id(j.slurm_job_id))
      ids.push_back(j.slurm_job_id);
  if (ids.empty()) return {};
  try {
    return slurm::query_jobs(ids);
  } catch (const std::exception& e) {
    std::map<std::string, slurm::JobView> out;
    for (const auto& id : ids) {
      auto& v = out[id];
      v.id = id;
      v.reason = std::string("Slurm not reachable: ") + e.what();
    }
    return out;
  }
}

std::string slurm_cancel(const protocol::JobInfo& j) {
  if (j.slurm_job_id.empty()) return "";
  slurm::cancel(j.slurm_job_id);
  return "scancel " + j.slurm_job_id;
}

std::string slurm_requeue(const protocol::JobInfo& j) {
  if (!j.excluded_nodes.empty()) {
    std::string list = slurm::requeue_excluding(j.slurm_job_id, j.excluded_nodes);
    return "scontrol requeuehold/update ExcNodeList=" + list + "/release " + j.slurm_job_id +
           ": Slurm stops it and starts it again without the excluded nodes; it resumes from the "
           "latest complete checkpoint";
  }
  slurm::requeue(j.slurm_job_id);
  return "scontrol requeue " + j.slurm_job_id +
         ": Slurm stops and restarts it; it resumes from the latest complete checkpoint";
}

}  // namespace ring::cli
