// torchpilot: in-process training performance advisor and auto-tuner for LibTorch programs.
// Include this header and link torchpilot::torchpilot. README.md shows the few lines a trainer
// adds.
#pragma once

#include "torchpilot/advisors/advisors.h"
#include "torchpilot/hooks/accumulation.h"
#include "torchpilot/hooks/activation_offload.h"
#include "torchpilot/hooks/flop_counter.h"
#include "torchpilot/hooks/tunable_loader.h"
#include "torchpilot/hooks/watch.h"
#include "torchpilot/runtime/advice.h"
#include "torchpilot/runtime/batch_policy.h"
#include "torchpilot/runtime/clock.h"
#include "torchpilot/runtime/config.h"
#include "torchpilot/runtime/knobs.h"
#include "torchpilot/runtime/loader_core.h"
#include "torchpilot/runtime/memory_records.h"
#include "torchpilot/runtime/pilot.h"
#include "torchpilot/runtime/records.h"
#include "torchpilot/runtime/sink.h"
#include "torchpilot/runtime/trial_engine.h"
