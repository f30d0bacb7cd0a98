// Replays the committed fuzz corpus (tests/fuzz/corpus) and every input that once crashed a
// fuzz target (tests/fuzz/regressions) through the fuzz harnesses, in every build: release,
// ASan+UBSan and TSan. Also checks that the seeds are current: the seed generator must
// write exactly the committed files (a wire format change means regenerating them).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "codec_harness.hpp"
#include "handshake_harness.hpp"
#include "harness.hpp"
#include "support/leak_check.hpp"

namespace ferry {
namespace {

namespace fs = std::filesystem;

const fs::path kFuzzDir = FERRY_FUZZ_DIR;

std::vector<std::uint8_t> read_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Every regular file under `dir` (none when it does not exist).
std::vector<fs::path> files_under(const fs::path& dir) {
  std::vector<fs::path> out;
  if (!fs::exists(dir)) return out;
  for (const auto& entry : fs::recursive_directory_iterator(dir)) {
    if (entry.is_regular_file()) out.push_back(entry.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

class FuzzCorpusTest : public test::LeakCheckedTest {};

TEST_F(FuzzCorpusTest, FrameSeedsDecodeAsRealFrames) {
  fuzz::FrameHarness harness;
  // Two messages each: new storages in the first frame, a lease reuse plus a release in the
  // second, then a close frame. Proves the harness resolves seeds to its own segments.
  EXPECT_EQ(harness.run(read_bytes(kFuzzDir / "corpus/frame/fd_stream")), 2u);
  EXPECT_EQ(harness.run(read_bytes(kFuzzDir / "corpus/frame/proc_stream")), 2u);
  EXPECT_EQ(harness.run(read_bytes(kFuzzDir / "corpus/frame/rich")), 1u);
  EXPECT_EQ(harness.run(read_bytes(kFuzzDir / "corpus/frame/plain")), 1u);
}

TEST_F(FuzzCorpusTest, CodecSeedsDeliverWhatTheyShould) {
  // Every intact message of a connection's life arrives; a corrupted frame ends the run
  // after the one message before it.
  EXPECT_EQ(fuzz::run_codec(read_bytes(kFuzzDir / "corpus/codec/life")), 5u);
  EXPECT_EQ(fuzz::run_codec(read_bytes(kFuzzDir / "corpus/codec/not_sent")), 2u);
  for (const char* seed : {"cut", "flipped", "lost_fd", "lying_release", "receiver_gone"}) {
    EXPECT_EQ(fuzz::run_codec(read_bytes(kFuzzDir / "corpus/codec" / seed)), 1u) << seed;
  }
  EXPECT_EQ(fuzz::run_codec(read_bytes(kFuzzDir / "corpus/codec/receiver_lets_go")), 2u);
}

TEST_F(FuzzCorpusTest, BodySeedsDecode) {
  fuzz::BodyHarness harness;
  EXPECT_TRUE(harness.run(read_bytes(kFuzzDir / "corpus/body/tensors")));
  EXPECT_TRUE(harness.run(read_bytes(kFuzzDir / "corpus/body/plain")));
}

TEST_F(FuzzCorpusTest, ValueSeedsDecodeAndHostileOnesAreRefused) {
  fuzz::ValueHarness harness;
  EXPECT_TRUE(harness.run(read_bytes(kFuzzDir / "corpus/value/batch")));
  EXPECT_TRUE(harness.run(read_bytes(kFuzzDir / "corpus/value/depth_limit")));
  for (const char* hostile : {"too_deep", "truncated", "huge_list", "huge_map", "huge_string", "bad_utf8",
                              "bad_utf8_key", "duplicate_key", "bad_bool", "bad_kind"}) {
    EXPECT_FALSE(harness.run(read_bytes(kFuzzDir / "corpus/value" / hostile))) << hostile << " must be refused";
  }
}

TEST_F(FuzzCorpusTest, HandshakeSeedsDecodeAsTheyShould) {
  EXPECT_EQ(fuzz::run_handshake(read_bytes(kFuzzDir / "corpus/handshake/hello_receiver")), 1);
  EXPECT_EQ(fuzz::run_handshake(read_bytes(kFuzzDir / "corpus/handshake/hello_duplex")), 1);
  EXPECT_EQ(fuzz::run_handshake(read_bytes(kFuzzDir / "corpus/handshake/reply_accepted")), 1);
  EXPECT_EQ(fuzz::run_handshake(read_bytes(kFuzzDir / "corpus/handshake/reply_refused")), 1);
  EXPECT_EQ(fuzz::run_handshake(read_bytes(kFuzzDir / "corpus/handshake/hello_truncated")), 0);
}

TEST_F(FuzzCorpusTest, ListenerScriptsAcceptWhatTheyShould) {
  // Both kinds served are accepted; every hostile client refused; a Hello in two parts
  // accepted; silent clients past the pending cap and clients past the waiting cap refused,
  // a waiting client that hangs up dropped (the one left is accepted).
  EXPECT_EQ(fuzz::run_listener(read_bytes(kFuzzDir / "corpus/listener/accept_both_kinds")), 2);
  EXPECT_EQ(fuzz::run_listener(read_bytes(kFuzzDir / "corpus/listener/refusals")), 0);
  EXPECT_EQ(fuzz::run_listener(read_bytes(kFuzzDir / "corpus/listener/split_hello")), 1);
  EXPECT_EQ(fuzz::run_listener(read_bytes(kFuzzDir / "corpus/listener/pending_cap")), 0);
  EXPECT_EQ(fuzz::run_listener(read_bytes(kFuzzDir / "corpus/listener/waiting_cap")), 1);
}

TEST_F(FuzzCorpusTest, EveryCorpusAndRegressionInputRunsCleanly) {
  fuzz::FrameHarness frames;
  fuzz::BodyHarness bodies;
  fuzz::ValueHarness values;
  std::size_t inputs = 0;
  for (const char* group : {"corpus", "regressions"}) {
    for (const fs::path& path : files_under(kFuzzDir / group / "frame")) {
      SCOPED_TRACE(path.string());
      frames.run(read_bytes(path));  // a crash or a leak aborts the test
      ++inputs;
    }
    for (const fs::path& path : files_under(kFuzzDir / group / "body")) {
      SCOPED_TRACE(path.string());
      bodies.run(read_bytes(path));
      ++inputs;
    }
    for (const fs::path& path : files_under(kFuzzDir / group / "value")) {
      SCOPED_TRACE(path.string());
      values.run(read_bytes(path));
      ++inputs;
    }
    for (const fs::path& path : files_under(kFuzzDir / group / "handshake")) {
      SCOPED_TRACE(path.string());
      fuzz::run_handshake(read_bytes(path));
      ++inputs;
    }
    for (const fs::path& path : files_under(kFuzzDir / group / "codec")) {
      SCOPED_TRACE(path.string());
      fuzz::run_codec(read_bytes(path));
      ++inputs;
    }
    for (const fs::path& path : files_under(kFuzzDir / group / "listener")) {
      SCOPED_TRACE(path.string());
      fuzz::run_listener(read_bytes(path));
      ++inputs;
    }
  }
  EXPECT_GT(inputs, 0u);
}

TEST(FuzzSeeds, CommittedSeedsMatchTheGenerator) {
  const fs::path out = fs::temp_directory_path() / ("ferry-seeds-" + std::to_string(::getpid()));
  const std::string command = std::string(FERRY_FUZZ_SEEDS) + " " + out.string() + " >/dev/null";
  ASSERT_EQ(std::system(command.c_str()), 0) << command;
  for (const fs::path& generated : files_under(out)) {
    const fs::path committed = kFuzzDir / "corpus" / fs::relative(generated, out);
    EXPECT_EQ(read_bytes(generated), read_bytes(committed))
        << committed << " is stale: the wire format changed; regenerate the seeds with "
        << "`" << FERRY_FUZZ_SEEDS << " tests/fuzz/corpus`";
  }
  fs::remove_all(out);
}

}  // namespace
}  // namespace ferry
