#include "worker/train/passkey_eval.h"

#include <vector>

namespace ring::train {

PasskeyAccuracy evaluate_passkey(model::Model& model, const data::PasskeyOptions& options,
                                 int64_t n) {
  PasskeyAccuracy acc;
  data::PasskeyOptions o = options;
  o.labels = data::PasskeyLabels::kAnswer;
  const int64_t vocab = model.config().vocab;
  int64_t right_digits = 0, digits = 0, right_keys = 0;
  double loss = 0;
  std::vector<float> row(vocab);
  for (int64_t i = 0; i < n; ++i) {
    data::PasskeySample s = data::make_passkey_sample(o, i);
    const data::Sequence& q = s.sequence;
    model::Batch b{q.size(), q.tokens.data(), q.labels.data(), q.positions.data(),
                   q.doc_ids.data()};
    model::LossResult r = model.forward(b, q.valid_labels());
    loss += r.loss;
    bool all = true;
    for (int64_t k = 0; k < s.answer_len; ++k) {
      const int64_t pos = s.first_predicting_position() + k;
      model::check_status(model.backend()->copy_to_host(row.data(), model.logits() + pos * vocab,
                                                        vocab * sizeof(float)),
                          "copy_to_host");
      int64_t best = 0;
      for (int64_t c = 1; c < vocab; ++c) {
        if (row[c] > row[best]) best = c;
      }
      const bool ok = best == static_cast<unsigned char>(s.answer[k]);
      right_digits += ok;
      all = all && ok;
      ++digits;
    }
    right_keys += all;
  }
  acc.samples = n;
  acc.digit_accuracy = digits ? static_cast<double>(right_digits) / digits : 0;
  acc.key_accuracy = n ? static_cast<double>(right_keys) / n : 0;
  acc.answer_loss = n ? loss / n : 0;
  return acc;
}

}  // namespace ring::train
