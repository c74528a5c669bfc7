#include "torchpilot/runtime/core/knobs.h"

#include <algorithm>

namespace torchpilot {

std::string to_string(const Setting& setting) {
  std::string out;
  for (const auto& [name, value] : setting) {
    out += (out.empty() ? "" : " ") + name + "=" + std::to_string(value);
  }
  return out;
}

void KnobRegistry::add(Knob knob) {
  for (auto& k : knobs_) {
    if (k.name == knob.name) {
      k = std::move(knob);
      return;
    }
  }
  knobs_.push_back(std::move(knob));
}

void KnobRegistry::remove_prefix(const std::string& prefix) {
  knobs_.erase(std::remove_if(knobs_.begin(), knobs_.end(),
                              [&](const Knob& k) { return k.name.rfind(prefix, 0) == 0; }),
               knobs_.end());
}

const Knob* KnobRegistry::find(const std::string& name) const {
  for (const auto& k : knobs_) {
    if (k.name == name) return &k;
  }
  return nullptr;
}

Setting KnobRegistry::snapshot() const {
  Setting s;
  for (const auto& k : knobs_) s[k.name] = k.get();
  return s;
}

void KnobRegistry::apply(const Setting& setting) {
  for (const auto& [name, value] : setting) {
    const Knob* k = find(name);
    if (k != nullptr && k->get() != value) k->set(value);
  }
}

}  // namespace torchpilot
