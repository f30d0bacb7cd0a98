// detail::SlotTable on its own: the sending end's numbering (free list, limit, releases
// announced with a frame, returns) and the receiving end's checks.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "ferry/detail/slot_table.hpp"

namespace ferry {
namespace {

using detail::SlotTable;
using Table = SlotTable<std::shared_ptr<int>>;
constexpr detail::SlotNames kNames{"slot", "handle", "things", "hold fewer"};

std::vector<std::uint32_t> as_vector(std::span<const std::uint32_t> slots) { return {slots.begin(), slots.end()}; }

TEST(SlotTableTest, TakesNumbersInOrderAndRefusesPastCapacity) {
  Table table(3, kNames);
  EXPECT_TRUE(table.never_used());
  EXPECT_EQ(table.take(std::make_shared<int>(0), true), 0u);
  EXPECT_EQ(table.take(std::make_shared<int>(1), true), 1u);
  EXPECT_EQ(table.take(std::make_shared<int>(2), true), 2u);
  EXPECT_EQ(table.live().size(), 3u);
  try {
    table.take(nullptr, true);
    FAIL() << "a fourth slot of three was handed out";
  } catch (const ProtocolError&) {
    FAIL() << "running out of slots is the sender's Error, not a protocol violation";
  } catch (const Error& error) {
    EXPECT_EQ(std::string(error.what()),
              "the receiver holds 3 things of this channel, the most one channel can track; hold fewer");
  }
}

TEST(SlotTableTest, DeadEntriesAreAnnouncedOnceAndFreedOnCommitOrReturn) {
  Table table(8, kNames);
  auto keep = std::make_shared<int>(1);
  const std::uint32_t returned = table.take(std::make_shared<int>(0), true);  // dies now
  const std::uint32_t kept = table.take(keep, true);
  const std::uint32_t freed = table.take(std::make_shared<int>(2), false);  // dies, no return
  table.retire_where([](std::uint32_t, const std::shared_ptr<int>& entry) { return *entry != 1; });
  EXPECT_EQ(as_vector(table.live()), std::vector<std::uint32_t>{kept});
  EXPECT_EQ(table.state(returned), Table::State::Dying);
  // A frame announces both releases; it is not sent, so the next one announces them again.
  EXPECT_EQ(table.announce().size(), 2u);
  EXPECT_EQ(table.announce().size(), 2u);
  table.commit_announced();
  EXPECT_TRUE(table.announce().empty());
  EXPECT_EQ(table.state(returned), Table::State::Released);  // until the receiver gives it back
  EXPECT_EQ(table.state(freed), Table::State::Free);
  EXPECT_EQ(table.take(nullptr, true), freed);  // the free number comes first
  EXPECT_TRUE(table.returnable(returned));
  table.free(returned);
  EXPECT_FALSE(table.returnable(returned));  // a second return of one slot is ignored
  EXPECT_EQ(table.take(nullptr, true), returned);
  EXPECT_EQ(table.take(nullptr, true), 3u);
}

TEST(SlotTableTest, OnlySlotsTakenForReturnAreReturnable) {
  Table table(4, kNames);
  const std::uint32_t no_return = table.take(std::make_shared<int>(0), false);
  EXPECT_FALSE(table.returnable(no_return));  // a lying receiver's return changes nothing
  EXPECT_FALSE(table.returnable(3));          // never taken
  EXPECT_FALSE(table.returnable(1000));       // out of range
  const std::uint32_t live = table.take(std::make_shared<int>(1), true);
  EXPECT_TRUE(table.returnable(live));  // the receiver dropped its lease before the death here
  table.free(live);
  EXPECT_EQ(table.state(live), Table::State::Free);
  EXPECT_EQ(table.live().size(), 1u);
}

TEST(SlotTableTest, FreeingADyingSlotForgetsItsRelease) {
  Table table(4, kNames);
  const std::uint32_t slot = table.take(std::make_shared<int>(0), true);
  table.retire_where([](std::uint32_t, const std::shared_ptr<int>&) { return true; });
  table.free(slot);  // the receiver gave it back before the release was announced
  EXPECT_TRUE(table.announce().empty());
}

TEST(SlotTableTest, DeathCountIsSeenOnce) {
  Table table(4, kNames);
  EXPECT_FALSE(table.saw_deaths(0));
  EXPECT_TRUE(table.saw_deaths(5));
  EXPECT_FALSE(table.saw_deaths(5));
  EXPECT_TRUE(table.saw_deaths(6));
}

TEST(SlotTableTest, ReceivingEndRefusesWhatALyingSenderAsks) {
  Table table(4, kNames);
  table.check_free(2, 0);
  table.place(2, std::make_shared<int>(7));
  ASSERT_NE(table.find(2), nullptr);
  EXPECT_EQ(**table.find(2), 7);
  EXPECT_EQ(table.find(1), nullptr);
  EXPECT_EQ(table.find(99), nullptr);
  auto message = [&](auto&& call) {
    try {
      call();
    } catch (const ProtocolError& error) {
      return std::string(error.what());
    }
    return std::string("no ProtocolError");
  };
  EXPECT_EQ(message([&] { table.check_free(2, 5); }), "handle 5 reuses slot 2 before releasing it");
  EXPECT_EQ(message([&] { table.check_free(4, 1); }), "handle 1 asks for slot 4, above the limit of 4");
  EXPECT_EQ(message([&] { table.release(3); }), "frame releases slot 3 which holds no lease");
  EXPECT_EQ(message([&] { table.release(400); }), "frame releases slot 400 which holds no lease");
  std::weak_ptr<int> watch = *table.find(2);
  table.release(2);
  EXPECT_TRUE(watch.expired());  // the entry is destroyed with its release
  EXPECT_EQ(table.live().size(), 0u);
  table.check_free(2, 0);  // and the number may be used again
}

TEST(SlotTableTest, ClearEmptiesBothEnds) {
  Table table(4, kNames);
  table.take(std::make_shared<int>(0), true);
  table.place(3, std::make_shared<int>(3));
  table.clear();
  EXPECT_TRUE(table.never_used());
  EXPECT_TRUE(table.live().empty());
  EXPECT_EQ(table.take(nullptr, true), 0u);
}

}  // namespace
}  // namespace ferry
