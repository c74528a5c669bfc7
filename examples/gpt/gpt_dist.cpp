#include "gpt_dist.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "torchpilot/hooks/comm/collectives.h"

// c10d's backends are compiled in only with their macros (USE_C10D_GLOO, USE_C10D_NCCL: set by
// Debian's Torch config, or by examples/CMakeLists.txt where it finds their headers). The PyTorch
// wheel sets USE_C10D_GLOO without shipping Gloo's headers: Gloo only where they are.
#if defined(USE_C10D_GLOO) && !__has_include(<gloo/algorithm.h>)
#undef USE_C10D_GLOO
#endif
#if TORCHPILOT_HAVE_C10D && (defined(USE_C10D_GLOO) || defined(USE_C10D_NCCL))
#define GPT_HAVE_DIST 1
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "torchpilot/hooks/comm/grad_sync.h"
#if defined(USE_C10D_GLOO)
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#endif
#if defined(USE_C10D_NCCL)
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif
#else
#define GPT_HAVE_DIST 0
#endif

namespace gpt_example {

namespace {
// A port nobody listens on now (the store's server binds it a moment later).
int free_loopback_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw std::runtime_error(std::string("socket: ") + std::strerror(errno));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof a;
  int port = -1;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
    port = ntohs(a.sin_port);
  }
  ::close(fd);
  if (port <= 0) throw std::runtime_error("no free loopback port for the store");
  return port;
}
}  // namespace

DistRank dist_rank_from_env() {
  DistRank r;
  const torchpilot::DistEnv e = torchpilot::dist_env();  // torchrun's variables, -1 when unset
  r.world = std::max(1, e.world_size);
  r.rank = e.rank == -1 ? 0 : e.rank;  // unset: a single process
  r.local_rank = e.local_rank >= 0 ? e.local_rank : r.rank;
  if (r.rank < 0 || r.rank >= r.world) {
    throw std::runtime_error("RANK " + std::to_string(r.rank) + " is not in [0, WORLD_SIZE " +
                             std::to_string(r.world) + ")");
  }
  return r;
}

std::vector<int> launch_ranks(int world, char** argv) {
  const std::string port = std::to_string(free_loopback_port());
  ::setenv("MASTER_ADDR", "127.0.0.1", 1);
  ::setenv("MASTER_PORT", port.c_str(), 1);
  ::setenv("WORLD_SIZE", std::to_string(world).c_str(), 1);
  std::vector<int> pids;
  for (int r = 1; r < world; ++r) {
    const pid_t pid = ::fork();
    if (pid < 0) throw std::runtime_error(std::string("fork: ") + std::strerror(errno));
    if (pid == 0) {
      ::setenv("RANK", std::to_string(r).c_str(), 1);
      ::setenv("LOCAL_RANK", std::to_string(r).c_str(), 1);
      ::execv("/proc/self/exe", argv);
      std::perror("gpt_trainer: exec of a rank");
      std::_Exit(127);
    }
    pids.push_back(static_cast<int>(pid));
  }
  ::setenv("RANK", "0", 1);
  ::setenv("LOCAL_RANK", "0", 1);
  return pids;
}

int wait_ranks(const std::vector<int>& pids) {
  int first = 0;
  for (int pid : pids) {
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (first == 0 && code != 0) first = code;
  }
  return first;
}

void stop_ranks(const std::vector<int>& pids) {
  for (int pid : pids) ::kill(pid, SIGTERM);
  (void)wait_ranks(pids);
}

#if GPT_HAVE_DIST

struct DataParallel::Impl {
  DistRank rank;
  c10::intrusive_ptr<c10d::Store> store;
#if defined(USE_C10D_GLOO)
  c10::intrusive_ptr<c10d::ProcessGroupGloo> gloo;
#endif
#if defined(USE_C10D_NCCL)
  c10::intrusive_ptr<c10d::ProcessGroupNCCL> nccl;
#endif
  std::unique_ptr<torchpilot::GradSync> sync;
  std::unique_ptr<torchpilot::Collectives> collectives;
  torchpilot::Pilot* pilot = nullptr;  // the one the collectives report to
};

