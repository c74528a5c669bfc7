// How a data loader joins a Pilot: measured (its waits, its epoch counters: the "loader" section)
// and, in autotune mode, tuned (its knobs join the Pilot's registry; its production rate bounds
// the trials). hooks/loader's TunableLoader and WatchedLoader attach themselves.
//
// One loader is attached at a time. The loader detaches itself when destroyed. When the Pilot goes
// first, drops the loader's collector after a failure, or another loader replaces this one, the
// Pilot's side calls forget_pilot(): the loader must then stop reporting to it.
//
// Thread-safety: attach and detach on the training thread. Failure behaviour: attach and detach
// never throw what the probe throws; forget_pilot() throwing is logged.
#pragma once

#include <vector>

#include "torchpilot/runtime/core/knobs.h"
#include "torchpilot/runtime/core/pilot.h"
#include "torchpilot/runtime/loader/loader_records.h"

namespace torchpilot {

class LoaderProbe {
 public:
  virtual ~LoaderProbe() = default;
  virtual LoaderStats stats() const = 0;
  virtual void forget_pilot() = 0;
};

// The loader's knobs join pilot.knobs() (autotune tunes them); its stats go into epoch summaries.
// A loader attached before is detached and told to forget the Pilot. In mode off: nothing.
void attach_loader(Pilot& pilot, LoaderProbe* probe, std::vector<Knob> knobs);
// Removes the loader's collector and its knobs ("loader.*"); nothing when it is not attached.
void detach_loader(Pilot& pilot, LoaderProbe* probe);

}  // namespace torchpilot
