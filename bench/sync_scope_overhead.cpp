// What the op-scope hook (hooks/include/torchpilot/hooks/torch_sync_scopes.h) costs each op while
// it is on: tiny CPU ops timed with the hook's callback off and on, alternating, median of the
// repetitions. Ops it does not record pay the RecordFunction machinery and one name check; ops it
// records (aten::to) also push a scope. Prints ns per op; bench/README.md has the numbers.
//   build/bench/sync_scope_overhead [--ops N] [--reps R]
#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <tuple>
#include <vector>

#include "torchpilot/hooks/torch_sync_scopes.h"
#include "torchpilot/runtime/host_op_scopes.h"

namespace {

// Timed in chunks that fit the scope buffer, drained between chunks (untimed: the monitor drains
// once per step), so recorded scopes are pushed, not dropped.
template <typename Op>
double ns_per_op(int n, Op op) {
  constexpr int kChunk = 4000;
  std::vector<torchpilot::HostOpScope> sink;
  double ns = 0;
  for (int done = 0; done < n; done += kChunk) {
    const int m = std::min(kChunk, n - done);
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < m; ++i) op();
    ns += std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
    sink.clear();
    torchpilot::HostOpScopes::instance().drain(sink);
  }
  return ns / n;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int ops = 200000, reps = 7;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--ops") == 0) ops = std::max(1, std::atoi(argv[i + 1]));
    if (std::strcmp(argv[i], "--reps") == 0) reps = std::max(1, std::atoi(argv[i + 1]));
  }
  torchpilot::SyncScopeHook hook;
  if (!hook.active()) {
    std::fprintf(stderr, "hook not active\n");
    return 1;
  }
  auto& scopes = torchpilot::HostOpScopes::instance();
  const at::Tensor a = at::ones({4}), b = at::ones({4});
  auto add = [&] { (void)at::add(a, b); };
  auto to = [&] { (void)a.to(at::kDouble); };
  for (const auto& [name, op, n] :
       {std::make_tuple("aten::add (not recorded)", std::function<void()>(add), ops),
        std::make_tuple("aten::to (recorded)", std::function<void()>(to), ops / 4)}) {
    (void)ns_per_op(n / 4, op);  // warm-up
    std::vector<double> off, on;
    for (int r = 0; r < reps; ++r) {
      scopes.enable(false);
      off.push_back(ns_per_op(n, op));
      scopes.enable(true);
      on.push_back(ns_per_op(n, op));
      scopes.enable(false);
    }
    const double m_off = median(off), m_on = median(on);
    std::printf("%-26s off %7.0f ns/op, on %7.0f ns/op: +%.0f ns per op (median of %d x %d)\n",
                name, m_off, m_on, m_on - m_off, reps, n);
  }
  std::printf("dropped scopes (buffer full between drains): %lld\n",
              static_cast<long long>(scopes.take_dropped()));
  return 0;
}
