// SpinPolicy: how long a waiting ring end spins, learned from how its waits end; the
// waker's CPU that RingEnd::wake leaves in the futex word for it; and futex_wait_any, on
// which a Selector sleeps for many rings at once.
#include <gtest/gtest.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sched.h>
#include <sys/prctl.h>
#include <sys/syscall.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>
#include <vector>

#include "ferry/error.hpp"
#include "ring/futex.hpp"
#include "ring/ring_end.hpp"
#include "ring/spin_policy.hpp"
#include "support/process.hpp"

namespace ferry::detail {
namespace {

using namespace std::chrono_literals;
using std::chrono::nanoseconds;

constexpr nanoseconds kSetting = 20us;

// Spins in vain until the budget is zero; returns how many waits that took.
int fade_out(SpinPolicy& policy) {
  int waits = 0;
  while (policy.budget() > nanoseconds::zero()) {
    policy.slept(policy.budget(), 1ms, Waker::OtherCpu);
    ++waits;
  }
  return waits;
}

TEST(SpinPolicyTest, StartsWithTheFullSettingAndKeepsItWhileSpinsCatchThePeer) {
  SpinPolicy policy(kSetting);
  EXPECT_EQ(policy.budget(), kSetting);
  for (int i = 0; i < 100; ++i) policy.caught();
  EXPECT_EQ(policy.budget(), kSetting);
}

TEST(SpinPolicyTest, ASpinInVainHalvesTheBudgetAndItFadesToZero) {
  SpinPolicy policy(kSetting);
  policy.slept(kSetting, 1ms, Waker::OtherCpu);
  EXPECT_EQ(policy.budget(), kSetting / 2);
  // 20 us -> 10 -> 5 -> 2.5 -> 1.25 -> 0.625 -> below 500 ns: zero.
  EXPECT_EQ(fade_out(policy), 5);
  EXPECT_EQ(policy.budget(), nanoseconds::zero());
}

TEST(SpinPolicyTest, ACatchRestoresTheFullSettingFromAnyBudget) {
  SpinPolicy policy(kSetting);
  policy.slept(kSetting, 1ms, Waker::Unknown);
  policy.slept(kSetting / 2, 1ms, Waker::Unknown);
  ASSERT_EQ(policy.budget(), kSetting / 4);
  policy.caught();
  EXPECT_EQ(policy.budget(), kSetting);
}

TEST(SpinPolicyTest, APeerOnAnotherCpuThatAnsweredSoonBringsSpinningBack) {
  // Both ends asleep: a wake from another CPU within kRestoreWithin settings makes the
  // next wait spin as long as this one lasted, between one and kLongestProbe settings.
  SpinPolicy policy(kSetting);
  fade_out(policy);
  policy.slept(nanoseconds::zero(), kSetting / 4, Waker::OtherCpu);
  EXPECT_EQ(policy.budget(), kSetting);

  fade_out(policy);
  policy.slept(nanoseconds::zero(), kSetting * 3, Waker::OtherCpu);
  EXPECT_EQ(policy.budget(), kSetting * 3);

  fade_out(policy);
  policy.slept(nanoseconds::zero(), kSetting * SpinPolicy::kRestoreWithin, Waker::OtherCpu);
  EXPECT_EQ(policy.budget(), kSetting * SpinPolicy::kLongestProbe);
}

TEST(SpinPolicyTest, ALongProbeThatCatchesThePeerFallsBackToTheSetting) {
  SpinPolicy policy(kSetting);
  fade_out(policy);
  policy.slept(nanoseconds::zero(), kSetting * 10, Waker::OtherCpu);
  ASSERT_EQ(policy.budget(), kSetting * SpinPolicy::kLongestProbe);
  policy.caught();
  EXPECT_EQ(policy.budget(), kSetting);
}

TEST(SpinPolicyTest, ACatchAfterALongSpinKeepsTwiceThatSpinUpToTheLongestProbe) {
  // A peer that answers after a little more than the setting, message after message, keeps
  // being caught instead of the budget falling back to the setting and missing it.
  SpinPolicy policy(kSetting);
  fade_out(policy);
  policy.slept(nanoseconds::zero(), kSetting * 10, Waker::OtherCpu);
  policy.caught(kSetting * 3 / 2);
  EXPECT_EQ(policy.budget(), kSetting * 3);
  policy.caught(kSetting * 3 / 2);
  EXPECT_EQ(policy.budget(), kSetting * 3);
  policy.caught(kSetting * 3);
  EXPECT_EQ(policy.budget(), kSetting * SpinPolicy::kLongestProbe);
  policy.caught(kSetting / 4);  // short catches: back to the setting
  EXPECT_EQ(policy.budget(), kSetting);
}

TEST(SpinPolicyTest, ACatchNeverMakesAZeroSettingSpin) {
  SpinPolicy policy(nanoseconds::zero());
  policy.caught(kSetting);
  EXPECT_EQ(policy.budget(), nanoseconds::zero());
}

TEST(SpinPolicyTest, ALongProbeInVainFadesOutLikeAnyOtherSpin) {
  SpinPolicy policy(kSetting);
  fade_out(policy);
  policy.slept(nanoseconds::zero(), kSetting * 10, Waker::OtherCpu);
  EXPECT_EQ(fade_out(policy), 8);  // 80 us -> 40 -> 20 -> 10 -> 5 -> 2.5 -> 1.25 -> 0.625 -> zero
}

TEST(SpinPolicyTest, APeerOnAnotherCpuThatTookLongLeavesTheBudgetAtZero) {
  SpinPolicy policy(kSetting);
  fade_out(policy);
  policy.slept(nanoseconds::zero(), kSetting * SpinPolicy::kRestoreWithin + 1ns, Waker::OtherCpu);
  EXPECT_EQ(policy.budget(), nanoseconds::zero());
}

TEST(SpinPolicyTest, APeerOnOurOwnCpuNeverBringsSpinningBack) {
  // Spinning would only have kept that peer from running, however soon it answered.
  SpinPolicy policy(kSetting);
  fade_out(policy);
  for (int i = 0; i < 50; ++i) {
    policy.slept(nanoseconds::zero(), 2us, Waker::SameCpu);
    EXPECT_EQ(policy.budget(), nanoseconds::zero());
  }
}

TEST(SpinPolicyTest, WithoutAWakerOnlyAWaitWithinTheSettingBringsSpinningBack) {
  SpinPolicy policy(kSetting);
  fade_out(policy);
  policy.slept(nanoseconds::zero(), kSetting + 1ns, Waker::Unknown);
  EXPECT_EQ(policy.budget(), nanoseconds::zero());
  policy.slept(nanoseconds::zero(), kSetting, Waker::Unknown);
  EXPECT_EQ(policy.budget(), kSetting);
}

TEST(SpinPolicyTest, ASpinInVainHalvesWhenAPeerOnAnotherCpuTookLongerThanTheLongestProbe) {
  // A peer slower than the longest probe: spinning fades out instead of burning the budget
  // on every wait.
  SpinPolicy policy(kSetting);
  policy.slept(kSetting, kSetting * SpinPolicy::kLongestProbe + 1ns, Waker::OtherCpu);
  EXPECT_EQ(policy.budget(), kSetting / 2);
}

TEST(SpinPolicyTest, ASpinInVainThatAPeerOnAnotherCpuEndedSoonAfterSpinsAsLongAsTheWaitNextTime) {
  // The peer was late once: the next wait spins as long as this one lasted, measured from
  // its start (at least the setting, and only while that is at most kLongestProbe settings).
  SpinPolicy policy(kSetting);
  policy.slept(kSetting, kSetting + 1us, Waker::OtherCpu);
  EXPECT_EQ(policy.budget(), kSetting + 1us);
  policy.caught(kSetting / 4);
  policy.slept(kSetting, kSetting * SpinPolicy::kLongestProbe, Waker::OtherCpu);
  EXPECT_EQ(policy.budget(), kSetting * SpinPolicy::kLongestProbe);
  policy.caught(kSetting / 4);
  // A budget that earlier long waits cut below the setting comes back to the setting.
  policy.slept(kSetting, 5ms, Waker::OtherCpu);
  policy.slept(kSetting / 2, 5ms, Waker::OtherCpu);
  ASSERT_EQ(policy.budget(), kSetting / 4);
  policy.slept(kSetting / 4, kSetting / 2, Waker::OtherCpu);
  EXPECT_EQ(policy.budget(), kSetting);
}

TEST(SpinPolicyTest, ASpinInVainStretchesTheBudgetOnceBetweenTwoCatches) {
  SpinPolicy policy(kSetting);
  policy.slept(kSetting, kSetting * 3, Waker::OtherCpu);
  ASSERT_EQ(policy.budget(), kSetting * 3);
  // Missed again: this time it halves, however soon the peer answered.
  policy.slept(kSetting * 3, kSetting * 3 + 1us, Waker::OtherCpu);
  EXPECT_EQ(policy.budget(), kSetting * 3 / 2);
  policy.slept(kSetting * 3 / 2, kSetting * 2, Waker::OtherCpu);
  EXPECT_EQ(policy.budget(), kSetting * 3 / 4);
  // A catch allows the next stretch.
  policy.caught(kSetting / 4);
  policy.slept(kSetting, kSetting * 2, Waker::OtherCpu);
  EXPECT_EQ(policy.budget(), kSetting * 2);
}

TEST(SpinPolicyTest, AStretchedBudgetHalvesWhenThePeerTakesLongerThanTheLongestProbe) {
  SpinPolicy policy(kSetting);
  policy.slept(kSetting, kSetting * SpinPolicy::kLongestProbe, Waker::OtherCpu);
  ASSERT_EQ(policy.budget(), kSetting * SpinPolicy::kLongestProbe);
  policy.caught(kSetting / 4);
  policy.slept(kSetting, kSetting * SpinPolicy::kLongestProbe, Waker::OtherCpu);
  policy.slept(kSetting * SpinPolicy::kLongestProbe, kSetting * SpinPolicy::kLongestProbe + 1ns, Waker::OtherCpu);
  EXPECT_EQ(policy.budget(), kSetting * SpinPolicy::kLongestProbe / 2);
}

TEST(SpinPolicyTest, APeerThatKeepsMissingTheSpinNeverRatchetsTheBudgetUp) {
  // Every wait spins its budget in vain and the peer answers 15 us later, from what looks
  // like another CPU (more busy threads than CPUs, our spin delaying the peer): a wait that
  // spun lasts at least its budget, so stretching each time would climb to the longest
  // probe. One stretch, then the halving and the rule for waits that did not spin.
  SpinPolicy policy(kSetting);
  nanoseconds most = policy.budget();
  nanoseconds spun_in_all{0};
  for (int i = 0; i < 60; ++i) {
    const nanoseconds spun = policy.budget();
    spun_in_all += spun;
    policy.slept(spun, spun + 15us, Waker::OtherCpu);
    most = std::max(most, policy.budget());
  }
  EXPECT_EQ(most, kSetting + 15us);
  EXPECT_LT(spun_in_all, 60 * kSetting);  // stretching every time: about 60 * 4 settings
}

TEST(SpinPolicyTest, AHiccupOfTheHostCostsAWakeUpOrTwoNotAFadeOut) {
  // A steady exchange whose peer answers after 11 us, caught every time. Once the host
  // stalls the peer for 112 us: that wait halves the budget. The next wait, too short now,
  // ends 59 us after it began (the peer's answer plus its wake-up of us): it must not halve
  // again (5.5 us, then 2.75, ... each wait missing the peer), but spin long enough to
  // catch the peer from the next wait on.
  SpinPolicy policy(kSetting);
  policy.caught(11us);
  ASSERT_EQ(policy.budget(), 22us);
  policy.slept(22us, 112us, Waker::OtherCpu);
  ASSERT_EQ(policy.budget(), 11us);
  policy.slept(11us, 59us, Waker::OtherCpu);
  EXPECT_EQ(policy.budget(), 59us);
  policy.caught(11us);
  EXPECT_EQ(policy.budget(), 22us);
}

TEST(SpinPolicyTest, ACutBudgetThatJustMissedAPeerOnAnotherCpuIsRestored) {
  // Long waits (a peer busy for milliseconds) cut the budget; once the peer answers within
  // the setting again, a budget too short to catch it comes back at once instead of
  // fading to zero first.
  SpinPolicy policy(kSetting);
  policy.slept(kSetting, 5ms, Waker::OtherCpu);
  policy.slept(kSetting / 2, 5ms, Waker::OtherCpu);
  policy.slept(kSetting / 4, 5ms, Waker::OtherCpu);
  ASSERT_EQ(policy.budget(), kSetting / 8);
  policy.slept(kSetting / 8, kSetting - 1us, Waker::OtherCpu);
  EXPECT_EQ(policy.budget(), kSetting);
}

TEST(SpinPolicyTest, ASpinInVainWokenFromOurOwnCpuStopsSpinningAtOnce) {
  SpinPolicy policy(kSetting);
  policy.slept(kSetting, kSetting + 2us, Waker::SameCpu);
  EXPECT_EQ(policy.budget(), nanoseconds::zero());
}

TEST(SpinPolicyTest, ASpinInVainWithoutAWakerHalves) {
  SpinPolicy policy(kSetting);
  policy.slept(kSetting, kSetting / 2, Waker::Unknown);
  EXPECT_EQ(policy.budget(), kSetting / 2);
}

TEST(SpinPolicyTest, AZeroOrNegativeSettingNeverSpins) {
  for (const nanoseconds setting : {nanoseconds::zero(), nanoseconds(-5)}) {
    SpinPolicy policy(setting);
    EXPECT_EQ(policy.budget(), nanoseconds::zero());
    policy.caught();
    policy.slept(nanoseconds::zero(), 1ns, Waker::OtherCpu);
    policy.slept(nanoseconds::zero(), 1ns, Waker::Unknown);
    EXPECT_EQ(policy.budget(), nanoseconds::zero());
  }
}

TEST(SpinPolicyTest, TheLongestPossibleSettingFollowsTheSameRules) {
  // nanoseconds::max() as "spin as long as you like": the rules' arithmetic (16 and 4
  // settings) must not overflow, or a quick wake from another CPU would not bring back
  // the spin that a wake from our own CPU took away.
  SpinPolicy policy(nanoseconds::max());
  EXPECT_GT(policy.setting(), 1s);
  EXPECT_EQ(policy.budget(), policy.setting());
  policy.caught(1us);
  EXPECT_EQ(policy.budget(), policy.setting());
  policy.slept(policy.budget(), 1s, Waker::SameCpu);
  EXPECT_EQ(policy.budget(), nanoseconds::zero());
  policy.slept(nanoseconds::zero(), 1ms, Waker::OtherCpu);
  EXPECT_EQ(policy.budget(), policy.setting());
  policy.slept(policy.setting(), policy.setting() * 2, Waker::OtherCpu);
  EXPECT_EQ(policy.budget(), policy.setting() * 2);
  policy.slept(policy.budget(), policy.setting() * SpinPolicy::kLongestProbe + 1ns, Waker::OtherCpu);
  EXPECT_EQ(policy.budget(), policy.setting());
}

// Runs `body` on a thread pinned to `cpu`.
template <class F>
void on_cpu(int cpu, F body) {
  std::thread thread([&] {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    ASSERT_EQ(::sched_setaffinity(0, sizeof(set), &set), 0);
    body();
  });
  thread.join();
}

TEST(RingWakeTest, AWakeLeavesTheWakersCpuInTheWordOfASleeper) {
  cpu_set_t allowed;
  ASSERT_EQ(::sched_getaffinity(0, sizeof(allowed), &allowed), 0);
  int tried = 0;
  for (int cpu = 0; cpu < CPU_SETSIZE && tried < 4; ++cpu) {
    if (!CPU_ISSET(cpu, &allowed)) continue;
    ++tried;
    std::atomic<std::uint32_t> word{1};  // "asleep"
    on_cpu(cpu, [&] { RingEnd::wake(word); });
    EXPECT_EQ(word.load(), 2u + static_cast<std::uint32_t>(cpu)) << "woken from CPU " << cpu;
  }
  EXPECT_GT(tried, 0);
}

TEST(RingWakeTest, AWakeLeavesAnAwakeOrAlreadyWokenWordAlone) {
  for (const std::uint32_t value : {0u, 2u, 7u}) {
    std::atomic<std::uint32_t> word{value};
    RingEnd::wake(word);
    EXPECT_EQ(word.load(), value);
  }
}

// Two threads asleep on one word (a Selector and a recv() on the same ring): one wake
// ends both sleeps, not only one of them.
TEST(RingWakeTest, AWakeWakesEveryWaiterOfTheWord) {
  std::atomic<std::uint32_t> word{1};
  std::atomic<int> woken{0};
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> sleepers;
  for (int i = 0; i < 2; ++i) {
    sleepers.emplace_back([&] {
      while (word.load() == 1 && std::chrono::steady_clock::now() - start < 20s) futex_wait(word, 1, 20s);
      ++woken;
    });
  }
  std::this_thread::sleep_for(50ms);  // both are asleep by now
  RingEnd::wake(word);
  for (auto& sleeper : sleepers) sleeper.join();
  EXPECT_EQ(woken.load(), 2);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 10s) << "a sleeper was not woken";
}

TEST(FutexWaitAnyTest, AWakeOfAnyWordEndsTheWait) {
  std::vector<std::atomic<std::uint32_t>> words(3);
  for (auto& word : words) word.store(1);
  std::vector<std::atomic<std::uint32_t>*> waited;
  for (auto& word : words) waited.push_back(&word);
  std::thread waker([&] {
    std::this_thread::sleep_for(50ms);
    RingEnd::wake(words[1]);
  });
  const auto start = std::chrono::steady_clock::now();
  bool waited_at_all = false;
  while (words[1].load() == 1 && std::chrono::steady_clock::now() - start < 20s) {
    waited_at_all = futex_wait_any(waited, 1, start + 20s);
    if (!waited_at_all) break;  // a kernel before 5.16: nothing to test
  }
  waker.join();
  if (!waited_at_all) GTEST_SKIP() << "this kernel has no futex_waitv";
  EXPECT_NE(words[1].load(), 1u);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 10s) << "the wake of one word did not end the wait";
}

