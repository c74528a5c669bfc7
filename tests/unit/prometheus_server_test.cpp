// The endpoint as Prometheus itself reads it (Debian's prometheus package: promtool and the
// server; each test skips, saying so, where it is not installed): promtool's check of a real
// scrape, and a real server on loopback scraping two ranks (two processes, RANK 0 and 1) whose
// figures aggregate with sum by, the step-time histogram included.
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <spdlog/sinks/null_sink.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "torchpilot/hooks/reports/prometheus_exporter.h"
#include "torchpilot/runtime/core/pilot.h"
#include "unit/temp_dir.h"

namespace torchpilot {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

bool installed(const std::string& program) {
  return std::system(("command -v " + program + " > /dev/null 2>&1").c_str()) == 0;
}

// A Pilot of `steps` steps of `step_ms` each, epochs of 20 steps, data wait planted so that an
// advisor speaks, reporting to `sink`.
void train(const std::shared_ptr<PrometheusSink>& sink, int steps, int step_ms) {
  PilotOptions o;
  o.logger = std::make_shared<spdlog::logger>("prom-train",
                                              std::make_shared<spdlog::sinks::null_sink_mt>());
  o.sinks = {sink};
  Config c;
  c.gpu.enabled = false;
  Pilot pilot(c, o);
  for (int i = 0; i < steps; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(step_ms / 2));  // the wait for data
    pilot.record_data_wait(step_ms / 2 * 1000000LL);
    {
      auto s = pilot.step(8);
      auto f = pilot.phase("forward");
      std::this_thread::sleep_for(std::chrono::milliseconds(step_ms - step_ms / 2));
    }
    if (i % 20 == 19) pilot.end_epoch();
  }
}

TEST(PrometheusServerTest, PromtoolFindsNoProblemInARealScrape) {
  if (!installed("promtool")) GTEST_SKIP() << "promtool not installed (Debian package prometheus)";
  auto logger =
      std::make_shared<spdlog::logger>("prom", std::make_shared<spdlog::sinks::null_sink_mt>());
  auto sink = std::make_shared<PrometheusSink>("127.0.0.1", 0, logger);
  ASSERT_TRUE(sink->serving());
  train(sink, 60, 2);
  httplib::Client client("127.0.0.1", sink->port());
  client.set_read_timeout(5, 0);
  auto res = client.Get("/metrics");
  ASSERT_TRUE(res) << httplib::to_string(res.error());
  ASSERT_NE(res->body.find("torchpilot_advice_severity"), std::string::npos) << res->body;
  torchpilot_test::TempDir dir;
  const std::string body = dir.write("metrics.txt", res->body);
  const std::string out = dir.file("promtool.txt");
  const int rc = std::system(
      ("timeout 30 promtool check metrics < '" + body + "' > '" + out + "' 2>&1").c_str());
  std::ifstream in(out);
  std::stringstream said;
  said << in.rdbuf();
  EXPECT_EQ(rc, 0) << said.str() << "\n" << res->body;
  EXPECT_EQ(said.str(), "") << res->body;
}

// A free loopback port (bound, then released for the server to take).
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  int port = -1;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  ::close(fd);
  return port;
}

// Children killed (and reaped) when the test ends, however it ends.
struct Children {
  std::vector<pid_t> pids;
  ~Children() {
    for (pid_t p : pids) ::kill(p, SIGKILL);
    for (pid_t p : pids) ::waitpid(p, nullptr, 0);
  }
};

// One rank in a child process: its endpoint's port to `port_fd`, then steps until the parent
// closes `stop_fd` (or 60 s, so that a lost parent never leaves it running).
[[noreturn]] void rank_process(int rank, int step_ms, int port_fd, int stop_fd) {
  ::setenv("RANK", std::to_string(rank).c_str(), 1);
  auto logger =
      std::make_shared<spdlog::logger>("rank", std::make_shared<spdlog::sinks::null_sink_mt>());
  auto sink = std::make_shared<PrometheusSink>("127.0.0.1", 0, logger);
  const int port = sink->serving() ? sink->port() : -1;
  if (::write(port_fd, &port, sizeof port) != sizeof port) ::_exit(3);
  const auto end = Clock::now() + std::chrono::seconds(60);
  while (Clock::now() < end) {
    pollfd p{stop_fd, POLLIN, 0};
    if (::poll(&p, 1, 0) != 0) break;  // the parent closed it (or wrote): stop
    train(sink, 20, step_ms);
  }
  ::_exit(0);
}

// The server's answer to an instant query: its result vector.
json query(int port, const std::string& promql) {
  httplib::Client client("127.0.0.1", port);
  client.set_connection_timeout(2, 0);
  client.set_read_timeout(5, 0);
  auto res = client.Get("/api/v1/query", httplib::Params{{"query", promql}}, httplib::Headers{});
  if (!res || res->status != 200) return json();
  const json j = json::parse(res->body, nullptr, false);
  if (j.is_discarded() || j.value("status", "") != "success") return json();
  return j["data"]["result"];
}

