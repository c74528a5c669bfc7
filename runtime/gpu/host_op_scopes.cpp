#include "torchpilot/runtime/gpu/host_op_scopes.h"

#include <utility>

namespace torchpilot {

HostOpScopes& HostOpScopes::instance() {
  static HostOpScopes* scopes = new HostOpScopes();  // never destroyed: syncs may come during exit
  return *scopes;
}

void HostOpScopes::enable(bool on) { enabled_.store(on, std::memory_order_relaxed); }

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
