#include "prometheus_exporter.h"

#include <fcntl.h>
#include <httplib.h>
#include <netdb.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <nlohmann/json.hpp>
#include <thread>

#include "torchpilot/runtime/comm/comm_records.h"
#include "torchpilot/runtime/core/config.h"
#include "torchpilot/runtime/flops/flop_records.h"
#include "torchpilot/runtime/gpu/gpu_records.h"

namespace torchpilot {
namespace {

const char kReplacement[] = "\xef\xbf\xbd";  // U+FFFD, in UTF-8

// The text with each invalid UTF-8 sequence replaced by U+FFFD. nlohmann::json's dump replaces
// them (the JSON log relies on it too); parsing its output back gives the mended text.
std::string valid_utf8(const std::string& text) {
  if (std::all_of(text.begin(), text.end(), [](char c) { return (c & 0x80) == 0; })) return text;
  using nlohmann::json;
  return json::parse(json(text).dump(-1, ' ', false, json::error_handler_t::replace))
      .get<std::string>();
}

// A label value (quote: true) or a HELP text: valid UTF-8 with backslash, newline (and in a label
// the double quote) escaped, as the format asks. Other control characters become U+FFFD: the
// format has no escape for them, and a raw carriage return or NUL breaks line-based readers.
std::string escaped(const std::string& text, bool quote) {
  std::string out;
  for (char c : valid_utf8(text)) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '"' && quote) {
      out += "\\\"";
    } else if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
      out += kReplacement;
    } else {
      out += c;
    }
  }
  return out;
}

std::string label_value(const std::string& v) { return escaped(v, true); }

// A metric name matches [a-zA-Z_:][a-zA-Z0-9_:]*; any other byte becomes '_'.
std::string metric_name(std::string name) {
  for (size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':' ||
                    (i > 0 && c >= '0' && c <= '9');
    if (!ok) name[i] = '_';
  }
  return name.empty() ? "_" : name;
}

