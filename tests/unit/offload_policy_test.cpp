// The offloading stage of auto-tune (offload_policy.h): it tries offloading only where memory
// ended the micro-batch search, at the micro-batch that failed and larger ones, and stops at a
// failure or a clear decline.
#include "torchpilot/runtime/memory/offload_policy.h"

#include <gtest/gtest.h>

#include <vector>

namespace torchpilot {
namespace {

struct Knobs {
  KnobRegistry registry;
  int64_t micro = 4, offload = 0;
  explicit Knobs(bool with_offload = true) {
    registry.add({"batch.micro",
                  {2, 4, 8, 16, 32},
                  [this] { return micro; },
                  [this](int64_t v) { micro = v; }});
    if (with_offload) {
      registry.add(
          {kOffloadKnob, {0, 1}, [this] { return offload; }, [this](int64_t v) { offload = v; }});
    }
  }
};

TrialResult trial(int64_t micro, int64_t offload, double throughput, bool failed = false) {
  TrialResult t;
  t.setting = {{"batch.micro", micro}, {kOffloadKnob, offload}};
  t.throughput = throughput;
  t.failed = failed;
  return t;
}

TEST(OffloadPolicy, TriesTheMicroBatchThatRanOutOfMemoryThenLargerOnes) {
  Knobs k;
  auto p = make_offload_policy();
  // The micro-batch search: 4 (start), 8 best, 16 out of memory.
  std::vector<TrialResult> trials = {trial(4, 0, 100), trial(8, 0, 150), trial(16, 0, 0, true)};
  auto s = p->propose(trials, 1, k.registry);
  ASSERT_TRUE(s);
  EXPECT_EQ(*s, (Setting{{"batch.micro", 16}, {kOffloadKnob, 1}}));
  trials.push_back(trial(16, 1, 160));  // wins: the incumbent is now trial 3
  s = p->propose(trials, 3, k.registry);
  ASSERT_TRUE(s);
  EXPECT_EQ(*s, (Setting{{"batch.micro", 32}, {kOffloadKnob, 1}}));
  trials.push_back(trial(32, 1, 120));  // below 85% of 160: a clear decline
  EXPECT_FALSE(p->propose(trials, 3, k.registry));
  EXPECT_FALSE(p->propose(trials, 3, k.registry)) << "stays done";
}

TEST(OffloadPolicy, NothingWhenMemoryDidNotEndTheSearch) {
  Knobs k;
  auto p = make_offload_policy();
  const std::vector<TrialResult> trials = {trial(4, 0, 100), trial(8, 0, 150), trial(16, 0, 100)};
  EXPECT_FALSE(p->propose(trials, 1, k.registry));
}

TEST(OffloadPolicy, NothingWithoutTheKnobOrWhenAlreadyOn) {
  Knobs without(false);
  const std::vector<TrialResult> trials = {trial(4, 0, 100), trial(8, 0, 0, true)};
  EXPECT_FALSE(make_offload_policy()->propose(trials, 0, without.registry));
  Knobs k;
  const std::vector<TrialResult> on = {trial(4, 1, 100), trial(8, 0, 0, true)};
  EXPECT_FALSE(make_offload_policy()->propose(on, 0, k.registry));
}

TEST(OffloadPolicy, AStartThatDoesNotFitTriesOffloadingThere) {
  Knobs k;
  auto p = make_offload_policy();
  std::vector<TrialResult> trials = {trial(2, 0, 0, true)};
  auto s = p->propose(trials, 0, k.registry);
  ASSERT_TRUE(s);
  EXPECT_EQ(*s, (Setting{{"batch.micro", 2}, {kOffloadKnob, 1}}));
  trials.push_back(trial(2, 1, 0, true));  // does not fit either: done
  EXPECT_FALSE(p->propose(trials, 0, k.registry));
}

TEST(OffloadPolicy, AFailedOffloadTrialEndsTheStage) {
  Knobs k;
  auto p = make_offload_policy();
  std::vector<TrialResult> trials = {trial(8, 0, 150), trial(16, 0, 0, true)};
  ASSERT_TRUE(p->propose(trials, 0, k.registry));
  trials.push_back(trial(16, 1, 0, true));
  EXPECT_FALSE(p->propose(trials, 0, k.registry));
}

// A second pass of the sequence (the micro-batch moved in the first) makes a fresh stage: it finds
// the same out-of-memory micro-batch, whose offloaded trial already ran, and proposes nothing.
TEST(OffloadPolicy, ASettingTriedInAnEarlierPassIsNotTriedAgain) {
  Knobs k;
  const std::vector<TrialResult> trials = {trial(8, 0, 150), trial(16, 0, 160),
                                           trial(32, 0, 0, true), trial(32, 1, 40)};
  EXPECT_FALSE(make_offload_policy()->propose(trials, 1, k.registry));
}

}  // namespace
}  // namespace torchpilot
