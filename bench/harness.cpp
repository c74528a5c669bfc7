// The benchmarks' shared harness (harness.h).
#include "harness.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <stdexcept>

namespace bench {

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

std::string utc_date() {
  char date[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  return date;
}

double median(std::vector<double> v) {
  if (v.empty()) return std::nan("");
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

Spread spread(const std::vector<double>& v) {
  if (v.empty()) return {std::nan(""), std::nan(""), std::nan("")};
  const auto [lo, hi] = std::minmax_element(v.begin(), v.end());
  return {median(v), *lo, *hi};
}

std::vector<double> per_round_ratios(const std::vector<double>& x, const std::vector<double>& base,
                                     double minus) {
  std::vector<double> out;
  for (size_t i = 0; i < x.size() && i < base.size(); ++i) out.push_back(x[i] / base[i] - minus);
  return out;
}

std::vector<int> round_order(int round, int configs, Order order) {
  std::vector<int> out;
  for (int k = 0; k < configs; ++k) {
    out.push_back(order == Order::kRotate ? (k + round) % configs
                                          : (round % 2 == 0 ? k : configs - 1 - k));
  }
  return out;
}

void interleave(int rounds, int configs, Order order,
                const std::function<void(int round, int position, int config)>& measure) {
  for (int round = 0; round < rounds; ++round) {
    const std::vector<int> o = round_order(round, configs, order);
    for (int k = 0; k < configs; ++k) measure(round, k, o[static_cast<size_t>(k)]);
  }
}

void interleave_shuffled(int rounds, size_t items, std::mt19937& rng,
                         const std::function<void(size_t item)>& measure) {
  for (int round = 0; round < rounds; ++round) {
    std::vector<size_t> order(items);
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::shuffle(order.begin(), order.end(), rng);
    for (size_t i : order) measure(i);
  }
}

CLI::Option* number_flag(CLI::App& app, const std::string& name, double& value, double above,
                         double max, const std::string& help) {
  return example_cli::add_number(app, name, value, above, max, help)->capture_default_str();
}

void add_run_flags(CLI::App& app, RunFlags& run, const std::string& out_help, bool out_checked) {
  app.add_option("--machine", run.machine, "machine name, for the JSON file")
      ->capture_default_str();
  app.add_option("--commit", run.commit, "commit, for the JSON file")->capture_default_str();
  if (out_checked) {
    example_cli::add_path(app, "--out", run.out, "FILE", out_help);
  } else {
    app.add_option("--out", run.out, out_help);
  }
}

nlohmann::json run_header(const std::string& bench, const RunFlags& run, Stamp stamp) {
  nlohmann::json j = {{"bench", bench}, {"machine", run.machine}, {"commit", run.commit}};
  if (stamp == Stamp::kDate) {
    j["date"] = utc_date();
  } else {
    j["unix_time_s"] = static_cast<int64_t>(std::time(nullptr));
  }
  return j;
}

void write_json(const std::string& path, const nlohmann::json& j, int indent) {
  std::ofstream out(path);
  out << j.dump(indent) << "\n";
  if (!out) throw std::runtime_error("cannot write " + path);
}

void write_results(const char* name, const RunFlags& run, const nlohmann::json& j) {
  if (run.out.empty()) return;
  write_json(run.out, j);
  std::printf("%s: results in %s\n", name, run.out.c_str());
}

std::string next_run_folder(const std::string& dir) {
  static int runs = 0;
  return dir + "/run" + std::to_string(++runs);
}

int guarded_main(const char* name, int argc, char** argv, int (*run)(int, char**)) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", name, e.what());
    return 1;
  }
}

}  // namespace bench