std::string value_text(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

// A bucket bound as written in code (0.0005, 2.5, 60), not its binary expansion.
std::string bound_text(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

class Writer {
 public:
  explicit Writer(const MetricsSnapshot& s) : base_("rank=\"" + label_value(s.rank) + "\"") {}
  // Names and help texts pass through metric_name and escaped; `labels` come escaped.
  void family(const std::string& name, const char* type, const std::string& help) {
    const std::string n = metric_name(name);
    out_ += "# HELP " + n + " " + escaped(help, false) + "\n# TYPE " + n + " " + type + "\n";
  }
  void sample(const std::string& name, double v, const std::string& labels = "") {
    out_ += metric_name(name) + "{" + base_ + (labels.empty() ? "" : "," + labels) + "} " +
            value_text(v) + "\n";
  }
  void one(const std::string& name, const char* type, const std::string& help, double v,
           const std::string& labels = "") {
    family(name, type, help);
    sample(name, v, labels);
  }
  std::string take() { return std::move(out_); }

 private:
  std::string base_;
  std::string out_;
};

// rank: the launcher's RANK (torchrun, Slurm wrappers), else 0.
std::string rank_from_env() {
  const char* r = std::getenv("RANK");
  return r != nullptr && *r != '\0' ? r : "0";
}

}  // namespace

std::string prometheus_text(const MetricsSnapshot& s) {
  Writer w(s);
  w.one("torchpilot_steps_total", "counter", "Training steps completed.",
        static_cast<double>(s.steps));
  w.one("torchpilot_samples_total", "counter",
        "Samples of the completed steps (0 if not reported).", static_cast<double>(s.samples));
  w.one("torchpilot_epochs_total", "counter", "Epochs completed.", static_cast<double>(s.epochs));
  // A histogram: p50/p90 of several ranks or scrapes aggregate from it (histogram_quantile over
  // sum by (le)); a per-epoch percentile gauge would not.
  w.family("torchpilot_step_duration_seconds", "histogram",
           "Step time, boundary to boundary (the wait for the batch included).");
  int64_t cumulative = 0;
  for (size_t i = 0; i < kStepSecondsBucketCount; ++i) {
    cumulative += s.step_buckets[i];
    w.sample("torchpilot_step_duration_seconds_bucket", static_cast<double>(cumulative),
             "le=\"" + bound_text(kStepSecondsBuckets[i]) + "\"");
  }
  w.sample("torchpilot_step_duration_seconds_bucket", static_cast<double>(s.steps), "le=\"+Inf\"");
  w.sample("torchpilot_step_duration_seconds_sum", s.step_seconds_sum);
  w.sample("torchpilot_step_duration_seconds_count", static_cast<double>(s.steps));
  w.one("torchpilot_last_step_duration_seconds", "gauge", "The latest step's time.",
        s.last_step_seconds);
  w.one("torchpilot_data_wait_seconds_total", "counter",
        "Time the training thread waited for batches.", s.data_wait_seconds);
  if (!s.phase_seconds.empty()) {
    // Two names may make one label (their invalid bytes replaced alike): one series, their sum.
    std::map<std::string, double> by_label;
    for (const auto& [phase, sec] : s.phase_seconds) by_label[label_value(phase)] += sec;
    w.family("torchpilot_phase_seconds_total", "counter", "Time in each phase of the steps.");
    for (const auto& [label, sec] : by_label) {
      w.sample("torchpilot_phase_seconds_total", sec, "phase=\"" + label + "\"");
    }
  }
  if (s.epochs > 0) {
    w.one("torchpilot_epoch_samples_per_second", "gauge", "The last epoch's throughput.",
          s.epoch_samples_per_second);
    w.one("torchpilot_epoch_data_wait_ratio", "gauge",
          "The last epoch's data wait as a share of step time.", s.epoch_data_wait_ratio);
  }
  if (s.has_mfu) {
    w.one("torchpilot_mfu_ratio", "gauge", "The last epoch's model FLOPs utilization.",
          s.mfu_ratio);
    w.one("torchpilot_hfu_ratio", "gauge", "The last epoch's hardware FLOPs utilization.",
          s.hfu_ratio);
  }
  if (s.has_comm) {
    w.one("torchpilot_communication_seconds_total", "counter",
          "Time collectives ran (their union), over the completed epochs.", s.comm_seconds);
    w.one("torchpilot_exposed_communication_seconds_total", "counter",
          "Of the communication time, the part the training thread waited for.",
          s.exposed_comm_seconds);
  }
  if (s.has_ranks) {
    w.one("torchpilot_ranks_reported", "gauge",
          "Ranks whose summary rank 0 had at the last epoch's end (rank 0 only).",
          static_cast<double>(s.ranks_reported));
    if (!s.stragglers.empty()) {
      w.family("torchpilot_straggler_excess_seconds", "gauge",
               "The last epoch's stragglers (rank 0 only; at most 8, largest first): compute and "
               "data wait per step above the ranks' median.");
      for (const auto& st : s.stragglers) {
        w.sample("torchpilot_straggler_excess_seconds", st.excess_seconds,
                 "straggler_rank=\"" + std::to_string(st.rank) + "\"");
      }
    }
  }
  const std::string device =
      s.gpu_device.empty() ? std::string() : "device=\"" + label_value(s.gpu_device) + "\"";
  for (const auto& [name, v] : s.gpu) {
    w.one("torchpilot_gpu_" + name + "_ratio", "gauge",
          "The latest step's GPU " + name + " (docs/metrics.md).", v, device);
  }
  if (!s.advice.empty()) {
    w.family("torchpilot_advice_expected_gain_ratio", "gauge",
             "The last epoch's advice by id: expected throughput gain (0.4 = +40%).");
    for (const auto& a : s.advice) {
      w.sample("torchpilot_advice_expected_gain_ratio", a.expected_gain,
               "id=\"" + label_value(a.id) + "\"");
    }
    w.family("torchpilot_advice_severity", "gauge",
             "The last epoch's advice by id: its severity (1 info, 2 warning, 3 high).");
    for (const auto& a : s.advice) {
      w.sample("torchpilot_advice_severity", a.severity, "id=\"" + label_value(a.id) + "\"");
    }
  }
  for (const auto& [name, hv] : s.extra) w.one(name, "gauge", hv.first, hv.second);
  return w.take();
}

namespace {

using Monotonic = std::chrono::steady_clock;  // real time (torchpilot::Clock is for the steps)

// The request head a connection may send before it is answered (cpp-httplib's own bound).
constexpr size_t kMaxRequestHead = 8192;

// A connection as cpp-httplib reads and writes it. It reads the request head the gate has read,
// then the end of the stream: GET /metrics has no body, so a client cannot hold a worker by
// sending one slowly (a POST that announces one is answered 400 at once). Each write waits at most
// until the connection's deadline, and no longer once the endpoint stops (`stop_fd` readable).
class RequestStream : public httplib::Stream {
 public:
  RequestStream(int fd, std::string head, Monotonic::time_point deadline, int stop_fd)
      : fd_(fd), head_(std::move(head)), deadline_(deadline), stop_fd_(stop_fd) {}

  bool is_readable() const override { return read_ < head_.size(); }
  bool is_writable() const override { return wait_writable(); }

  ssize_t read(char* ptr, size_t size) override {
    const size_t n = std::min(size, head_.size() - read_);
    std::memcpy(ptr, head_.data() + read_, n);
    read_ += n;
    return static_cast<ssize_t>(n);
  }
  ssize_t write(const char* ptr, size_t size) override {
    return wait_writable() ? ::send(fd_, ptr, size, MSG_NOSIGNAL) : -1;
  }

  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    address(::getpeername, ip, port);
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    address(::getsockname, ip, port);
  }
  socket_t socket() const override { return fd_; }

 private:
  // False at the deadline or when the endpoint stops.
  bool wait_writable() const {
    for (;;) {
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline_ - Monotonic::now());
      if (left.count() <= 0) return false;
      pollfd fds[2] = {{fd_, POLLOUT, 0}, {stop_fd_, POLLIN, 0}};
      const int n = ::poll(fds, 2, static_cast<int>(left.count()));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0 || fds[1].revents != 0) return false;
      if (fds[0].revents != 0) return true;
    }
  }
  void address(int (*get)(int, sockaddr*, socklen_t*), std::string& ip, int& port) const {
    sockaddr_storage addr{};
    socklen_t len = sizeof addr;
    char host[NI_MAXHOST] = "", serv[NI_MAXSERV] = "0";
    if (get(fd_, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
      ::getnameinfo(reinterpret_cast<sockaddr*>(&addr), len, host, sizeof host, serv, sizeof serv,
                    NI_NUMERICHOST | NI_NUMERICSERV);
    }
    ip = host;
    port = std::atoi(serv);
  }

  int fd_;
  std::string head_;
  size_t read_ = 0;
  Monotonic::time_point deadline_;
  int stop_fd_;
};

}  // namespace

