// torchpilot: in-process training performance advisor and auto-tuner for LibTorch programs.
// Include this header and link torchpilot::torchpilot. README.md shows the few lines a trainer
// adds.
#pragma once

#include "torchpilot/advice.h"
#include "torchpilot/advisors.h"
#include "torchpilot/clock.h"
#include "torchpilot/config.h"
#include "torchpilot/flop_counter.h"
#include "torchpilot/knobs.h"
#include "torchpilot/loader_core.h"
#include "torchpilot/pilot.h"
#include "torchpilot/records.h"
#include "torchpilot/sink.h"
#include "torchpilot/trial_engine.h"
#include "torchpilot/tunable_loader.h"
#include "torchpilot/watch.h"
