// clock_cost: what one clock read costs on this machine: the steady clock (every Pilot
// timestamp), the thread's CPU clock (StepRecord::cpu_ns) and the process CPU clock. torchpilot
// reads them several times per step: on a VM whose clock source is not the TSC each read is a
// system call. The three clocks are measured in interleaved rounds (medians over rounds).
// Built with the benchmarks; run by scripts/gpu_run.sh clocks.
//   clock_cost [--rounds 5] [--machine M --commit C --out FILE]
#include <time.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "harness.h"

namespace {

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

// The clocks measured, by their results file key.
struct ClockRead {
  const char* key;
  double (*measure)();
};
const ClockRead kClocks[] = {
    {"steady_clock_ns",
     [] {
       return ns_per_call([] {
         return static_cast<long>(std::chrono::steady_clock::now().time_since_epoch().count());
       });
     }},
    {"thread_cputime_ns", [] { return ns_per_call([] { return read(CLOCK_THREAD_CPUTIME_ID); }); }},
    {"process_cputime_ns",
     [] { return ns_per_call([] { return read(CLOCK_PROCESS_CPUTIME_ID); }); }},
};

int run(int argc, char** argv) {
  CLI::App app("clock_cost: what one read of each clock costs here (ns)", "clock_cost");
  example_cli::last_wins(app);
  int rounds = 5;
  bench::RunFlags run_flags;  // --machine, --commit, --out
  bench::int_flag(app, "--rounds", rounds, 1, 1000, "rounds (every clock once per round)");
  bench::add_run_flags(app, run_flags, "write the results here (JSON)");
  example_cli::parse_or_exit(app, argc, argv);

  std::string source = "unknown";
  std::ifstream f("/sys/devices/system/clocksource/clocksource0/current_clocksource");
  if (f) std::getline(f, source);
  constexpr int kCount = static_cast<int>(sizeof kClocks / sizeof kClocks[0]);
  std::vector<std::vector<double>> ns(kCount);
  bench::interleave(rounds, kCount, bench::Order::kRotate, [&](int, int, int c) {
    ns[static_cast<size_t>(c)].push_back(kClocks[c].measure());
  });
  nlohmann::json j = bench::run_header("clock_cost", run_flags);
  j["clocksource"] = source;
  for (int c = 0; c < kCount; ++c) {
    // One decimal, as the results files have always had it.
    j[kClocks[c].key] = std::round(bench::median(ns[static_cast<size_t>(c)]) * 10) / 10;
  }
  j["rounds"] = rounds;
  std::printf("%s\n", j.dump().c_str());
  bench::write_results("clock_cost", run_flags, j);
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return bench::guarded_main("clock_cost", argc, argv, run); }
