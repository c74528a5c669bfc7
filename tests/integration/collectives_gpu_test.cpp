// Collectives on the GPU (label gpu; skips without one): NCCL with world size 1 through GradSync,
// the NCCL collectives counted by the observer with their bytes, and their kernels seen in a
// trace window (kernel class communication) with the overlap computed from the kernel intervals.
// NCCL with one rank may shortcut an in-place sum without a kernel: the all-reduce here averages
// (ReduceOp AVG), and the failure message says what was seen.
#include <ATen/record_function.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#include <vector>

#include "gpu_test_support.h"
#include "torchpilot/hooks/comm/collectives.h"
#include "torchpilot/hooks/comm/grad_sync.h"
#include "torchpilot/runtime/gpu/gpu_records.h"

namespace torchpilot {
namespace {

TEST(CollectivesGpu, NcclKernelsAreSeenAndTheirOverlapComputed) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU";
  auto store = c10::make_intrusive<c10d::HashStore>();
  auto pg = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, 0, 1);
  testing_support::PilotRun run(testing_support::gpu_config(/*trace_first_step=*/5, 6));
  TORCHPILOT_REQUIRE_COLLECTORS(run, "activity");
  Collectives collectives(*run.pilot, pg, store);
  torch::manual_seed(1);
  torch::nn::Sequential model(torch::nn::Linear(2048, 2048), torch::nn::ReLU(),
                              torch::nn::Linear(2048, 2048), torch::nn::ReLU(),
                              torch::nn::Linear(2048, 2048));
  model->to(torch::kCUDA);
  int64_t param_bytes = 0;
  for (const auto& p : model->parameters()) param_bytes += p.numel() * p.element_size();
  pg->enableCollectivesTiming();  // what GradSync's group constructor does: NCCL's own timing
  GradSyncOptions options;
  options.bucket_mb = 8;
  GradSync sync(
      model->parameters(),
      [pg](std::vector<at::Tensor>& t) {
        c10d::AllreduceOptions o;
        o.reduceOp = c10d::ReduceOp::AVG;
        return pg->allreduce(t, o);
      },
      1, options);
  torch::optim::SGD opt(model->parameters(), 0.01);
  const auto x = torch::randn({256, 2048}, torch::kCUDA);
  const int steps = 16;
  for (int s = 0; s < steps; ++s) {
    auto step = run.pilot->step(256);
    opt.zero_grad();
    model->forward(x).square().mean().backward();
    sync.synchronize();
    opt.step();
  }
  torch::cuda::synchronize();
  run.pilot->end_epoch();
  const EpochSummary& e = run.epoch();
  const CommEpochStats* comm = e.sections.get<CommEpochStats>();
  ASSERT_NE(comm, nullptr);
  EXPECT_EQ(comm->backend, "nccl");
  EXPECT_EQ(comm->stats.bytes, steps * param_bytes);  // counted from the nccl: scopes
  // The always-on GPU time of the syncs (CUDA events, resolved a step or two late).
  std::printf("always-on: %lld GPU-timed syncs, comm %.3f ms/step, exposed %.3f ms/step (%s)\n",
              static_cast<long long>(comm->gpu_timed_syncs), comm->stats.comm_ns / 1e6 / steps,
              comm->stats.exposed_ns / 1e6 / steps, comm->method.c_str());
  EXPECT_GE(comm->gpu_timed_syncs, steps - 3);
  EXPECT_GT(comm->stats.comm_ns, 0);
  EXPECT_LE(comm->stats.exposed_ns, comm->stats.comm_ns);
  ASSERT_FALSE(comm->ops.empty());
  EXPECT_GT(comm->ops.front().algbw, 0) << "algorithm bandwidth from the timed all-reduces";
  const GpuEpochStats* gpu = e.sections.get<GpuEpochStats>();
  ASSERT_NE(gpu, nullptr);
  const auto cls = static_cast<size_t>(KernelClass::kCommunication);
  const KernelClassStats& k = gpu->kernel_classes;
  std::printf("traced steps %lld: communication %.3f ms/step, %lld launches; top kernels:",
              static_cast<long long>(k.steps), k.steps > 0 ? k.ns[cls] / 1e6 / k.steps : 0.0,
              static_cast<long long>(k.launches[cls]));
  for (const auto& t : gpu->top_kernels) std::printf(" %s;", t.name.c_str());
  std::printf("\n");
  ASSERT_GT(gpu->traced_steps, 0) << run.missing({"activity"});
  EXPECT_GT(k.launches[cls], 0) << "no NCCL kernel in the trace window (NCCL's one-rank path?)";
  EXPECT_GT(k.ns[cls], 0);
}

