// The Prometheus endpoint, scraped over loopback with cpp-httplib's client and parsed as the text
// exposition format: families with HELP and TYPE, names by the conventions, label sets that stay
// fixed (rank on every sample, device on GPU figures only, severity never a label), the step time
// as a histogram; and, where Debian's prometheus package is installed, promtool's check and a real
// Prometheus server scraping two ranks.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

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
      for (const char* suffix : {"_sum", "_count", "_bucket"}) {
        const std::string sx(suffix);
        if (!p.types.count(family) && family.size() > sx.size() &&
            family.compare(family.size() - sx.size(), sx.size(), sx) == 0) {
          family = family.substr(0, family.size() - sx.size());
        }
      }
      if (!p.types.count(family)) p.problems.push_back("sample before its TYPE: " + s.name);
      if (!s.labels.count("rank")) p.problems.push_back("no rank label: " + line);
      if (s.labels.count("device") && s.name.rfind("torchpilot_gpu_", 0) != 0)
        p.problems.push_back("a device label outside the GPU figures: " + line);
      if (s.labels.count("severity")) p.problems.push_back("severity as a label: " + line);
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

using SteadyClock = std::chrono::steady_clock;

double seconds_since(SteadyClock::time_point start) {
  return std::chrono::duration<double>(SteadyClock::now() - start).count();
}

