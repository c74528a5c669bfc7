// The Prometheus endpoint, scraped over loopback with cpp-httplib's client and parsed as the text
// exposition format: families with HELP and TYPE, names by the conventions, labels rank and device.
#include <gtest/gtest.h>
#include <httplib.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>

#include "fakes/string_logger.h"
#include "torchpilot/hooks/reports/prometheus_exporter.h"
#include "torchpilot/runtime/core/pilot.h"

namespace torchpilot {
namespace {

constexpr Nanos kMs = 1000000;

struct Sample {
  std::string name;
  std::map<std::string, std::string> labels;
  double value = 0;
};

// Parses the text format; every sample's family must have been declared (HELP, TYPE) before it.
struct Parsed {
  std::map<std::string, std::string> types;  // family -> type
  std::vector<Sample> samples;
  std::vector<std::string> problems;
  double get(const std::string& name, const std::string& label = "",
             const std::string& value = "") const {
    for (const Sample& s : samples) {
      if (s.name == name &&
          (label.empty() || (s.labels.count(label) && s.labels.at(label) == value)))
        return s.value;
    }
    return std::nan("");
  }
};

Parsed parse(const std::string& text) {
  Parsed p;
  const std::regex name_re("[a-zA-Z_:][a-zA-Z0-9_:]*");
  const std::regex sample_re("([a-zA-Z_:][a-zA-Z0-9_:]*)\\{(.*)\\} (\\S+)");
  const std::regex label_re("([a-zA-Z_][a-zA-Z0-9_]*)=\"((?:[^\"\\\\]|\\\\.)*)\"(,|$)");
  std::set<std::string> helped;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    std::smatch m;
    if (line.rfind("# HELP ", 0) == 0) {
      helped.insert(line.substr(7, line.find(' ', 7) - 7));
    } else if (line.rfind("# TYPE ", 0) == 0) {
      std::istringstream ls(line.substr(7));
      std::string name, type;
      ls >> name >> type;
      if (!std::regex_match(name, name_re)) p.problems.push_back("bad name " + name);
      if (type != "counter" && type != "gauge" && type != "summary" && type != "histogram")
        p.problems.push_back("bad type " + type);
      if (!helped.count(name)) p.problems.push_back("TYPE without HELP: " + name);
      p.types[name] = type;
    } else if (std::regex_match(line, m, sample_re)) {
      Sample s;
      s.name = m[1];
      const std::string labels = m[2];
      for (auto it = std::sregex_iterator(labels.begin(), labels.end(), label_re);
           it != std::sregex_iterator(); ++it) {
        s.labels[(*it)[1]] = (*it)[2];
      }
      s.value = std::stod(m[3]);
      std::string family = s.name;
      for (const char* suffix : {"_sum", "_count"}) {
        const std::string sx(suffix);
        if (!p.types.count(family) && family.size() > sx.size() &&
            family.compare(family.size() - sx.size(), sx.size(), sx) == 0) {
          family = family.substr(0, family.size() - sx.size());
        }
      }
      if (!p.types.count(family)) p.problems.push_back("sample before its TYPE: " + s.name);
      if (!s.labels.count("rank") || !s.labels.count("device"))
        p.problems.push_back("no rank/device labels: " + line);
      p.samples.push_back(s);
    } else {
      p.problems.push_back("unparsed line: " + line);
    }
  }
  for (const auto& [name, type] : p.types) {
    const bool total = name.size() > 6 && name.compare(name.size() - 6, 6, "_total") == 0;
    if ((type == "counter") != total) p.problems.push_back("counter/_total mismatch: " + name);
  }
  return p;
}

std::shared_ptr<spdlog::logger> logger_to(std::ostringstream& out) {
  return test::string_logger("prom-test", out);
}

TEST(PrometheusTest, AScrapeOverLoopbackParsesAndCarriesTheRunsFigures) {
  std::ostringstream log;
  auto logger = logger_to(log);
  auto sink = std::make_shared<PrometheusSink>("127.0.0.1", 0, *logger, "3");
  ASSERT_TRUE(sink->serving()) << log.str();
  auto clock = std::make_shared<ManualClock>();
  PilotOptions o;
  o.logger = logger;
  o.clock = clock;
  o.default_collectors = false;
  o.sinks = {sink};
  Config c;
  c.gpu.enabled = false;
  Pilot pilot(c, o);
  for (int i = 0; i < 5; ++i) {
    pilot.record_data_wait(2 * kMs);
    clock->advance(2 * kMs);
    auto s = pilot.step(16);
    auto f = pilot.phase("forward");
    clock->advance(8 * kMs);
  }
  pilot.end_epoch();

  httplib::Client client("127.0.0.1", sink->port());
  auto res = client.Get("/metrics");
  ASSERT_TRUE(res) << httplib::to_string(res.error());
  EXPECT_EQ(res->status, 200);
  EXPECT_NE(res->get_header_value("Content-Type").find("text/plain; version=0.0.4"),
            std::string::npos);
  const Parsed p = parse(res->body);
  EXPECT_TRUE(p.problems.empty()) << p.problems.front() << "\n" << res->body;
  EXPECT_EQ(p.get("torchpilot_steps_total"), 5);
  EXPECT_EQ(p.get("torchpilot_samples_total"), 80);
  EXPECT_EQ(p.get("torchpilot_epochs_total"), 1);
  EXPECT_NEAR(p.get("torchpilot_data_wait_seconds_total"), 0.010, 1e-12);
  EXPECT_NEAR(p.get("torchpilot_step_duration_seconds_sum"), 0.050, 1e-12);
  EXPECT_EQ(p.get("torchpilot_step_duration_seconds_count"), 5);
  EXPECT_NEAR(p.get("torchpilot_phase_seconds_total", "phase", "forward"), 0.040, 1e-12);
  EXPECT_NEAR(p.get("torchpilot_epoch_data_wait_ratio"), 0.2, 1e-9);
  // Starved: the data_starvation advice, by id and severity.
  EXPECT_GT(p.get("torchpilot_advice_expected_gain_ratio", "id", "data_starvation"), 0);
  EXPECT_EQ(p.types.at("torchpilot_step_duration_seconds"), "summary");
  for (const Sample& s : p.samples) {
    EXPECT_EQ(s.labels.at("rank"), "0");
    EXPECT_EQ(s.labels.at("device"), "3");
  }
}

TEST(PrometheusTest, APortInUseIsOneLogLineAndNoEndpoint) {
  std::ostringstream log;
  auto logger = logger_to(log);
  PrometheusSink first("127.0.0.1", 0, *logger);
  ASSERT_TRUE(first.serving());
  Config c;
  c.gpu.enabled = false;
  c.report.prometheus_port = first.port();
  PilotOptions o;
  o.logger = logger;
  o.default_collectors = false;
  Pilot pilot(c, o);  // must not throw
  { auto s = pilot.step(1); }
  const std::string text = log.str();
  EXPECT_NE(
      text.find("Prometheus endpoint off: cannot bind 127.0.0.1:" + std::to_string(first.port())),
      std::string::npos)
      << text;
  size_t n = 0;
  for (size_t at = text.find("Prometheus endpoint off"); at != std::string::npos;
       at = text.find("Prometheus endpoint off", at + 1))
    ++n;
  EXPECT_EQ(n, 1u);
}

TEST(PrometheusTest, ASinkDestroyedRightAfterItStartedStopsItsServer) {
  std::ostringstream log;
  auto logger = logger_to(log);
  for (int i = 0; i < 20; ++i) {
    PrometheusSink sink("127.0.0.1", 0, *logger);
    EXPECT_TRUE(sink.serving());
  }  // each destructor must return (it used to wait in accept() for ever)
}

TEST(PrometheusTest, LabelValuesAreEscaped) {
  MetricsSnapshot s;
  s.rank = "a\"b\\c\nd";
  const std::string text = prometheus_text(s);
  EXPECT_NE(text.find("rank=\"a\\\"b\\\\c\\nd\""), std::string::npos) << text;
  EXPECT_TRUE(parse(text).problems.empty());
}

// Names, help texts and label values come out valid (UTF-8, escaped, names by the rules)
// whatever the strings: a phase name, RANK from the environment, a gauge set by another part.
TEST(PrometheusTest, TheBodyStaysValidWhateverTheStrings) {
  const std::string kReplacement = "\xef\xbf\xbd";  // U+FFFD
  MetricsSnapshot s;
  s.rank = "r\xff";
  s.phase_seconds["fwd\xc3"] = 1;                         // cut short
  s.phase_seconds["euro\xe2\x82\xac"] = 2;                // valid: kept
  s.phase_seconds["sur\xed\xa0\x80"] = 3;                 // an encoded surrogate
  s.phase_seconds["over\xc0\xaf"] = 4;                    // overlong
  s.phase_seconds[std::string("ctl\r\t\x01\0.", 8)] = 5;  // control characters
  s.phase_seconds["x\xfe"] = 6;                           // these two become one label:
  s.phase_seconds["x\xff"] = 7;                           // one series, their sum
  s.advice.push_back({"id\xff", "high", 0.25});
  s.extra["torchpilot_odd name-1"] = {"help \xff with \\ and\nnewline", 1};
  const std::string text = prometheus_text(s);

  EXPECT_NO_THROW(nlohmann::json(text).dump()) << "not valid UTF-8:\n" << text;
  EXPECT_EQ(text.find('\r'), std::string::npos);
  EXPECT_EQ(text.find('\0'), std::string::npos);
  const Parsed p = parse(text);
  EXPECT_TRUE(p.problems.empty()) << p.problems.front() << "\n" << text;
  const std::string phase = "torchpilot_phase_seconds_total";
  EXPECT_EQ(p.get(phase, "phase", "fwd" + kReplacement), 1);
  EXPECT_EQ(p.get(phase, "phase", "euro\xe2\x82\xac"), 2);
  EXPECT_EQ(p.get(phase, "phase",
                  "ctl" + kReplacement + kReplacement + kReplacement + kReplacement + "."),
            5);
  int x_series = 0;
  for (const Sample& sample : p.samples) {
    if (sample.name == phase && sample.labels.at("phase") == "x" + kReplacement) {
      ++x_series;
      EXPECT_EQ(sample.value, 13);
    }
  }
  EXPECT_EQ(x_series, 1);
  EXPECT_EQ(p.get("torchpilot_steps_total", "rank", "r" + kReplacement), 0);
  EXPECT_EQ(p.get("torchpilot_advice_expected_gain_ratio", "id", "id" + kReplacement), 0.25);
  EXPECT_NE(
      text.find("# HELP torchpilot_odd_name_1 help " + kReplacement + " with \\\\ and\\nnewline\n"),
      std::string::npos)
      << text;
}

}  // namespace
}  // namespace torchpilot
