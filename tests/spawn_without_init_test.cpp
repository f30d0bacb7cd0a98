// A program whose main() does not call ferry::init cannot use the spawn start method:
// spawn() says so before starting anything. (This binary uses gtest_main.)
#include <gtest/gtest.h>

#include "ferry/ferry.hpp"
#include "support/process.hpp"

namespace ferry {
namespace {

void idle(WorkerContext&, int) {}
FERRY_WORKER(idle);

TEST(SpawnWithoutInitTest, SpawnMethodAsksForInit) {
  ASSERT_FALSE(initialized());
  SpawnOptions options;
  options.start_method = StartMethod::Spawn;
  try {
    (void)spawn(options, 2, idle, 1);
    FAIL() << "spawn() started workers in a program without ferry::init";
  } catch (const SpawnError& error) {
    EXPECT_NE(std::string(error.what()).find("ferry::init(argc, argv)"), std::string::npos) << error.what();
  }
  EXPECT_TRUE(test::has_no_children());
}

TEST(SpawnWithoutInitTest, ForkMethodNeedsNoInit) {
  auto workers = spawn(2, idle, 1);
  workers.join();
  EXPECT_TRUE(test::has_no_children());
}

}  // namespace
}  // namespace ferry
