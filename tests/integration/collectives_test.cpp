// Collectives across real processes: this executable starts copies of itself as ranks (2 or 4),
// each with a real Gloo process group over a FileStore or a TCPStore on loopback, a Pilot and
// torchpilot::Collectives; the ranks write their records (JSON lines), logs and results, and the
// tests read them. Scenarios: GradSync's gradients against one process on the concatenated batch;
// bytes observed; exposed communication without and with overlap; a planted straggler named on
// rank 0; auto-tune deciding the same at the same step on every rank; faults: a rank killed
// mid-epoch, a rank that stalls mid-exchange, a rank that joins late, a store whose server
// process dies (the store then runs in a process of its own).
#include "torchpilot/hooks/comm/collectives.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <torch/torch.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <vector>

#include "torchpilot/hooks/comm/grad_sync.h"
#include "torchpilot/torchpilot.h"

namespace {

using nlohmann::json;

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::atoi(v) : fallback;
}
std::string env_str(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? v : "";
}

// --- the ranks ---------------------------------------------------------------------------------

struct Mlp : torch::nn::Module {
  Mlp(int64_t width, int64_t depth) {
    for (int64_t i = 0; i < depth; ++i) {
      layers.push_back(register_module("l" + std::to_string(i), torch::nn::Linear(width, width)));
    }
  }
  torch::Tensor forward(torch::Tensor x) {
    for (size_t i = 0; i < layers.size(); ++i) {
      x = layers[i]->forward(x);
      if (i + 1 < layers.size()) x = torch::tanh(x);
    }
    return x;
  }
  std::vector<torch::nn::Linear> layers;
};

int64_t param_bytes(torch::nn::Module& m) {
  int64_t b = 0;
  for (const auto& p : m.parameters()) b += p.numel() * p.element_size();
  return b;
}

// Indices as samples: a rank can check it saw each one exactly once per epoch.
class SlowIndices : public torch::data::datasets::Dataset<SlowIndices> {
 public:
  SlowIndices(size_t n, int sleep_us) : n_(n), sleep_us_(sleep_us) {}
  torch::data::Example<> get(size_t i) override {
    std::this_thread::sleep_for(std::chrono::microseconds(sleep_us_));
    return {torch::full({16}, static_cast<float>(i)), torch::tensor(static_cast<int64_t>(i))};
  }
  torch::optional<size_t> size() const override { return n_; }

 private:
  size_t n_;
  int sleep_us_;
};

void write_result(const std::string& path, const json& j) {
  std::ofstream(path) << j.dump() << "\n";
}

// The store's server alone (TP_COLL_STORE_SERVER): the fault test kills this process.
int run_store_server() {
  c10d::TCPStoreOptions o;
  o.port = static_cast<uint16_t>(env_int("MASTER_PORT", 29500));
  o.isServer = true;
  o.waitWorkers = false;
  o.timeout = std::chrono::seconds(30);
  auto store = c10::make_intrusive<c10d::TCPStore>(env_str("MASTER_ADDR"), o);
  write_result(env_str("TP_COLL_DIR") + "/server.json", json{{"ready", true}});
  std::this_thread::sleep_for(std::chrono::seconds(120));  // a hang bound: the test kills it
  return 0;
}