// A seccomp filter that refuses futex_waitv (EPERM, as profiles older than the call do) is
// a kernel without it: false at once, so that the caller polls, not an exception.
TEST(FutexWaitAnyTest, ASeccompFilterThatRefusesFutexWaitvIsLikeAKernelWithoutIt) {
  const pid_t child = test::fork_child([] {
    sock_filter filter[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, arch)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_futex_waitv, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    sock_fprog program{static_cast<unsigned short>(sizeof filter / sizeof filter[0]), filter};
    CHILD_CHECK(::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0);
    CHILD_CHECK(::prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &program) == 0);
    std::atomic<std::uint32_t> word{1};
    std::vector<std::atomic<std::uint32_t>*> waited{&word};
    const auto start = std::chrono::steady_clock::now();
    CHILD_CHECK(!futex_wait_any(waited, 1, start + 20s));
    CHILD_CHECK(std::chrono::steady_clock::now() - start < 10s);
  });
  EXPECT_TRUE(test::child_succeeded(child));
}

TEST(FutexWaitAnyTest, AWordThatNoLongerHoldsTheValueEndsTheWaitAtOnce) {
  std::atomic<std::uint32_t> asleep{1};
  std::atomic<std::uint32_t> awake{0};
  std::vector<std::atomic<std::uint32_t>*> waited{&asleep, &awake};
  const auto start = std::chrono::steady_clock::now();
  if (!futex_wait_any(waited, 1, start + 20s)) GTEST_SKIP() << "this kernel has no futex_waitv";
  EXPECT_LT(std::chrono::steady_clock::now() - start, 10s);
}

TEST(FutexWaitAnyTest, TheDeadlineEndsAWaitNobodyWakes) {
  std::atomic<std::uint32_t> word{1};
  std::vector<std::atomic<std::uint32_t>*> waited{&word};
  const auto start = std::chrono::steady_clock::now();
  if (!futex_wait_any(waited, 1, start + 20ms)) GTEST_SKIP() << "this kernel has no futex_waitv";
  EXPECT_GE(std::chrono::steady_clock::now() - start, 20ms);
}

TEST(FutexWaitAnyTest, MoreWordsThanTheKernelTakesAreRefused) {
  std::vector<std::atomic<std::uint32_t>> words(kMaxFutexWaitWords + 1);
  std::vector<std::atomic<std::uint32_t>*> waited;
  for (auto& word : words) waited.push_back(&word);
  EXPECT_THROW((void)futex_wait_any(waited, 1, std::chrono::steady_clock::now()), Error);
}

}  // namespace
}  // namespace ferry::detail
