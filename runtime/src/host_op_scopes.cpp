#include "torchpilot/runtime/host_op_scopes.h"

#include <utility>

namespace torchpilot {

HostOpScopes& HostOpScopes::instance() {
  static HostOpScopes* scopes = new HostOpScopes();  // never destroyed: ops may end during exit
  return *scopes;
}

void HostOpScopes::set_switch(std::function<void(bool)> on_off) {
  std::lock_guard<std::mutex> lock(switch_mu_);
  switch_ = std::move(on_off);
  if (switch_) switch_(enabled());
}

bool HostOpScopes::has_switch() const {
  std::lock_guard<std::mutex> lock(switch_mu_);
  return static_cast<bool>(switch_);
}

void HostOpScopes::enable(bool on) {
  std::lock_guard<std::mutex> lock(switch_mu_);
  if (enabled_.exchange(on, std::memory_order_relaxed) == on) return;
  if (switch_) switch_(on);
}

bool HostOpScopes::push(HostOpScope scope) {
  std::lock_guard<std::mutex> lock(mu_);
  if (scopes_.size() >= kCapacity) {
    ++dropped_;
    return false;
  }
  scopes_.push_back(std::move(scope));
  return true;
}

void HostOpScopes::drain(std::vector<HostOpScope>& out) {
  std::vector<HostOpScope> taken;
  {
    std::lock_guard<std::mutex> lock(mu_);
    taken.swap(scopes_);
  }
  out.insert(out.end(), std::make_move_iterator(taken.begin()),
             std::make_move_iterator(taken.end()));
}

int64_t HostOpScopes::take_dropped() {
  std::lock_guard<std::mutex> lock(mu_);
  const int64_t d = dropped_;
  dropped_ = 0;
  return d;
}

}  // namespace torchpilot