DataParallel::DataParallel(DistRank rank, const c10::Device& device,
                           const std::vector<at::Tensor>& params, double bucket_mb, bool overlap)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.rank = rank;
  const torchpilot::DistEnv env = torchpilot::dist_env();
  if (env.master_addr.empty()) {
    throw std::runtime_error("MASTER_ADDR is not set (start with --world-size, or with torchrun)");
  }
  c10d::TCPStoreOptions o;
  o.port = static_cast<uint16_t>(env.master_port > 0 ? env.master_port : 29500);
  o.isServer = rank.rank == 0;
  o.numWorkers = rank.world;
  o.timeout = std::chrono::seconds(60);
  m.store = c10::make_intrusive<c10d::TCPStore>(env.master_addr, o);
  torchpilot::GradSyncOptions g;
  g.bucket_mb = bucket_mb;
  g.overlap = overlap;
  if (device.is_cuda()) {
#if defined(USE_C10D_NCCL)
    m.nccl = c10::make_intrusive<c10d::ProcessGroupNCCL>(m.store, rank.rank, rank.world);
    m.sync = std::make_unique<torchpilot::GradSync>(params, m.nccl, g);
#else
    throw std::runtime_error("this build of the example has no NCCL header: run with --device cpu");
#endif
  } else {
#if defined(USE_C10D_GLOO)
    auto options = c10d::ProcessGroupGloo::Options::create();
    options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
    options->timeout = std::chrono::seconds(120);
    m.gloo = c10::make_intrusive<c10d::ProcessGroupGloo>(m.store, rank.rank, rank.world, options);
    m.sync = std::make_unique<torchpilot::GradSync>(params, m.gloo, g);
#else
    throw std::runtime_error("this build of the example has no Gloo: run on CUDA (NCCL)");
#endif
  }
}

DataParallel::~DataParallel() = default;

void DataParallel::attach(torchpilot::Pilot& pilot) {
  Impl& m = *impl_;
  if (m.collectives && m.pilot == &pilot) return;
  m.collectives.reset();  // one Collectives at a time (its observer is global)
  if (m.pilot != nullptr) m.pilot->knobs().remove_prefix("grad_sync.");
  m.pilot = &pilot;
  // In autotune mode the bucket size is tuned with the other knobs, the same on every rank.
  if (pilot.mode() == torchpilot::Mode::kAutotune) pilot.knobs().add(m.sync->knob());
#if defined(USE_C10D_NCCL)
  if (m.nccl) {
    m.collectives = std::make_unique<torchpilot::Collectives>(pilot, m.nccl, m.store);
    return;
  }
#endif
#if defined(USE_C10D_GLOO)
  m.collectives = std::make_unique<torchpilot::Collectives>(pilot, m.gloo, m.store);
#endif
}

void DataParallel::detach() {
  impl_->collectives.reset();
  if (impl_->pilot != nullptr) impl_->pilot->knobs().remove_prefix("grad_sync.");
  impl_->pilot = nullptr;
}

void DataParallel::synchronize() { impl_->sync->synchronize(); }
void DataParallel::set_overlap(bool overlap) { impl_->sync->set_overlap(overlap); }
void DataParallel::set_bucket_mb(double mb) { impl_->sync->set_bucket_mb(mb); }

std::string DataParallel::backend() const {
#if defined(USE_C10D_GLOO)
  if (impl_->gloo) return "gloo";
#endif
  return "nccl";
}

#else  // no c10d

struct DataParallel::Impl {};

DataParallel::DataParallel(DistRank, const c10::Device&, const std::vector<at::Tensor>&, double,
                           bool) {
  throw std::runtime_error(
      "this build of the example has no c10d backend (Gloo or NCCL): --world-size needs one");
}
DataParallel::~DataParallel() = default;
void DataParallel::attach(torchpilot::Pilot&) {}
void DataParallel::detach() {}
void DataParallel::synchronize() {}
void DataParallel::set_overlap(bool) {}
void DataParallel::set_bucket_mb(double) {}
std::string DataParallel::backend() const { return "none"; }

#endif

}  // namespace gpt_example
