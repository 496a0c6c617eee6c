// What a run of the step graph (sim/step_graph.h) comes to: SimResult's times, hops, hidden
// communication, exchange and optimizer, shard full, critical path, notes and trace (internal
// to ring_sim; sim/simulate.cc calls it once the engine has run).
#pragma once

#include "sim/simulate.h"
#include "sim/step_graph.h"
#include "sim/step_plan.h"
#include "sim/workload.h"

namespace ring::sim::detail {

// g has run (g.engine().run() returned end, the step's seconds). With keep_trace, every task
// goes to res->trace.
void summarize(const StepGraph& g, const Workload& w, const Simulated& sim, bool keep_trace,
               double end, SimResult* res);

}  // namespace ring::sim::detail