// What this LibTorch's NCCL backend emits to RecordFunction observers (docs/collectives.md's
// table): every USER_SCOPE and FUNCTION scope whose name mentions a collective, with its scope, the
// thread and its inputs, printed for the docs. Torchpilot's observer relies on one of them: a
// USER_SCOPE "nccl:<op>" on the calling thread (hooks/comm/torch_collectives.cpp).
struct SeenScope {
  std::string name;
  at::RecordScope scope;
  bool calling_thread;
  size_t inputs;
};
std::mutex g_seen_mu;
std::vector<SeenScope> g_seen;
std::thread::id g_caller;

bool collective_name(const char* n) {
  if (n == nullptr) return false;
  for (const char* key : {"nccl", "c10d", "record_param_comms", "all_reduce", "allreduce",
                          "broadcast", "allgather", "all_gather", "barrier"}) {
    if (std::strstr(n, key) != nullptr) return true;
  }
  return false;
}

std::unique_ptr<at::ObserverContext> record_scope(const at::RecordFunction& fn) {
  if (!collective_name(fn.name())) return nullptr;
  std::lock_guard<std::mutex> lock(g_seen_mu);
  g_seen.push_back(
      {fn.name(), fn.scope(), std::this_thread::get_id() == g_caller, fn.inputs().size()});
  return nullptr;
}

TEST(CollectivesGpu, NcclProfilingScopesSeenByRecordFunction) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU";
  auto store = c10::make_intrusive<c10d::HashStore>();
  auto pg = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, 0, 1);
  auto t = torch::ones({1 << 20}, torch::kCUDA);
  {
    std::vector<at::Tensor> warm{t};  // the communicator is made at the first collective
    pg->allreduce(warm)->wait();
  }
  torch::cuda::synchronize();
  g_caller = std::this_thread::get_id();
  const auto handle =
      at::addGlobalCallback(at::RecordFunctionCallback(record_scope)
                                .needsInputs(true)
                                .scopes({at::RecordScope::USER_SCOPE, at::RecordScope::FUNCTION}));
  {
    std::vector<at::Tensor> one{t};
    pg->allreduce(one)->wait();
    pg->broadcast(one)->wait();
    std::vector<std::vector<at::Tensor>> out{{torch::empty_like(t)}};
    pg->allgather(out, one)->wait();
  }
  torch::cuda::synchronize();
  at::removeCallback(handle);
  std::vector<SeenScope> seen;
  {
    std::lock_guard<std::mutex> lock(g_seen_mu);
    seen = g_seen;
  }
  bool user_scope_all_reduce = false;
  std::printf("RecordFunction scopes of NCCL collectives (allreduce, broadcast, allgather):\n");
  for (const auto& v : seen) {
    const bool user = v.scope == at::RecordScope::USER_SCOPE;
    std::printf("  %-40s %-11s %-15s inputs %zu\n", v.name.c_str(),
                user ? "USER_SCOPE" : "FUNCTION",
                v.calling_thread ? "calling thread" : "other thread", v.inputs);
    if (user && v.calling_thread && v.name == "nccl:all_reduce") user_scope_all_reduce = true;
  }
  EXPECT_TRUE(user_scope_all_reduce)
      << "torchpilot's observer counts NCCL collectives from a USER_SCOPE nccl:<op> on the "
         "calling thread";
}

}  // namespace
}  // namespace torchpilot