int run_rank(const std::string& scenario) {
  torch::set_num_threads(1);
  const int rank = env_int("RANK", 0);
  const int world = env_int("WORLD_SIZE", 1);
  const std::string dir = env_str("TP_COLL_DIR");
  const std::string result = dir + "/result" + std::to_string(rank) + ".json";

  c10::intrusive_ptr<c10d::Store> store;
  if (!env_str("TP_COLL_FILESTORE").empty()) {
    store = c10::make_intrusive<c10d::FileStore>(env_str("TP_COLL_FILESTORE"), world);
  } else {
    c10d::TCPStoreOptions o;
    o.port = static_cast<uint16_t>(env_int("MASTER_PORT", 29500));
    const bool own_server = !env_str("TP_COLL_STORE_SERVER").empty();
    o.isServer = rank == 0 && !own_server;
    o.waitWorkers = !own_server;
    o.numWorkers = world;
    o.timeout = std::chrono::seconds(30);
    store = c10::make_intrusive<c10d::TCPStore>(env_str("MASTER_ADDR"), o);
  }
  auto options = c10d::ProcessGroupGloo::Options::create();
  options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
  options->timeout = std::chrono::seconds(env_int("TP_COLL_GLOO_TIMEOUT_S", 60));
  auto pg = c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, world, options);
  // A rank that joins late: its group is up (the others could not have started without it), its
  // Pilot and training start this much later.
  const int fault_rank = env_int("TP_COLL_FAULT_RANK", 1);
  if (scenario == "faults" && rank == fault_rank) {
    std::this_thread::sleep_for(std::chrono::milliseconds(env_int("TP_COLL_LATE_MS", 0)));
  }

  torchpilot::Pilot pilot(torchpilot::Config::load());
  torchpilot::Collectives collectives(pilot, pg, store);
  json out = {{"rank", rank}};

  if (scenario == "grads") {
    // Each rank trains on its quarter of a batch; rank 0 also on the whole batch alone.
    const int64_t per_rank = 8;
    torch::manual_seed(1);
    Mlp model(32, 3);
    torch::manual_seed(1);
    Mlp reference(32, 3);
    torch::manual_seed(7);
    const torch::Tensor x = torch::randn({per_rank * world, 32});
    const torch::Tensor y = torch::randn({per_rank * world, 32});
    torchpilot::GradSyncOptions gs;
    gs.bucket_mb = 0.005;  // several buckets
    gs.overlap = env_int("TP_COLL_OVERLAP", 1) != 0;
    torchpilot::GradSync sync(model.parameters(), pg, gs);
    torch::optim::SGD opt(model.parameters(), 0.1);
    torch::optim::SGD ref_opt(reference.parameters(), 0.1);
    double max_diff = 0;
    for (int it = 0; it < 3; ++it) {
      auto step = pilot.step(per_rank);
      opt.zero_grad();
      auto loss = torch::mse_loss(model.forward(x.narrow(0, rank * per_rank, per_rank)),
                                  y.narrow(0, rank * per_rank, per_rank));
      loss.backward();
      sync.synchronize();
      ref_opt.zero_grad();
      torch::mse_loss(reference.forward(x), y).backward();
      auto p = model.parameters();
      auto q = reference.parameters();
      for (size_t i = 0; i < p.size(); ++i) {
        max_diff = std::max(max_diff, (p[i].grad() - q[i].grad()).abs().max().item<double>());
      }
      opt.step();
      ref_opt.step();
    }
    pilot.end_epoch();
    out["buckets"] = sync.buckets();
    out["max_diff"] = max_diff;
    out["param_bytes"] = param_bytes(model);
  } else if (scenario == "overlap") {
    torch::manual_seed(1);
    Mlp model(env_int("TP_COLL_WIDTH", 512), 4);
    torchpilot::GradSyncOptions gs;
    gs.bucket_mb = 1;
    gs.overlap = env_int("TP_COLL_OVERLAP", 1) != 0;
    torchpilot::GradSync sync(model.parameters(), pg, gs);
    torch::optim::SGD opt(model.parameters(), 0.01);
    const torch::Tensor x = torch::randn({64, model.layers[0]->weight.size(1)});
    for (int epoch = 0; epoch < 2; ++epoch) {
      for (int s = 0; s < (epoch == 0 ? 3 : 10); ++s) {
        auto step = pilot.step(64);
        opt.zero_grad();
        model.forward(x).square().mean().backward();
        sync.synchronize();
        opt.step();
      }
      pilot.end_epoch();
    }
    out["param_bytes"] = param_bytes(model);
  } else if (scenario == "straggler") {
    const int slow = env_int("TP_COLL_SLOW_RANK", 1);
    const int slow_ms = env_int("TP_COLL_SLOW_MS", 40);
    torch::manual_seed(1);
    Mlp model(64, 2);
    torchpilot::GradSync sync(model.parameters(), pg);
    torch::optim::SGD opt(model.parameters(), 0.01);
    const torch::Tensor x = torch::randn({16, 64});
    for (int epoch = 0; epoch < 2; ++epoch) {
      for (int s = 0; s < 8; ++s) {
        auto step = pilot.step(16);
        {
          auto f = pilot.phase("forward");
          if (rank == slow) std::this_thread::sleep_for(std::chrono::milliseconds(slow_ms));
        }
        opt.zero_grad();
        model.forward(x).square().mean().backward();
        sync.synchronize();
        opt.step();
      }
      pilot.end_epoch();
    }
  } else if (scenario == "tune") {
    torch::manual_seed(1);
    Mlp model(16, 2);
    torchpilot::GradSync sync(model.parameters(), pg);
    torch::optim::SGD opt(model.parameters(), 0.01);
    torchpilot::LoaderOptions lo;
    lo.batch_size = 4;
    const size_t n = 400;
    // Rank 1's samples take longer: the slowest rank must govern the decision.
    auto dataset = SlowIndices(n, rank == 1 ? 1500 : 500).map(torch::data::transforms::Stack<>());
    torchpilot::TunableLoader<decltype(dataset)> loader(std::move(dataset), lo);
    loader.attach(pilot);
    bool exactly_once = true;
    for (int epoch = 0; epoch < 2; ++epoch) {
      std::vector<int> seen(n, 0);
      for (auto& batch : loader) {
        auto step = pilot.step(batch.data.size(0));
        for (int64_t i = 0; i < batch.target.size(0); ++i) ++seen[batch.target[i].item<int64_t>()];
        opt.zero_grad();
        model.forward(batch.data).square().mean().backward();
        sync.synchronize();
        opt.step();
      }
      for (int c : seen) exactly_once = exactly_once && c == 1;
    }
    out["exactly_once"] = exactly_once;
    const auto& d = pilot.tuning_decision();
    if (d) {
      out["decided_at_step"] = d->decided_at_step;
      out["chosen"] = torchpilot::to_string(d->chosen);
      out["baseline"] = torchpilot::to_string(d->baseline);
      out["reason"] = d->reason;
      out["trials"] = d->trials.size();
    }
  } else if (scenario == "intervals") {
    // No epoch end: the ranks close intervals by time; rank 1's steps are slower on the host, so
    // the ranks' own clocks would cross interval.seconds at different steps.
    torch::manual_seed(1);
    Mlp model(64, 2);
    torchpilot::GradSync sync(model.parameters(), pg);
    torch::optim::SGD opt(model.parameters(), 0.01);
    const torch::Tensor x = torch::randn({16, 64});
    for (int s = 0; s < 80; ++s) {
      auto step = pilot.step(16);
      std::this_thread::sleep_for(std::chrono::milliseconds(rank == 1 ? 6 : 3));
      opt.zero_grad();
      model.forward(x).square().mean().backward();
      sync.synchronize();
      opt.step();
    }
    json periods = json::array();
    for (const auto& e : pilot.epoch_summaries()) {
      periods.push_back({e.first_step, e.steps, torchpilot::to_string(e.closed_by)});
    }
    out["periods"] = periods;
  } else if (scenario == "kill") {
    torch::manual_seed(1);
    Mlp model(64, 2);
    torchpilot::GradSync sync(model.parameters(), pg);
    torch::optim::SGD opt(model.parameters(), 0.01);
    const torch::Tensor x = torch::randn({16, 64});
    std::string caught;
    const auto t0 = std::chrono::steady_clock::now();
    for (int s = 0; s < 20 && caught.empty(); ++s) {
      if (rank == 1 && s == 5) _exit(3);  // dies mid-epoch, before its all-reduce
      auto step = pilot.step(16);
      opt.zero_grad();
      model.forward(x).square().mean().backward();
      try {
        sync.synchronize();
      } catch (const std::exception& e) {
        caught = e.what();
      }
      opt.step();
    }
    pilot.end_epoch();
    out["caught"] = caught.substr(0, 300);
    out["seconds"] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  } else if (scenario == "faults") {
    // Three epochs of 6 steps of 20 ms; a fault as the variables say: rank TP_COLL_FAULT_RANK
    // stalls TP_COLL_STALL_MS before it ends epoch 0 (it has finished the epoch's all-reduces:
    // the others go on and wait in the next one), or joins late (above); rank 0 kills the
    // store's server (TP_COLL_KILL_PID) in epoch 1.
    torch::manual_seed(1);
    Mlp model(64, 2);
    torchpilot::GradSync sync(model.parameters(), pg);
    torch::optim::SGD opt(model.parameters(), 0.01);
    const torch::Tensor x = torch::randn({16, 64});
    const auto t0 = std::chrono::steady_clock::now();
    int steps = 0;
    for (int epoch = 0; epoch < 3; ++epoch) {
      for (int s = 0; s < 6; ++s) {
        if (rank == 0 && epoch == 1 && s == 2 && env_int("TP_COLL_KILL_PID", 0) > 0) {
          ::kill(env_int("TP_COLL_KILL_PID", 0), SIGKILL);
        }
        auto step = pilot.step(16);
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        opt.zero_grad();
        model.forward(x).square().mean().backward();
        sync.synchronize();
        opt.step();
        ++steps;
      }
      if (epoch == 0 && rank == fault_rank) {
        std::this_thread::sleep_for(std::chrono::milliseconds(env_int("TP_COLL_STALL_MS", 0)));
      }
      pilot.end_epoch();
    }
    out["steps"] = steps;
    out["seconds"] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  } else {
    std::fprintf(stderr, "unknown scenario %s\n", scenario.c_str());
    return 2;
  }
  write_result(result, out);
  std::fflush(nullptr);
  // Leave without tearing the group down in step with the others (a killed peer cannot).
  std::_Exit(0);
}