// cpp-httplib's Server parses and answers the requests; this class brings it its connections.
// Left to itself, cpp-httplib 0.11 serves a connection on a pool thread for as long as the client
// sends something within each 5 s read timeout, and its stop() waits for those connections: one
// slow client held every scrape and the program's exit. Here instead, as the slowloris-proof
// servers do (nginx's client_header_timeout, Go's ReadHeaderTimeout with a connection limit):
//  - one thread (the gate) accepts and waits, with poll(), until each connection has sent its
//    whole request head, holding only its socket meanwhile; one still short of it at its deadline
//    is closed, and so is one over limits.max_connections, at once;
//  - two workers answer complete requests from what the gate read (RequestStream), their writes
//    bounded by the same deadline;
//  - one request a connection (Connection: close), so a connection never waits idle;
//  - the destructor writes to a pipe that every poll() watches, closes every socket and joins:
//    it waits for no client.
class PrometheusSink::Endpoint : public httplib::Server {
 public:
  Endpoint(PrometheusLimits limits, std::shared_ptr<spdlog::logger> logger)
      : limits_(limits), logger_(std::move(logger)) {
    if (::pipe2(stop_pipe_, O_CLOEXEC) != 0) stop_pipe_[0] = stop_pipe_[1] = -1;
  }
  ~Endpoint() override {
    if (gate_.joinable()) {
      stopping_ = true;
      const char byte = 1;
      while (::write(stop_pipe_[1], &byte, 1) < 0 && errno == EINTR) {
      }
      gate_.join();          // it closes the connections still sending their requests
      workers_->shutdown();  // the queued close at once; those answering see the pipe
    }
    const socket_t listening = svr_sock_.exchange(INVALID_SOCKET);
    if (listening != INVALID_SOCKET) ::close(listening);
    for (int fd : stop_pipe_) {
      if (fd >= 0) ::close(fd);
    }
  }

