// clock_cost: what one clock read costs on this machine: the steady clock (every Pilot
// timestamp), the thread's CPU clock (StepRecord::cpu_ns) and the process CPU clock. torchpilot
// reads them several times per step: on a VM whose clock source is not the TSC each read is a
// system call. Built and run by scripts/gpu_run.sh clocks (g++ -O2, no dependencies).
#include <time.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>

template <typename Fn>
double ns_per_call(Fn fn) {
  constexpr int kN = 200000;
  long sink = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < kN; ++i) sink += fn();
  const auto t1 = std::chrono::steady_clock::now();
  if (sink == 42) std::puts("");
  return std::chrono::duration<double, std::nano>(t1 - t0).count() / kN;
}

long read(clockid_t id) {
  timespec ts{};
  clock_gettime(id, &ts);
  return ts.tv_nsec;
}

int main() {
  std::string source = "unknown";
  std::ifstream f("/sys/devices/system/clocksource/clocksource0/current_clocksource");
  if (f) std::getline(f, source);
  std::printf("{\"clocksource\": \"%s\", ", source.c_str());
  std::printf("\"steady_clock_ns\": %.1f, ", ns_per_call([] {
                return static_cast<long>(std::chrono::steady_clock::now().time_since_epoch().count());
              }));
  std::printf("\"thread_cputime_ns\": %.1f, ", ns_per_call([] { return read(CLOCK_THREAD_CPUTIME_ID); }));
  std::printf("\"process_cputime_ns\": %.1f}\n", ns_per_call([] { return read(CLOCK_PROCESS_CPUTIME_ID); }));
}
