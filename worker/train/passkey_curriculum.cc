#include "worker/train/passkey_curriculum.h"

#include <cerrno>
#include <cstdlib>
#include <stdexcept>

namespace ring::train {
namespace {

int64_t parse_field(const std::string& item, const std::string& field, int64_t lo, int64_t hi,
                    const char* what) {
  char* end = nullptr;
  errno = 0;
  const long long x = std::strtoll(field.c_str(), &end, 10);
  if (field.empty() || errno != 0 || *end != '\0' || x < lo || x > hi) {
    throw std::invalid_argument("curriculum stage '" + item + "': " + what +
                                " must be an integer in [" + std::to_string(lo) + ", " +
                                std::to_string(hi) + "]");
  }
  return x;
}

}  // namespace

std::vector<PasskeyStage> parse_passkey_curriculum(const std::string& text) {
  std::vector<PasskeyStage> stages;
  size_t begin = 0;
  while (true) {
    const size_t comma = text.find(',', begin);
    const std::string item = text.substr(begin, comma == std::string::npos ? comma : comma - begin);
    std::vector<std::string> fields;
    size_t from = 0;
    for (size_t colon; (colon = item.find(':', from)) != std::string::npos; from = colon + 1) {
      fields.push_back(item.substr(from, colon - from));
    }
    fields.push_back(item.substr(from));
    if (fields.size() < 2 || fields.size() > 3) {
      throw std::invalid_argument("curriculum stage '" + item + "': expected LEN:STEPS[:SEQS]");
    }
    PasskeyStage st;
    st.seq_len = parse_field(item, fields[0], 16, int64_t{1} << 30, "LEN");
    st.steps = parse_field(item, fields[1], 1, int64_t{1} << 40, "STEPS");
    if (fields.size() == 3) st.seqs = parse_field(item, fields[2], 1, 1 << 20, "SEQS");
    stages.push_back(st);
    if (comma == std::string::npos) break;
    begin = comma + 1;
  }
  return stages;
}

PasskeyCurriculum::PasskeyCurriculum(const data::PasskeyOptions& options, int64_t final_seqs,
                                     std::vector<PasskeyStage> stages)
    : options_(options), final_seqs_(final_seqs), stages_(std::move(stages)) {
  if (final_seqs_ < 1) throw std::invalid_argument("samples per step must be at least 1");
  (void)data::make_passkey_sample(options_, 0);  // checks the length and digits now
  for (PasskeyStage& st : stages_) {
    if (st.seqs == 0) st.seqs = final_seqs_;
    data::PasskeyOptions o = options_;
    o.seq_len = st.seq_len;
    (void)data::make_passkey_sample(o, 0);
  }
}

PasskeyStage PasskeyCurriculum::stage(int64_t step) const {
  int64_t end = 0;
  for (const PasskeyStage& st : stages_) {
    end += st.steps;
    if (step <= end) return st;
  }
  return PasskeyStage{options_.seq_len, 0, final_seqs_};
}

bool PasskeyCurriculum::starts_stage(int64_t step) const {
  if (step <= 1) return true;
  const PasskeyStage a = stage(step - 1), b = stage(step);
  return a.seq_len != b.seq_len || a.seqs != b.seqs;
}

std::vector<data::Sequence> PasskeyCurriculum::next_step(int64_t step) {
  const PasskeyStage st = stage(step);
  data::PasskeyOptions o = options_;
  o.seq_len = st.seq_len;
  std::vector<data::Sequence> seqs;
  seqs.reserve(static_cast<size_t>(st.seqs));
  for (int64_t i = 0; i < st.seqs; ++i) {
    seqs.push_back(data::make_passkey_sample(o, index_++).sequence);
  }
  return seqs;
}

}  // namespace ring::train
