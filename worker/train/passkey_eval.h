// Passkey retrieval accuracy: greedy (argmax) prediction of each answer digit, teacher-forced on
// the true earlier digits, on held-out samples (a seed the training stream never uses).
#pragma once

#include <cstdint>

#include "worker/data/passkey.h"
#include "worker/model/model.h"

namespace ring::train {

struct PasskeyAccuracy {
  int64_t samples = 0;
  double digit_accuracy = 0;  // fraction of answer digits predicted right (chance: 0.1)
  double key_accuracy = 0;    // fraction of samples with every digit right
  double answer_loss = 0;     // mean cross-entropy (nats) on the answer digits
};

// Evaluates samples [0, n) of the stream with options.seed (use a seed other than training's).
PasskeyAccuracy evaluate_passkey(model::Model& model, const data::PasskeyOptions& options,
                                 int64_t n);

}  // namespace ring::train
