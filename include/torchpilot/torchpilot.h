// torchpilot: in-process training performance advisor and auto-tuner for LibTorch programs.
// Include this header and link torchpilot::torchpilot. README.md shows the few lines a trainer
// adds.
#pragma once

#include "torchpilot/advisors/core/advisors.h"
#include "torchpilot/hooks/flops/flop_counter.h"
#include "torchpilot/hooks/loader/tunable_loader.h"
#include "torchpilot/hooks/loader/watch.h"
#include "torchpilot/hooks/memory/accumulation.h"
#include "torchpilot/hooks/memory/activation_offload.h"
#include "torchpilot/runtime/core/advice.h"
#include "torchpilot/runtime/core/clock.h"
#include "torchpilot/runtime/core/config.h"
#include "torchpilot/runtime/core/config_section.h"
#include "torchpilot/runtime/core/knobs.h"
#include "torchpilot/runtime/core/pilot.h"
#include "torchpilot/runtime/core/records.h"
#include "torchpilot/runtime/core/sink.h"
#include "torchpilot/runtime/cost/cost.h"
#include "torchpilot/runtime/loader/loader_core.h"
#include "torchpilot/runtime/loader/loader_probe.h"
#include "torchpilot/runtime/memory/batch_policy.h"
#include "torchpilot/runtime/memory/memory_records.h"
#include "torchpilot/runtime/tune/trial_engine.h"
