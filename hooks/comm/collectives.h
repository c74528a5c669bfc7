// Collectives on c10d process groups, measured without changing the trainer's calls, and the
// ranks of a data-parallel run brought together (docs/collectives.md).
//
//   auto store = c10::make_intrusive<c10d::TCPStore>(addr, opts);   // or a FileStore
//   auto pg = c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, world, gloo_opts);
//   torchpilot::Pilot pilot(torchpilot::Config::load());
//   torchpilot::Collectives collectives(pilot, pg, store);
//   torchpilot::GradSync sync(model->parameters(), pg, {.bucket_mb = 25});   // grad_sync.h
//
// Collectives observes every collective a c10d backend runs in this process (RecordFunction's
// "gloo:*" / "nccl:*" scopes: op, bytes, dtype, interval) into a CommMonitor (section "comm",
// step metrics comm.*), and through the store (never through the trainer's group): gathers every
// rank's epoch summary on rank 0 (section "ranks": per-rank table, stragglers), makes the ranks'
// auto-tune trials agree (same steps, slowest rank governs, same decision at the same step), and
// runs a watchdog that logs a collective outstanding longer than comm.watchdog_ms once, with the
// ranks that have and have not reached it and the last collective each rank entered.
//
// Rank and world size come from the group, else RANK / WORLD_SIZE; without a store, one is opened
// as a client of MASTER_ADDR:MASTER_PORT when both are set (torchrun's store), else the cross-rank
// parts are off (said once). World size 1, no c10d, a store that fails: each said once, the rest
// works. One Collectives per process at a time (the RecordFunction callback is global); the
// ranks create theirs in the same order (each one's store keys carry its number in the process).
//
// Thread-safety: construct and destroy on the training thread, before the first step and after
// the last; backends call the observer on their threads. Failure behaviour: the constructor logs
// and degrades rather than throws; nothing throws into the training loop.
#pragma once

#if __has_include(<torch/csrc/distributed/c10d/Store.hpp>)
#define TORCHPILOT_HAVE_C10D 1
#else
#define TORCHPILOT_HAVE_C10D 0
#endif

#include <cstdlib>
#include <memory>
#include <optional>
#include <string>

#include "torchpilot/runtime/comm/comm_monitor.h"
#include "torchpilot/runtime/comm/rank_exchange.h"
#include "torchpilot/runtime/core/pilot.h"

#if TORCHPILOT_HAVE_C10D
#include <torch/csrc/distributed/c10d/Store.hpp>
#endif

namespace torchpilot {

// torchrun's variables (-1 / empty when unset or not a number).
struct DistEnv {
  int rank = -1;
  int world_size = -1;
  int local_rank = -1;
  std::string master_addr;
  int master_port = -1;
};
DistEnv dist_env();

#if TORCHPILOT_HAVE_C10D

struct GroupInfo {
  std::string backend;  // "gloo", "nccl", ...
  int rank = -1;
  int world_size = -1;
};
// A c10d group's identity (a ProcessGroup, or a Backend in LibTorch 2.x).
template <typename Group>
GroupInfo group_info(const Group& group) {
  GroupInfo g;
  try {
    g.backend = group.getBackendName();
  } catch (...) {
  }
  g.rank = group.getRank();
  g.world_size = group.getSize();
  return g;
}

// A c10d store as torchpilot's key-value store.
std::shared_ptr<KeyValueStore> adapt_store(c10::intrusive_ptr<c10d::Store> store);

class Collectives {
 public:
  Collectives(Pilot& pilot, GroupInfo group, c10::intrusive_ptr<c10d::Store> store = {});
  template <typename Group>
  Collectives(Pilot& pilot, const c10::intrusive_ptr<Group>& group,
              c10::intrusive_ptr<c10d::Store> store = {})
      : Collectives(pilot, group ? group_info(*group) : GroupInfo{}, std::move(store)) {}
  ~Collectives();
  Collectives(const Collectives&) = delete;
  Collectives& operator=(const Collectives&) = delete;

  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  // Null when off (comm.enabled false, mode off).
  CommMonitor* monitor() const { return monitor_.get(); }
  // Null without a store or with one rank.
  RankExchange* exchange() const { return exchange_.get(); }

 private:
  Pilot* pilot_;
  int rank_ = 0;
  int world_size_ = 1;
  std::shared_ptr<CommMonitor> monitor_;
  std::shared_ptr<RankExchange> exchange_;
  std::shared_ptr<RankCollector> ranks_;
  std::unique_ptr<CommWatchdog> watchdog_;
  bool observing_ = false;
};

#endif  // TORCHPILOT_HAVE_C10D

}  // namespace torchpilot