// --- the tests -----------------------------------------------------------------------------------

struct RankOutput {
  int status = -1;  // exit status; -1: killed at the deadline
  std::string log;
  json result;
  std::vector<json> records;  // JSON lines
};

int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  const int port = ntohs(a.sin_port);
  ::close(fd);
  return port;
}

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Starts `world` ranks of `scenario` and waits for them (at most `deadline_s`).
std::vector<RankOutput> run_ranks(const std::string& scenario, int world, bool tcp,
                                  std::map<std::string, std::string> env, int deadline_s = 150) {
  char tmpl[] = "/tmp/torchpilot-coll-XXXXXX";
  const std::string dir = ::mkdtemp(tmpl);
  const int port = free_port();
  // The store's server in a process of its own (TP_COLL_STORE_SERVER): started first, its pid
  // given to the ranks as TP_COLL_KILL_PID.
  pid_t server = -1;
  if (env.count("TP_COLL_STORE_SERVER") != 0) {
    std::fflush(nullptr);
    server = ::fork();
    if (server == 0) {
      ::setenv("TP_COLL_DIR", dir.c_str(), 1);
      ::setenv("MASTER_ADDR", "127.0.0.1", 1);
      ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
      ::setenv("TP_COLL_SCENARIO", "store_server", 1);
      const std::string log = dir + "/server.log";
      std::freopen(log.c_str(), "w", stderr);
      std::freopen(log.c_str(), "a", stdout);
      char self[] = "/proc/self/exe";
      char* argv[] = {self, nullptr};
      ::execv(self, argv);
      std::_Exit(127);
    }
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (!std::filesystem::exists(dir + "/server.json") &&
           std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    env["TP_COLL_KILL_PID"] = std::to_string(server);
  }
  std::vector<pid_t> pids;
  for (int r = 0; r < world; ++r) {
    std::map<std::string, std::string> e = env;
    e["TP_COLL_SCENARIO"] = scenario;
    e["TP_COLL_DIR"] = dir;
    e["RANK"] = std::to_string(r);
    e["LOCAL_RANK"] = std::to_string(r);
    e["WORLD_SIZE"] = std::to_string(world);
    e["MASTER_ADDR"] = "127.0.0.1";
    e["MASTER_PORT"] = std::to_string(port);
    if (!tcp) e["TP_COLL_FILESTORE"] = dir + "/store";
    e["TORCHPILOT_LOG_JSON_PATH"] = dir + "/rank" + std::to_string(r) + ".jsonl";
    std::fflush(nullptr);  // or the children flush the parent's buffered output again
    const pid_t pid = ::fork();
    if (pid == 0) {
      for (const auto& [k, v] : e) ::setenv(k.c_str(), v.c_str(), 1);
      const std::string log = dir + "/rank" + std::to_string(r) + ".log";
      std::freopen(log.c_str(), "w", stderr);
      std::freopen(log.c_str(), "a", stdout);
      char self[] = "/proc/self/exe";
      char* argv[] = {self, nullptr};
      ::execv(self, argv);
      std::_Exit(127);
    }
    pids.push_back(pid);
  }
  std::vector<RankOutput> out(world);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(deadline_s);
  int left = world;
  std::vector<bool> done(world, false);
  while (left > 0 && std::chrono::steady_clock::now() < deadline) {
    for (int r = 0; r < world; ++r) {
      int status = 0;
      if (!done[r] && ::waitpid(pids[r], &status, WNOHANG) == pids[r]) {
        done[r] = true;
        --left;
        out[r].status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (server > 0) {
    ::kill(server, SIGKILL);
    ::waitpid(server, nullptr, 0);
  }
  for (int r = 0; r < world; ++r) {
    if (!done[r]) {
      ::kill(pids[r], SIGKILL);
      ::waitpid(pids[r], nullptr, 0);
    }
    out[r].log = slurp(dir + "/rank" + std::to_string(r) + ".log");
    const std::string res = slurp(dir + "/result" + std::to_string(r) + ".json");
    out[r].result = json::parse(res, nullptr, false);
    std::istringstream lines(slurp(dir + "/rank" + std::to_string(r) + ".jsonl"));
    for (std::string line; std::getline(lines, line);) {
      json j = json::parse(line, nullptr, false);
      if (!j.is_discarded()) out[r].records.push_back(j);
    }
  }
  std::error_code ignored;
  std::filesystem::remove_all(dir, ignored);
  return out;
}

std::vector<json> epochs(const RankOutput& r) {
  std::vector<json> e;
  for (const auto& j : r.records) {
    if (j.value("type", "") == "epoch") e.push_back(j);
  }
  return e;
}

std::string logs(const std::vector<RankOutput>& ranks) {
  std::string s;
  for (size_t r = 0; r < ranks.size(); ++r) {
    s += "--- rank " + std::to_string(r) + " (status " + std::to_string(ranks[r].status) + ")\n" +
         ranks[r].log.substr(0, 6000) + "\n";
  }
  return s;
}

class Collectives : public ::testing::Test {};

TEST_F(Collectives, GradSyncEqualsOneProcessOnTheConcatenatedBatchAndBytesAreObserved) {
  for (const char* overlap : {"1", "0"}) {
    auto ranks = run_ranks("grads", 4, false, {{"TP_COLL_OVERLAP", overlap}});
    for (int r = 0; r < 4; ++r) ASSERT_EQ(ranks[r].status, 0) << logs(ranks);
    const json& res = ranks[0].result;
    EXPECT_GT(res.value("buckets", 0), 2);
    EXPECT_LT(res.value("max_diff", 1.0), 1e-5) << "overlap " << overlap;
    // Each step all-reduces every gradient once: the bytes of the parameters.
    const auto e = epochs(ranks[1]);
    ASSERT_EQ(e.size(), 1u) << logs(ranks);
    const json& comm = e[0]["comm"];
    EXPECT_EQ(comm["bytes"].get<int64_t>(), 3 * res["param_bytes"].get<int64_t>()) << comm;
    EXPECT_EQ(comm["world_size"].get<int>(), 4);
    EXPECT_EQ(comm["backend"].get<std::string>(), "gloo");
    EXPECT_EQ(comm["ops"][0]["op"].get<std::string>(), "all_reduce");
    EXPECT_GT(comm["busbw"].get<double>(), 0);
  }
}

TEST_F(Collectives, NoOverlapExposesTheCommunicationAndOverlapNoMore) {
  std::map<std::string, double> ratio;
  for (const char* overlap : {"0", "1"}) {
    auto ranks = run_ranks("overlap", 2, false, {{"TP_COLL_OVERLAP", overlap}});
    for (int r = 0; r < 2; ++r) ASSERT_EQ(ranks[r].status, 0) << logs(ranks);
    const auto e = epochs(ranks[0]);
    ASSERT_EQ(e.size(), 2u) << logs(ranks);
    const json& comm = e[1]["comm"];
    const double c = comm["comm_ms"].get<double>();
    const double x = comm["exposed_ms"].get<double>();
    ASSERT_GT(c, 0) << comm;
    ratio[overlap] = x / c;
    std::printf("overlap %s: comm %.1f ms, exposed %.1f ms (%.0f%%) over 10 steps\n", overlap, c, x,
                100 * x / c);
    EXPECT_EQ(comm["bytes"].get<int64_t>(), 10 * ranks[0].result["param_bytes"].get<int64_t>());
  }
  EXPECT_GT(ratio["0"], 0.7);  // exposed ~= communication: the thread waits for all of it
  // How much overlap hides is a timing (bench/collectives.cpp measures it on the GPU); here, on
  // two shared cores beside other tests, only that it does not expose clearly more.
  EXPECT_LT(ratio["1"], ratio["0"] + 0.15);
}

TEST_F(Collectives, APlantedStragglerIsNamedOnRankZero) {
  auto ranks =
      run_ranks("straggler", 4, true, {{"TP_COLL_SLOW_RANK", "2"}, {"TP_COLL_SLOW_MS", "40"}});
  for (int r = 0; r < 4; ++r) ASSERT_EQ(ranks[r].status, 0) << logs(ranks);
  const auto e = epochs(ranks[0]);
  ASSERT_EQ(e.size(), 2u) << logs(ranks);
  const json& table = e[1]["ranks"];
  ASSERT_EQ(table["ranks"].size(), 4u) << table;
  ASSERT_GE(table["stragglers"].size(), 1u) << table;
  EXPECT_EQ(table["stragglers"][0]["rank"].get<int>(), 2) << table;
  // The others' wait comes from the collectives' durations: each other rank waited for rank 2
  // a good part of the 40 ms it slept each step (loose: 4 ranks share 2 cores in CI).
  EXPECT_EQ(table["stragglers"][0]["others_wait_from"], "collective durations") << table;
  for (const json& r : table["ranks"]) {
    ASSERT_TRUE(r["wait_ns"].is_number()) << table;
    if (r["rank"].get<int>() != 2) EXPECT_GT(r["wait_ns"].get<double>(), 10e6) << table;
  }
  EXPECT_NE(ranks[0].log.find("straggler: rank 2"), std::string::npos) << ranks[0].log;
  EXPECT_NE(ranks[0].log.find("straggler_rank"), std::string::npos) << ranks[0].log;
  for (int r = 1; r < 4; ++r) EXPECT_FALSE(epochs(ranks[r])[1].contains("ranks"));
}

TEST_F(Collectives, AutotuneDecidesTheSameAtTheSameStepOnEveryRank) {
  auto ranks = run_ranks("tune", 2, true,
                         {{"TORCHPILOT_MODE", "autotune"},
                          {"TORCHPILOT_AUTOTUNE_WARMUP_STEPS", "60"},
                          {"TORCHPILOT_AUTOTUNE_WARMUP_SECONDS", "0"},
                          {"TORCHPILOT_AUTOTUNE_SETTLE_STEPS", "1"},
                          {"TORCHPILOT_AUTOTUNE_MEASURE_STEPS", "4"},
                          {"TORCHPILOT_AUTOTUNE_MIN_WINDOW_MS", "0"},
                          {"TORCHPILOT_AUTOTUNE_MAX_WORKERS", "4"}});
  for (int r = 0; r < 2; ++r) ASSERT_EQ(ranks[r].status, 0) << logs(ranks);
  const json& a = ranks[0].result;
  const json& b = ranks[1].result;
  ASSERT_TRUE(a.contains("decided_at_step")) << logs(ranks);
  EXPECT_EQ(a["decided_at_step"], b["decided_at_step"]);
  EXPECT_EQ(a["chosen"], b["chosen"]);
  EXPECT_EQ(a["trials"], b["trials"]);
  EXPECT_GT(a["trials"].get<int>(), 1);
  EXPECT_NE(a["chosen"], a["baseline"]) << a;  // 0 workers starve both ranks
  EXPECT_TRUE(a["exactly_once"].get<bool>());
  EXPECT_TRUE(b["exactly_once"].get<bool>());
}

TEST_F(Collectives, RanksCloseIntervalsAtTheSameSteps) {
  auto ranks = run_ranks("intervals", 2, true,
                         {{"TORCHPILOT_INTERVAL_SECONDS", "0.15"},
                          {"TORCHPILOT_INTERVAL_MIN_STEPS", "6"},
                          {"TORCHPILOT_COMM_EXCHANGE_TIMEOUT_MS", "5000"},
                          // Each interval's own table in its summary (by default a table may
                          // come with a later one: rank 0 gathers off the training thread).
                          {"TORCHPILOT_COMM_RANKS_WAIT_MS", "5000"}});
  for (int r = 0; r < 2; ++r) ASSERT_EQ(ranks[r].status, 0) << logs(ranks);
  const json& a = ranks[0].result["periods"];
  const json& b = ranks[1].result["periods"];
  ASSERT_GE(a.size(), 2u) << logs(ranks);
  EXPECT_EQ(a, b) << logs(ranks);  // the same first steps and lengths on both ranks
  for (const json& p : a) EXPECT_EQ(p[2], "interval") << a;
  EXPECT_NE(ranks[0].log.find("ranks agreed on intervals of"), std::string::npos) << ranks[0].log;
  EXPECT_EQ(ranks[0].log.find("did not report"), std::string::npos) << ranks[0].log;
  // Rank 0's table has both ranks in every interval.
  for (const json& e : epochs(ranks[0])) {
    ASSERT_TRUE(e.contains("ranks")) << e;
    EXPECT_EQ(e["ranks"]["ranks"].size(), 2u) << e;
  }
}

TEST_F(Collectives, ARankKilledMidEpochLeavesTheOthersWithALogLineAndNoHang) {
  auto ranks = run_ranks("kill", 2, false,
                         {{"TORCHPILOT_COMM_EXCHANGE_TIMEOUT_MS", "2000"},
                          // The scenario leaves with _Exit right after its epoch: rank 0 waits
                          // for that epoch's table (bounded by the exchange timeout) to log it.
                          {"TORCHPILOT_COMM_RANKS_WAIT_MS", "5000"},
                          {"TORCHPILOT_COMM_WATCHDOG_MS", "1000"},
                          {"TP_COLL_GLOO_TIMEOUT_S", "10"}},
                         /*deadline_s=*/90);
  EXPECT_EQ(ranks[1].status, 3);
  ASSERT_EQ(ranks[0].status, 0) << logs(ranks);
  const json& res = ranks[0].result;
  EXPECT_NE(res.value("caught", std::string()).find("GradSync"), std::string::npos) << res;
  EXPECT_NE(ranks[0].log.find("rank(s) 1 did not report epoch 0"), std::string::npos)
      << ranks[0].log;
  // The survivor's time after the death: the backend noticing it plus one exchange timeout.
  EXPECT_LT(res.value("seconds", 1e9), 60.0) << res;
}

// How many times `what` occurs in `text`.
size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// The line of `text` that contains `what` ("" if none).
std::string line_with(const std::string& text, const std::string& what) {
  const size_t at = text.find(what);
  if (at == std::string::npos) return "";
  const size_t begin = text.rfind('\n', at);
  const size_t end = text.find('\n', at);
  return text.substr(begin == std::string::npos ? 0 : begin + 1,
                     end == std::string::npos ? std::string::npos : end - begin - 1);
}

// Whether rank 0 has a table of an epoch from `first` on with every rank in it.
bool has_full_table(const RankOutput& r0, int first, size_t world) {
  for (const json& e : epochs(r0)) {
    if (e.contains("ranks") && e["ranks"].value("epoch", -1) >= first &&
        e["ranks"]["ranks"].size() == world) {
      return true;
    }
  }
  return false;
}

const std::map<std::string, std::string> kFaultEnv = {
    {"TORCHPILOT_COMM_EXCHANGE_TIMEOUT_MS", "2000"},
    {"TORCHPILOT_COMM_WATCHDOG_MS", "1000"},
    {"TP_COLL_GLOO_TIMEOUT_S", "30"}};

// Rank 1 stalls 4 s after its epoch's last all-reduce, before it posts its summary: rank 0 does
// not wait for it at its epoch end and goes on to wait in the next all-reduce, where its watchdog
// reports the hang with each rank's last collective; the table names rank 1 once; rank 1 resumes
// and both ranks finish, later tables whole.
TEST_F(Collectives, ARankThatStallsMidExchangeIsNamedOnceAndTrainingGoesOn) {
  auto env = kFaultEnv;
  env["TP_COLL_STALL_MS"] = "4000";
  auto ranks = run_ranks("faults", 2, true, env, /*deadline_s=*/90);
  for (int r = 0; r < 2; ++r) ASSERT_EQ(ranks[r].status, 0) << logs(ranks);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(ranks[r].result.value("steps", 0), 18) << logs(ranks);
    EXPECT_EQ(epochs(ranks[r]).size(), 3u) << logs(ranks);
  }
  const std::string& log0 = ranks[0].log;
  // One warning (the table of epoch 0 says it too, in its rows' place).
  EXPECT_EQ(count(log0, "rank(s) 1 did not report epoch 0 within 2000 ms"), 1u) << log0;
  EXPECT_EQ(count(log0, "did not report epoch 1"), 0u) << log0;
  const std::string hang = line_with(log0, "outstanding for");
  std::printf("%s\n%s\n", hang.c_str(), line_with(log0, "did not report epoch 0").c_str());
  EXPECT_NE(hang.find("on rank 0: reached by rank 0; not reached by rank 1;"), std::string::npos)
      << log0;
  EXPECT_NE(hang.find("last collective entered: rank 1 all_reduce seq"), std::string::npos) << hang;
  EXPECT_NE(hang.find("Float, completed); rank 0 all_reduce seq"), std::string::npos) << hang;
  EXPECT_TRUE(has_full_table(ranks[0], 1, 2)) << logs(ranks);
}

// Rank 1 starts training 3 s after rank 0 (its group was up): rank 0's first all-reduce waits,
// its watchdog says rank 1 has not reported yet; then both train, every table whole.
TEST_F(Collectives, ARankThatJoinsLateIsNamedByTheWatchdogAndEveryTableIsWhole) {
  auto env = kFaultEnv;
  env["TP_COLL_LATE_MS"] = "3000";
  auto ranks = run_ranks("faults", 2, true, env, /*deadline_s=*/90);
  for (int r = 0; r < 2; ++r) ASSERT_EQ(ranks[r].status, 0) << logs(ranks);
  for (int r = 0; r < 2; ++r) EXPECT_EQ(epochs(ranks[r]).size(), 3u) << logs(ranks);
  const std::string& log0 = ranks[0].log;
  const std::string hang = line_with(log0, "outstanding for");
  std::printf("%s\n", hang.c_str());
  EXPECT_NE(
      hang.find("on rank 0: reached by rank 0; no report from rank 1 (not started, or stopped);"),
      std::string::npos)
      << log0;
  EXPECT_EQ(log0.find("did not report"), std::string::npos) << log0;
  EXPECT_TRUE(has_full_table(ranks[0], 1, 2)) << logs(ranks);
}

// The store's server process is killed in epoch 1 (the ranks' group does not need it after its
// start): both ranks train to the end, each says once that the store failed, no rank is blamed.
TEST_F(Collectives, AStoreWhoseServerDiesIsOneLineOnEachRankAndTrainingGoesOn) {
  auto env = kFaultEnv;
  env["TP_COLL_STORE_SERVER"] = "1";
  auto ranks = run_ranks("faults", 2, true, env, /*deadline_s=*/90);
  for (int r = 0; r < 2; ++r) ASSERT_EQ(ranks[r].status, 0) << logs(ranks);
  for (int r = 0; r < 2; ++r) {
    std::printf("%s\n", line_with(ranks[r].log, "store failed").c_str());
    EXPECT_EQ(ranks[r].result.value("steps", 0), 18) << logs(ranks);
    EXPECT_EQ(epochs(ranks[r]).size(), 3u) << logs(ranks);
    EXPECT_EQ(count(ranks[r].log, "store failed"), 1u) << logs(ranks);
    EXPECT_NE(ranks[r].log.find("rank " + std::to_string(r) + ": the store failed ("),
              std::string::npos)
        << logs(ranks);
    EXPECT_EQ(ranks[r].log.find("did not report"), std::string::npos) << logs(ranks);
    // No store call waited for the dead server's timeout (30 s).
    EXPECT_LT(ranks[r].result.value("seconds", 1e9), 20.0) << ranks[r].result;
  }
}

}  // namespace

int main(int argc, char** argv) {
  const char* scenario = std::getenv("TP_COLL_SCENARIO");
  if (scenario != nullptr && std::string(scenario) == "store_server") return run_store_server();
  if (scenario != nullptr && *scenario != '\0') return run_rank(scenario);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
