// Data parallelism for the GPT example: this process is one rank of `world` processes joined
// through a c10d TCPStore at MASTER_ADDR:MASTER_PORT (rank 0 serves it), Gloo on the CPU or NCCL
// on CUDA (where this build has NCCL's header). torchpilot::GradSync averages the gradients,
// all-reduced in buckets from backward's hooks (or after backward with overlap off), and
// torchpilot::Collectives observes the collectives and brings the ranks' summaries to rank 0
// (per-rank table, stragglers).
//
// launch_ranks() starts the other ranks of a one-host run as copies of this program (the
// environment torchrun would give them); a program started by torchrun (RANK and WORLD_SIZE set)
// starts none.
//
// Thread-safety: one thread. Failure behaviour: the constructor throws std::runtime_error (no
// c10d in this LibTorch, a store or group that cannot be made); synchronize() throws what
// GradSync throws when a peer is gone.
#pragma once

#include <memory>
#include <string>
#include <vector>

namespace at {
class Tensor;
}
namespace c10 {
struct Device;
}
namespace torchpilot {
class Pilot;
}

namespace gpt_example {

struct DistRank {
  int rank = 0;
  int world = 1;
  int local_rank = 0;
};

// RANK / WORLD_SIZE / LOCAL_RANK from the environment (torchrun's, or launch_ranks()'s); rank 0 of
// 1 when unset.
DistRank dist_rank_from_env();

// Rank 0 of a one-host run of `world` processes: sets MASTER_ADDR, MASTER_PORT (a free loopback
// port), WORLD_SIZE, RANK and LOCAL_RANK for itself and starts ranks 1..world-1 as copies of this
// program (argv) with their RANK and LOCAL_RANK. Returns their process ids. Throws
// std::runtime_error when a process cannot be started.
std::vector<int> launch_ranks(int world, char** argv);
// Waits for the started ranks; returns the first non-zero exit status (or 0).
int wait_ranks(const std::vector<int>& pids);
// Rank 0 failed: the others would wait for it until their store's timeout. Ends and reaps them.
void stop_ranks(const std::vector<int>& pids);

class DataParallel {
 public:
  DataParallel(DistRank rank, const c10::Device& device, const std::vector<at::Tensor>& params,
               double bucket_mb, bool overlap);
  ~DataParallel();
  // Observes the group's collectives and joins the ranks' summaries for `pilot`: before its first
  // step. Another Pilot later takes over (the previous one's observer goes first).
  void attach(torchpilot::Pilot& pilot);
  // Stops reporting to the attached Pilot: before that Pilot goes.
  void detach();
  // Averages the gradients: after backward, before the optimizer step.
  void synchronize();
  // GradSync's settings, from the next backward on (every rank must change them alike). In
  // autotune mode attach() also adds GradSync's bucket knob (grad_sync.bucket_mb) to the Pilot's
  // registry; detach() removes it.
  void set_overlap(bool overlap);
  void set_bucket_mb(double mb);
  std::string backend() const;  // "gloo" or "nccl"

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace gpt_example
