// The model's configuration, flat parameter layout and error type are the contract with ringd
// (common/contract/model_config.h, common/contract/layout.h): ringd allocates the same flat
// buffers and gradient buckets without linking the model. The model uses them under its own
// namespace.
#pragma once

#include "common/contract/layout.h"
#include "common/contract/model_config.h"

namespace ring::model {

using contract::GradBucket;
using contract::kParamAlign;
using contract::ModelConfig;
using contract::ModelError;
using contract::ParamLayout;
using contract::ParamView;

}  // namespace ring::model