double scalar_of(const json& result) {
  if (!result.is_array() || result.size() != 1) return std::nan("");
  return std::stod(result[0]["value"][1].get<std::string>());
}

TEST(PrometheusServerTest, ARealServerScrapesTwoRanksThatAggregateWithSumBy) {
  if (!installed("prometheus")) {
    GTEST_SKIP() << "prometheus not installed (Debian package prometheus)";
  }
  Children children;
  int ports[2] = {-1, -1};
  int stop[2];
  ASSERT_EQ(::pipe(stop), 0);
  for (int rank = 0; rank < 2; ++rank) {
    int port_pipe[2];
    ASSERT_EQ(::pipe(port_pipe), 0);
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      ::close(stop[1]);
      ::close(port_pipe[0]);
      rank_process(rank, rank == 0 ? 2 : 4, port_pipe[1], stop[0]);
    }
    children.pids.push_back(pid);
    ::close(port_pipe[1]);
    pollfd p{port_pipe[0], POLLIN, 0};
    ASSERT_EQ(::poll(&p, 1, 10000), 1) << "rank " << rank << " did not start its endpoint";
    ASSERT_EQ(::read(port_pipe[0], &ports[rank], sizeof(int)), static_cast<ssize_t>(sizeof(int)));
    ::close(port_pipe[0]);
    ASSERT_GT(ports[rank], 0) << "rank " << rank << " could not bind";
  }
  ::close(stop[0]);

  torchpilot_test::TempDir dir;
  const int server_port = free_port();
  ASSERT_GT(server_port, 0);
  const std::string config = dir.write(
      "prometheus.yml",
      "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
      "scrape_configs:\n  - job_name: torchpilot\n    static_configs:\n"
      "      - targets: ['127.0.0.1:" +
          std::to_string(ports[0]) + "', '127.0.0.1:" + std::to_string(ports[1]) + "']\n");
  const std::string tsdb = dir.file("tsdb");
  const std::string listen = "--web.listen-address=127.0.0.1:" + std::to_string(server_port);
  const std::string server_log = dir.file("server.log");
  const pid_t server = ::fork();
  ASSERT_GE(server, 0);
  if (server == 0) {
    std::freopen(server_log.c_str(), "w", stderr);
    std::freopen("/dev/null", "w", stdout);
    const std::string cfg = "--config.file=" + config;
    const std::string storage = "--storage.tsdb.path=" + tsdb;
    ::execlp("prometheus", "prometheus", cfg.c_str(), storage.c_str(), listen.c_str(),
             static_cast<char*>(nullptr));
    ::_exit(127);
  }
  children.pids.push_back(server);

  // Both targets up and at least three scrapes of each (a rate needs two) within 40 s.
  const auto deadline = Clock::now() + std::chrono::seconds(40);
  double up = 0, scrapes = 0;
  while (Clock::now() < deadline) {
    up = scalar_of(query(server_port, "count(up{job=\"torchpilot\"} == 1)"));
    scrapes = scalar_of(query(server_port, "min(count_over_time(up{job=\"torchpilot\"}[1m]))"));
    if (up == 2 && scrapes >= 3) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
  }
  std::ifstream log_in(server_log);
  std::stringstream server_said;
  server_said << log_in.rdbuf();
  ASSERT_EQ(up, 2) << "targets not up; the server said:\n" << server_said.str();
  ASSERT_GE(scrapes, 3);

  // One evaluation instant for the per-rank series and their sum.
  const json per_rank = query(server_port, "sum by (rank) (torchpilot_steps_total)");
  ASSERT_TRUE(per_rank.is_array());
  ASSERT_EQ(per_rank.size(), 2u) << per_rank.dump();
  double parts = 0;
  for (const auto& r : per_rank) parts += std::stod(r["value"][1].get<std::string>());
  const double total = scalar_of(query(server_port, "sum(torchpilot_steps_total)"));
  EXPECT_GT(total, 0);
  EXPECT_DOUBLE_EQ(total, parts);

  // The step-time histogram of both ranks (2 and 4 ms steps) aggregated: a median between.
  const double p50 = scalar_of(query(
      server_port,
      "histogram_quantile(0.5, sum by (le) (rate(torchpilot_step_duration_seconds_bucket[1m])))"));
  EXPECT_GT(p50, 0.001) << "p50 " << p50;
  EXPECT_LT(p50, 0.05) << "p50 " << p50;
  // Per rank, from the same buckets: the slower rank's median is the larger.
  const json by_rank = query(server_port,
                             "histogram_quantile(0.5, sum by (rank, le) "
                             "(rate(torchpilot_step_duration_seconds_bucket[1m])))");
  ASSERT_EQ(by_rank.size(), 2u) << by_rank.dump();
  double median[2] = {0, 0};
  for (const auto& r : by_rank) {
    median[std::stoi(r["metric"]["rank"].get<std::string>())] =
        std::stod(r["value"][1].get<std::string>());
  }
  EXPECT_LT(median[0], median[1]) << by_rank.dump();
  ::close(stop[1]);  // the ranks stop; the guard kills what is left
}

}  // namespace
}  // namespace torchpilot
