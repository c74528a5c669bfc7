// The op-scope hook on the CPU (LibTorch 1.13 or 2.x): which ops it records, only the outermost,
// only while switched on (tests/unit/host_sync_test.cpp has the matching with CUPTI's records).
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "torchpilot/hooks/torch_sync_scopes.h"
#include "torchpilot/runtime/host_op_scopes.h"

namespace torchpilot {
namespace {

std::vector<HostOpScope> take() {
  std::vector<HostOpScope> out;
  HostOpScopes::instance().drain(out);
  return out;
}

TEST(SyncScopeHook, ClassifiesOpsByName) {
  EXPECT_EQ(sync_op_kind("aten::item"), 1);
  EXPECT_EQ(sync_op_kind("aten::_local_scalar_dense"), 1);
  EXPECT_EQ(sync_op_kind("aten::nonzero"), 1);
  EXPECT_EQ(sync_op_kind("aten::masked_select"), 1);
  EXPECT_EQ(sync_op_kind("aten::unique_consecutive"), 1);
  EXPECT_EQ(sync_op_kind("aten::_unique2"), 1);
  EXPECT_EQ(sync_op_kind("aten::to"), 2);
  EXPECT_EQ(sync_op_kind("aten::_to_copy"), 2);
  EXPECT_EQ(sync_op_kind("aten::copy_"), 2);
  EXPECT_EQ(sync_op_kind("aten::add"), 0);
  EXPECT_EQ(sync_op_kind("aten::itemsize"), 0);
  EXPECT_EQ(sync_op_kind("aten::top"), 0);
  EXPECT_EQ(sync_op_kind("my::item"), 0);
  EXPECT_EQ(sync_op_kind(nullptr), 0);
}

TEST(SyncScopeHook, RecordsOutermostSyncOpsWhileSwitchedOn) {
  SyncScopeHook hook;
  ASSERT_TRUE(hook.active());
  SyncScopeHook second;  // one hook per process
  EXPECT_FALSE(second.active());
  HostOpScopes& scopes = HostOpScopes::instance();
  (void)take();
  const at::Tensor t = at::arange(10, at::kFloat);

  // Off (no window): nothing recorded.
  (void)t.sum().item<float>();
  EXPECT_TRUE(take().empty());

  scopes.enable(true);
  (void)t.sum().item<float>();             // aten::item -> _local_scalar_dense
  (void)at::nonzero(t);                    // aten::nonzero
  const at::Tensor d = t.to(at::kDouble);  // aten::to -> _to_copy -> copy_
  (void)(t + t);                           // not recorded (t + 1 would record the scalar's
                                           // aten::to: a copy without a CUPTI record, no sync)
  scopes.enable(false);
  (void)t.sum().item<float>();
  const std::vector<HostOpScope> got = take();
  std::vector<std::string> ops;
  for (const HostOpScope& s : got) {
    ops.push_back(s.op);
    EXPECT_LE(s.begin, s.end);
    EXPECT_GT(s.begin, 0);
  }
  EXPECT_EQ(ops, (std::vector<std::string>{"aten::item", "aten::nonzero", "aten::to"}));
  ASSERT_EQ(got.size(), 3u);
  EXPECT_TRUE(got[0].always);
  EXPECT_FALSE(got[2].always);  // a copy blocks only when CUPTI says so
}

TEST(SyncScopeHook, UnsetsItsSwitchWhenDestroyed) {
  {
    SyncScopeHook hook;
    EXPECT_TRUE(HostOpScopes::instance().has_switch());
  }
  EXPECT_FALSE(HostOpScopes::instance().has_switch());
  HostOpScopes::instance().enable(true);
  (void)at::ones({2}).sum().item<float>();
  HostOpScopes::instance().enable(false);
  EXPECT_TRUE(take().empty());
}

}  // namespace
}  // namespace torchpilot