  // Serves on the socket bound by bind_to_port or bind_to_any_port; false if it cannot.
  bool start() {
    const int flags = ::fcntl(svr_sock_, F_GETFL);
    if (stop_pipe_[0] < 0 || flags < 0 || ::fcntl(svr_sock_, F_SETFL, flags | O_NONBLOCK) != 0) {
      return false;
    }
    // cpp-httplib listens with a backlog of 5: a burst of connections beyond it has its SYNs
    // dropped and retried a second later. Listening again sets the queue's length.
    ::listen(svr_sock_, limits_.max_connections);
    // No thread to be had (RLIMIT_NPROC, say): no endpoint, and nothing left running.
    try {
      workers_ = std::make_unique<httplib::ThreadPool>(2);
      gate_ = std::thread([this] { run_gate(); });
    } catch (...) {
      if (workers_) workers_->shutdown();
      return false;
    }
    return true;
  }

 private:
  struct Pending {  // a connection still sending its request head
    int fd;
    Monotonic::time_point deadline;
    std::string head;
  };

  // The gate's loop, guarded: out of memory, it closes what it holds and stops serving (one log
  // line) instead of ending the program.
  void run_gate() {
    std::vector<Pending> pending;
    try {
      gate_loop(pending);
    } catch (...) {
      logger_->warn("Prometheus endpoint off: its connection thread failed (out of memory?)");
    }
    for (const Pending& p : pending) close_connection(p.fd);
  }

  void gate_loop(std::vector<Pending>& pending) {
    std::vector<pollfd> fds;
    auto paused_until = Monotonic::time_point::min();  // accept() out of descriptors
    while (!stopping_) {
      auto now = Monotonic::now();
      auto wake = now + std::chrono::hours(1);
      fds.assign(
          {{stop_pipe_[0], POLLIN, 0}, {now < paused_until ? -1 : svr_sock_.load(), POLLIN, 0}});
      if (now < paused_until) wake = std::min(wake, paused_until);
      for (const Pending& p : pending) {
        fds.push_back({p.fd, POLLIN, 0});
        wake = std::min(wake, p.deadline);
      }
      const auto wait = std::chrono::ceil<std::chrono::milliseconds>(wake - now).count();
      if (::poll(fds.data(), fds.size(), static_cast<int>(std::max<long>(wait, 0))) < 0) {
        if (errno != EINTR) std::this_thread::sleep_for(std::chrono::milliseconds(10));  // ENOMEM
        continue;
      }
      if (fds[0].revents != 0) break;
      now = Monotonic::now();
      // Reads what each connection sent; a complete head goes to a worker.
      std::vector<Pending> still;
      for (size_t i = 0; i < pending.size(); ++i) {
        Pending& p = pending[i];
        bool keep = now < p.deadline;
        if (keep && fds[2 + i].revents != 0) keep = read_head(p);
        if (keep && p.head.find("\r\n\r\n") != std::string::npos) {
          answer(std::move(p));
        } else if (keep) {
          still.push_back(std::move(p));
        } else {
          close_connection(p.fd);
        }
      }
      pending.swap(still);
      if (fds[1].revents != 0) accept_all(pending, paused_until);
    }
  }

  // Reads what the connection has sent; false when it closed, failed or sent too long a head.
  static bool read_head(Pending& p) {
    char buf[4096];
    const ssize_t n = ::recv(p.fd, buf, sizeof buf, 0);
    if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
    if (n == 0) return false;
    p.head.append(buf, static_cast<size_t>(n));
    return p.head.size() <= kMaxRequestHead;
  }

