// Knobs: settings that can change while training runs (loader workers, prefetch, pinning, ...).
// A hook registers its knobs; tuning policies propose values; the trial engine applies them at
// step boundaries. Thread-safety: the registry is used from the training thread only; a knob's
// setter must be safe to call there while the hook's own threads run.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace torchpilot {

// A full or partial assignment of knob values, by knob name.
using Setting = std::map<std::string, int64_t>;
std::string to_string(const Setting& setting);  // "loader.workers=4 loader.prefetch=2"

struct Knob {
  std::string name;             // "component.knob"
  std::vector<int64_t> domain;  // allowed values, ascending; booleans are {0, 1}
  std::function<int64_t()> get;
  std::function<void(int64_t)> set;  // may throw; the trial engine treats that as a failed trial
};

class KnobRegistry {
 public:
  // Replaces a knob of the same name.
  void add(Knob knob);
  void remove_prefix(const std::string& prefix);  // e.g. when a loader goes away
  const Knob* find(const std::string& name) const;
  const std::vector<Knob>& knobs() const { return knobs_; }
  Setting snapshot() const;
  // Sets every named knob that exists and whose value differs; unknown names are ignored.
  void apply(const Setting& setting);

 private:
  std::vector<Knob> knobs_;
};

}  // namespace torchpilot
