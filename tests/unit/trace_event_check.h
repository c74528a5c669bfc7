// Checks a Chrome trace-event JSON object against the format (the Trace Event Format document's
// required fields per phase) and the rule viewers rely on: complete events ("X") of one thread
// (pid, tid) nest, none crosses another's end. Returns the problems found (empty: valid).
#pragma once

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace torchpilot_test {

inline std::vector<std::string> trace_event_problems(const nlohmann::json& trace) {
  std::vector<std::string> problems;
  auto fail = [&](size_t i, const std::string& why) {
    problems.push_back("event " + std::to_string(i) + ": " + why);
  };
  if (!trace.is_object() || !trace.contains("traceEvents") || !trace["traceEvents"].is_array()) {
    return {"no traceEvents array"};
  }
  std::map<std::pair<long long, long long>, std::vector<std::pair<double, double>>> threads;
  const auto& events = trace["traceEvents"];
  for (size_t i = 0; i < events.size(); ++i) {
    const auto& e = events[i];
    if (!e.is_object()) {
      fail(i, "not an object");
      continue;
    }
    if (!e.contains("ph") || !e["ph"].is_string()) {
      fail(i, "no ph");
      continue;
    }
    const std::string ph = e["ph"];
    if (!e.contains("name") || !e["name"].is_string()) fail(i, "no name");
    if (!e.contains("pid") || !e["pid"].is_number_integer()) fail(i, "no integer pid");
    const bool needs_ts = ph != "M";
    if (needs_ts && (!e.contains("ts") || !e["ts"].is_number())) fail(i, "no ts");
    if (ph == "X") {
      if (!e.contains("tid") || !e["tid"].is_number_integer()) fail(i, "X without tid");
      if (!e.contains("dur") || !e["dur"].is_number() || e["dur"].get<double>() < 0)
        fail(i, "X without a dur >= 0");
      if (e.contains("tid") && e.contains("ts") && e.contains("dur") && e["ts"].is_number() &&
          e["dur"].is_number()) {
        const double ts = e["ts"];
        threads[{e["pid"].get<long long>(), e["tid"].get<long long>()}].push_back(
            {ts, ts + e["dur"].get<double>()});
      }
    } else if (ph == "C") {
      if (!e.contains("args") || !e["args"].is_object() || e["args"].empty()) {
        fail(i, "C without args");
      } else {
        for (const auto& [k, v] : e["args"].items()) {
          if (!v.is_number()) fail(i, "C arg " + k + " not a number");
        }
      }
    } else if (ph == "i" || ph == "I") {
      if (e.contains("s") && !(e["s"] == "g" || e["s"] == "p" || e["s"] == "t"))
        fail(i, "instant with a bad scope");
    } else if (ph == "M") {
      if (!e.contains("args") || !e["args"].is_object()) fail(i, "M without args");
    } else if (ph != "B" && ph != "E") {
      fail(i, "unexpected ph " + ph);
    }
  }
  // Nesting per thread: sorted by start (longer first on ties), each must end by its parent's end.
  constexpr double kEps = 1e-6;  // microseconds; rounding of ns / 1000
  for (auto& [thread, slices] : threads) {
    std::sort(slices.begin(), slices.end(), [](const auto& a, const auto& b) {
      return a.first != b.first ? a.first < b.first : a.second > b.second;
    });
    std::vector<double> open;
    for (const auto& [b, e] : slices) {
      while (!open.empty() && open.back() <= b + kEps) open.pop_back();
      if (!open.empty() && e > open.back() + kEps) {
        problems.push_back("pid " + std::to_string(thread.first) + " tid " +
                           std::to_string(thread.second) + ": a slice at " + std::to_string(b) +
                           " crosses its parent's end");
      }
      open.push_back(e);
    }
  }
  return problems;
}

}  // namespace torchpilot_test