  void accept_all(std::vector<Pending>& pending, Monotonic::time_point& paused_until) {
    // At most a cap's worth a round: a flood of connections must not keep the gate from its
    // poll() (the stop pipe, the deadlines, the complete requests).
    for (int round = 0; round < limits_.max_connections + 1 && !stopping_; ++round) {
      const int fd = ::accept4(svr_sock_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        // Out of descriptors: the connection stays queued; accept() again in a while.
        if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
          paused_until = Monotonic::now() + std::chrono::milliseconds(100);
        }
        if (errno == EINTR || errno == ECONNABORTED) continue;
        return;  // EAGAIN: none left
      }
      if (open_ >= limits_.max_connections) {
        ::close(fd);
        if (!warned_) {
          warned_ = true;
          logger_->warn(
              "Prometheus endpoint: {} connections open, its limit; further ones are closed until "
              "some end (a connection has {} ms to send its request and read the answer)",
              limits_.max_connections, limits_.request_deadline.count());
        }
        continue;
      }
      ++open_;
      pending.push_back({fd, Monotonic::now() + limits_.request_deadline, {}});
    }
  }

  void answer(Pending p) {
    workers_->enqueue([this, fd = p.fd, head = std::move(p.head), deadline = p.deadline] {
      if (!stopping_) {
        try {
          RequestStream stream(fd, head, deadline, stop_pipe_[0]);
          bool closed = false;
          process_request(stream, /*close_connection=*/true, closed, nullptr);
        } catch (...) {  // out of memory, say: this connection ends, the endpoint goes on
        }
      }
      close_connection(fd);
    });
  }

  void close_connection(int fd) {
    ::close(fd);
    --open_;
  }

  const PrometheusLimits limits_;
  const std::shared_ptr<spdlog::logger> logger_;
  int stop_pipe_[2] = {-1, -1};
  std::atomic<bool> stopping_{false};
  std::atomic<int> open_{0};  // connections accepted and not yet closed
  bool warned_ = false;       // gate thread
  std::unique_ptr<httplib::ThreadPool> workers_;
  std::thread gate_;
};

PrometheusSink::PrometheusSink(const std::string& address, int port,
                               std::shared_ptr<spdlog::logger> logger, PrometheusLimits limits)
    : endpoint_(std::make_unique<Endpoint>(limits, logger)) {
  state_.rank = rank_from_env();
  published_ = state_;
  endpoint_->Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(scrape(), "text/plain; version=0.0.4; charset=utf-8");
  });
  // SO_REUSEADDR only (a restart binds through TIME_WAIT); no SO_REUSEPORT, which would let a
  // second process share the port silently.
  endpoint_->set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, reinterpret_cast<const void*>(&yes), sizeof yes);
  });
  bool ok = false;
  if (port == 0) {
    port_ = endpoint_->bind_to_any_port(address);
    ok = port_ > 0;
  } else {
    port_ = port;
    ok = endpoint_->bind_to_port(address, port);
  }
  if (!ok) {
    logger->warn("Prometheus endpoint off: cannot bind {}:{} (in use, or not an address here)",
                 address, port);
    endpoint_.reset();
    return;
  }
  if (!endpoint_->start()) {
    logger->warn(
        "Prometheus endpoint off: {}:{} bound, but its threads or stop pipe could not "
        "be made ({})",
        address, port_, std::strerror(errno));
    endpoint_.reset();
    return;
  }
  logger->info("Prometheus metrics at http://{}:{}/metrics", address, port_);
}

PrometheusSink::~PrometheusSink() = default;

std::string PrometheusSink::scrape() const {
  MetricsSnapshot copy;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    copy = published_;
  }
  return prometheus_text(copy);
}

void PrometheusSink::publish() {
  // Never waits for a scrape: a busy mutex leaves the copy to the next update.
  std::unique_lock<std::mutex> lock(mutex_, std::try_to_lock);
  if (lock.owns_lock()) published_ = state_;
}

