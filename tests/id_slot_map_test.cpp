// IdSlotMap against std::unordered_map under random inserts and erases.
#include <gtest/gtest.h>

#include <random>
#include <unordered_map>
#include <vector>

#include "ferry/detail/id_slot_map.hpp"

namespace ferry {
namespace {

TEST(IdSlotMapTest, AnEmptyMapFindsNothing) {
  detail::IdSlotMap map;
  EXPECT_EQ(map.size(), 0u);
  EXPECT_FALSE(map.find(1).has_value());
  EXPECT_FALSE(map.erase(1));
}

TEST(IdSlotMapTest, FindsWhatWasInsertedUntilErased) {
  detail::IdSlotMap map;
  map.insert(7, 70);
  map.insert(8, 80);
  EXPECT_EQ(map.find(7), 70u);
  EXPECT_EQ(map.find(8), 80u);
  EXPECT_TRUE(map.erase(7));
  EXPECT_FALSE(map.find(7).has_value());
  EXPECT_EQ(map.find(8), 80u);
  EXPECT_EQ(map.size(), 1u);
  map.clear();
  EXPECT_FALSE(map.find(8).has_value());
  EXPECT_EQ(map.size(), 0u);
}

// Random ids from a small range (many collisions, wrap-around at the table's end) and
// consecutive ids (the usual case), through growth and deletions.
TEST(IdSlotMapTest, AgreesWithUnorderedMapUnderRandomUse) {
  for (const std::uint64_t range : {std::uint64_t{300}, std::uint64_t{1} << 40}) {
    SCOPED_TRACE(range);
    std::mt19937_64 random(42);
    detail::IdSlotMap map;
    std::unordered_map<std::uint64_t, std::uint32_t> expected;
    std::vector<std::uint64_t> ids;
    for (int step = 0; step < 20000; ++step) {
      const std::uint64_t id = 1 + random() % range;
      if (random() % 3 != 0) {
        if (!expected.contains(id)) {
          const auto slot = static_cast<std::uint32_t>(random());
          map.insert(id, slot);
          expected.emplace(id, slot);
        }
      } else {
        EXPECT_EQ(map.erase(id), expected.erase(id) == 1);
      }
      ASSERT_EQ(map.size(), expected.size());
      if (step % 97 == 0) {
        for (const auto& [key, slot] : expected) ASSERT_EQ(map.find(key), slot);
      }
      const std::uint64_t probe = 1 + random() % range;
      const auto it = expected.find(probe);
      ASSERT_EQ(map.find(probe), it == expected.end() ? std::nullopt : std::optional<std::uint32_t>(it->second));
    }
  }
}

TEST(IdSlotMapTest, ConsecutiveIdsInsertedAndErasedInWaves) {
  detail::IdSlotMap map;
  std::uint64_t next = 1;
  std::vector<std::uint64_t> live;
  for (int wave = 0; wave < 50; ++wave) {
    for (int i = 0; i < 100; ++i) {
      map.insert(next, static_cast<std::uint32_t>(next % 1000));
      live.push_back(next++);
    }
    // Erase the older half, as dead storages are released.
    const std::size_t drop = live.size() / 2;
    for (std::size_t i = 0; i < drop; ++i) ASSERT_TRUE(map.erase(live[i]));
    live.erase(live.begin(), live.begin() + static_cast<std::ptrdiff_t>(drop));
    ASSERT_EQ(map.size(), live.size());
    for (const std::uint64_t id : live) ASSERT_EQ(map.find(id), static_cast<std::uint32_t>(id % 1000));
  }
}

}  // namespace
}  // namespace ferry