// A raw loopback connection whose every call (connect included) gives up after 5 s, so that no
// client in these tests can hang. -1 if it could not connect.
int connect_to(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  timeval tv{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

bool send_text(int fd, const std::string& text) {
  return ::send(fd, text.data(), text.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(text.size());
}

// Hostile clients, a quarter of each kind: some send a request line and then a header line every
// 200 ms without ever ending the request head (slowloris); some send a whole head announcing a
// body and then the body a byte every 200 ms; the others connect and send nothing. They stop when
// told, or after 15 s whatever happens, so that the test ends even on a server that waits for them.
class SlowClients {
 public:
  SlowClients(int port, int count) {
    for (int i = 0; i < count; ++i) {
      const int fd = connect_to(port);
      if (fd >= 0) fds_.push_back(fd);
    }
    thread_ = std::thread([this] {
      const auto end = SteadyClock::now() + std::chrono::seconds(15);
      for (size_t i = 0; i < fds_.size(); i += 2) {
        send_text(fds_[i], i % 4 == 0 ? "GET /metrics HTTP/1.1\r\n"
                                      : "POST /metrics HTTP/1.1\r\nContent-Length: 100000\r\n\r\n");
      }
      while (!stop_ && SteadyClock::now() < end) {
        for (size_t i = 0; i < fds_.size(); i += 2)
          send_text(fds_[i], i % 4 == 0 ? "X-Slow: 1\r\n" : "x");
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
      }
    });
  }
  ~SlowClients() {
    stop_ = true;
    thread_.join();
    for (int fd : fds_) ::close(fd);
  }
  size_t connected() const { return fds_.size(); }

 private:
  std::vector<int> fds_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

TEST(PrometheusTest, AScrapeOverLoopbackParsesAndCarriesTheRunsFigures) {
  std::ostringstream log;
  auto logger = logger_to(log);
  auto sink = std::make_shared<PrometheusSink>("127.0.0.1", 0, logger);
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
  // Starved: the data_starvation advice, by id; its severity the value of its own gauge.
  EXPECT_GT(p.get("torchpilot_advice_expected_gain_ratio", "id", "data_starvation"), 0);
  EXPECT_GE(p.get("torchpilot_advice_severity", "id", "data_starvation"), 1);
  // Step time as a histogram: five steps of 10 ms, in the buckets from le="0.01" up.
  EXPECT_EQ(p.types.at("torchpilot_step_duration_seconds"), "histogram");
  EXPECT_EQ(p.get("torchpilot_step_duration_seconds_bucket", "le", "0.005"), 0);
  EXPECT_EQ(p.get("torchpilot_step_duration_seconds_bucket", "le", "0.01"), 5);
  EXPECT_EQ(p.get("torchpilot_step_duration_seconds_bucket", "le", "+Inf"), 5);
  // No GPU observed: no device label anywhere.
  for (const Sample& s : p.samples) {
    EXPECT_EQ(s.labels.at("rank"), "0");
    EXPECT_EQ(s.labels.count("device"), 0u) << s.name;
  }
}

// Buckets are cumulative and each step lands in the first bucket whose bound holds it; a step
// over a minute only in +Inf.
TEST(PrometheusTest, StepTimesFallIntoCumulativeBuckets) {
  MetricsSnapshot s;
  for (double sec : {0.0004, 0.0005, 0.003, 0.003, 0.2, 75.0}) {
    ++s.steps;
    s.step_seconds_sum += sec;
    ++s.step_buckets[std::lower_bound(std::begin(kStepSecondsBuckets),
                                      std::end(kStepSecondsBuckets), sec) -
                     std::begin(kStepSecondsBuckets)];
  }
  const Parsed p = parse(prometheus_text(s));
  EXPECT_TRUE(p.problems.empty()) << p.problems.front();
  EXPECT_EQ(p.get("torchpilot_step_duration_seconds_bucket", "le", "0.0005"), 2);
  EXPECT_EQ(p.get("torchpilot_step_duration_seconds_bucket", "le", "0.0025"), 2);
  EXPECT_EQ(p.get("torchpilot_step_duration_seconds_bucket", "le", "0.005"), 4);
  EXPECT_EQ(p.get("torchpilot_step_duration_seconds_bucket", "le", "0.25"), 5);
  EXPECT_EQ(p.get("torchpilot_step_duration_seconds_bucket", "le", "60"), 5);
  EXPECT_EQ(p.get("torchpilot_step_duration_seconds_bucket", "le", "+Inf"), 6);
  EXPECT_EQ(p.get("torchpilot_step_duration_seconds_count"), 6);
}

// A series keeps its labels when an advice changes severity, and the GPU figures carry the
// device observed; the fleet's figures (communication, stragglers) carry the rank.
TEST(PrometheusTest, LabelSetsStayFixedAndTheFleetFiguresCarryTheRank) {
  MetricsSnapshot s;
  s.rank = "3";
  s.gpu_device = "1";
  s.gpu["sm_efficiency"] = 0.5;
  s.has_comm = true;
  s.comm_seconds = 2;
  s.exposed_comm_seconds = 0.5;
  s.has_ranks = true;
  s.ranks_reported = 4;
  s.stragglers = {{2, 0.02}};
  s.advice = {{"host_sync", 2, 0.1}};
  const Parsed warning = parse(prometheus_text(s));
  s.advice = {{"host_sync", 3, 0.4}};
  const Parsed high = parse(prometheus_text(s));
  EXPECT_TRUE(warning.problems.empty()) << warning.problems.front();
  auto labels_of = [](const Parsed& p, const std::string& name) {
    for (const Sample& x : p.samples) {
      if (x.name == name) return x.labels;
    }
    return std::map<std::string, std::string>{};
  };
  EXPECT_EQ(labels_of(warning, "torchpilot_advice_expected_gain_ratio"),
            labels_of(high, "torchpilot_advice_expected_gain_ratio"));
  EXPECT_EQ(warning.get("torchpilot_advice_severity", "id", "host_sync"), 2);
  EXPECT_EQ(high.get("torchpilot_advice_severity", "id", "host_sync"), 3);
  EXPECT_EQ(labels_of(high, "torchpilot_gpu_sm_efficiency_ratio").at("device"), "1");
  EXPECT_EQ(high.get("torchpilot_communication_seconds_total", "rank", "3"), 2);
  EXPECT_EQ(high.get("torchpilot_exposed_communication_seconds_total", "rank", "3"), 0.5);
  EXPECT_EQ(high.get("torchpilot_ranks_reported"), 4);
  EXPECT_DOUBLE_EQ(high.get("torchpilot_straggler_excess_seconds", "straggler_rank", "2"), 0.02);
}

TEST(PrometheusTest, APortInUseIsOneLogLineAndNoEndpoint) {
  std::ostringstream log;
  auto logger = logger_to(log);
  PrometheusSink first("127.0.0.1", 0, logger);
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
    PrometheusSink sink("127.0.0.1", 0, logger);
    EXPECT_TRUE(sink.serving());
  }  // each destructor must return (it used to wait in accept() for ever)
}

// While 50 slow clients hold connections, a well-behaved scraper is answered at once, and the
// sink's destructor (the trainer's exit) does not wait for the slow clients.
TEST(PrometheusTest, SlowClientsNeitherBlockScrapesNorHoldTheExit) {
  std::ostringstream log;
  auto logger = logger_to(log);
  auto sink = std::make_unique<PrometheusSink>("127.0.0.1", 0, logger);
  ASSERT_TRUE(sink->serving()) << log.str();
  SlowClients slow(sink->port(), 50);
  ASSERT_EQ(slow.connected(), 50u);

  httplib::Client client("127.0.0.1", sink->port());
  client.set_connection_timeout(3);  // a hang bound: the check below is the 1 s
  client.set_read_timeout(3);
  client.set_write_timeout(3);
  for (int i = 0; i < 3; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    const auto start = SteadyClock::now();
    auto res = client.Get("/metrics");
    const double took = seconds_since(start);
    if (!res) {
      ADD_FAILURE() << "scrape " << i << ": " << httplib::to_string(res.error()) << " after "
                    << took << " s";
      continue;
    }
    EXPECT_EQ(res->status, 200);
    EXPECT_NE(res->body.find("torchpilot_steps_total"), std::string::npos);
    EXPECT_LT(took, 1.0) << "scrape " << i;
  }

  const auto start = SteadyClock::now();
  sink.reset();  // the slow clients are still sending
  EXPECT_LT(seconds_since(start), 2.0) << "the destructor waited for the slow clients";
}

// True when the server has closed `fd`: end of stream or reset, without waiting.
bool closed_by_server(int fd) {
  char byte;
  const ssize_t n = ::recv(fd, &byte, 1, MSG_DONTWAIT);
  return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK);
}

// A client that keeps sending header lines is closed at its deadline: the bound is on the whole
// request, not on each read.
TEST(PrometheusTest, ARequestStillArrivingAtItsDeadlineIsClosed) {
  std::ostringstream log;
  auto logger = logger_to(log);
  PrometheusLimits limits;
  limits.request_deadline = std::chrono::milliseconds(300);
  PrometheusSink sink("127.0.0.1", 0, logger, limits);
  ASSERT_TRUE(sink.serving()) << log.str();
  const int fd = connect_to(sink.port());
  ASSERT_GE(fd, 0);
  send_text(fd, "GET /metrics HTTP/1.1\r\n");
  const auto start = SteadyClock::now();
  bool closed = false;
  while (!closed && seconds_since(start) < 5) {  // a hang bound: the deadline is 0.3 s
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    send_text(fd, "X-Slow: 1\r\n");
    closed = closed_by_server(fd);
  }
  ::close(fd);
  EXPECT_TRUE(closed) << "still open after " << seconds_since(start) << " s";
  httplib::Client client("127.0.0.1", sink.port());
  client.set_read_timeout(3);
  auto res = client.Get("/metrics");
  ASSERT_TRUE(res) << httplib::to_string(res.error());
  EXPECT_EQ(res->status, 200);
}

// Over max_connections, a connection is closed as soon as it is accepted, with one warning line
// however many follow; a slot that frees up serves again.
TEST(PrometheusTest, AConnectionOverTheLimitIsClosedAtOnceWithOneLogLine) {
  std::ostringstream log;
  // The endpoint's thread logs the warning: a thread-safe sink.
  auto logger = std::make_shared<spdlog::logger>(
      "prom-test", std::make_shared<spdlog::sinks::ostream_sink_mt>(log));
  PrometheusLimits limits;
  limits.max_connections = 3;
  auto sink = std::make_unique<PrometheusSink>("127.0.0.1", 0, logger, limits);
  ASSERT_TRUE(sink->serving()) << log.str();
  std::vector<int> idle;
  for (int i = 0; i < 3; ++i) idle.push_back(connect_to(sink->port()));
  for (int i = 0; i < 2; ++i) {
    const int extra = connect_to(sink->port());
    ASSERT_GE(extra, 0);
    char byte;
    const ssize_t n = ::recv(extra, &byte, 1, 0);  // waits at most 5 s (connect_to)
    const int err = errno;
    ::close(extra);
    EXPECT_TRUE(n == 0 || (n < 0 && err == ECONNRESET))
        << "connection " << 4 + i << " not closed: " << std::strerror(err);
  }
  ::close(idle.back());
  idle.pop_back();
  httplib::Client client("127.0.0.1", sink->port());
  client.set_read_timeout(3);
  httplib::Result res = client.Get("/metrics");
  // The gate may take the new connection before it has seen the freed one close: try again.
  for (int i = 0; i < 20 && !res; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    res = client.Get("/metrics");
  }
  ASSERT_TRUE(res) << httplib::to_string(res.error());
  EXPECT_EQ(res->status, 200);
  sink.reset();
  for (int fd : idle) ::close(fd);
  const std::string text = log.str();
  const std::string line = "Prometheus endpoint: 3 connections open, its limit";
  EXPECT_NE(text.find(line), std::string::npos) << text;
  EXPECT_EQ(text.find(line), text.rfind(line)) << text;
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
  s.advice.push_back({"id\xff", 3, 0.25});
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