void PrometheusSink::on_step(const StepRecord& r, const std::vector<std::string>& phase_names) {
  ++state_.steps;
  state_.samples += r.samples;
  const double sec = static_cast<double>(r.step_ns()) / 1e9;
  state_.step_seconds_sum += sec;
  state_.last_step_seconds = sec;
  // The first bucket whose bound holds the step (le: less or equal), else the one above all.
  const double* bound =
      std::lower_bound(std::begin(kStepSecondsBuckets), std::end(kStepSecondsBuckets), sec);
  ++state_.step_buckets[bound - std::begin(kStepSecondsBuckets)];
  state_.data_wait_seconds += static_cast<double>(r.data_wait_ns) / 1e9;
  for (size_t i = 0; i < phase_names.size() && i < r.phase_ns.size(); ++i) {
    if (r.phase_ns[i] > 0 || state_.phase_seconds.count(phase_names[i]) > 0) {
      state_.phase_seconds[phase_names[i]] += static_cast<double>(r.phase_ns[i]) / 1e9;
    }
  }
  publish();
}

void PrometheusSink::on_late_step(const LateStepRecord& r) {
  const GpuStepRecord* g = r.get<GpuStepRecord>();
  if (g == nullptr) return;
  if (state_.gpu_device.empty() && g->device_index >= 0) {
    state_.gpu_device = std::to_string(g->device_index);
  }
  auto set = [this](const char* name, double v) {
    if (measured(v)) state_.gpu[name] = v;
  };
  set("counter_utilization", g->stats.counter_utilization);
  set("sm_efficiency", g->stats.sm_efficiency);
  set("tensor_activity", g->stats.tensor_activity);
  set("dram_throughput", g->stats.dram_throughput);
  set("achieved_occupancy", g->stats.achieved_occupancy);
  set("nvml_utilization", g->stats.nvml_utilization);
  publish();
}

void PrometheusSink::on_epoch(const EpochSummary& e, const std::vector<Advice>& advice) {
  ++state_.epochs;
  state_.epoch_samples_per_second = e.samples_per_s;
  state_.epoch_data_wait_ratio = e.data_wait_fraction;
  if (const auto* c = e.sections.get<CommEpochStats>(); c != nullptr) {
    state_.has_comm = true;
    state_.comm_seconds += static_cast<double>(c->stats.comm_ns) / 1e9;
    state_.exposed_comm_seconds += static_cast<double>(c->stats.exposed_ns) / 1e9;
  }
  if (const auto* r = e.sections.get<RankEpochStats>(); r != nullptr) {
    state_.has_ranks = true;
    state_.ranks_reported = r->ranks_reported;
    state_.stragglers.clear();
    for (const Straggler& st : r->stragglers) {
      state_.stragglers.push_back({st.rank, st.excess_ns / 1e9});
    }
    std::sort(state_.stragglers.begin(), state_.stragglers.end(),
              [](const auto& a, const auto& b) { return a.excess_seconds > b.excess_seconds; });
    if (state_.stragglers.size() > MetricsSnapshot::kMaxStragglers) {
      state_.stragglers.resize(MetricsSnapshot::kMaxStragglers);
    }
  }
  if (const auto* f = e.sections.get<FlopEpochStats>(); f != nullptr && measured(f->mfu)) {
    state_.has_mfu = true;
    state_.mfu_ratio = f->mfu;
    state_.hfu_ratio = f->hfu;
  }
  state_.advice.clear();
  for (const Advice& a : advice) {
    state_.advice.push_back({a.id, static_cast<int>(a.severity) + 1, a.expected_gain});
  }
  publish();
}

namespace {

std::shared_ptr<Sink> make_prometheus_sink(const Config& config,
                                           const std::shared_ptr<spdlog::logger>& logger) {
  if (config.report.prometheus_port == 0) return nullptr;
  auto sink = std::make_shared<PrometheusSink>(config.report.prometheus_address,
                                               config.report.prometheus_port, logger);
  if (!sink->serving()) return nullptr;
  return sink;
}

const bool registered = [] {
  register_default_sink("prometheus", 40, &make_prometheus_sink);
  return true;
}();

}  // namespace
}  // namespace torchpilot

// Named on the link line (CMake) so that static linking keeps the registration.
extern "C" void torchpilot_prometheus_anchor() {}
