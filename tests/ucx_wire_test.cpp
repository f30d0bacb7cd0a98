// The ucx:// wire formats as pure functions (ferry_ucx_wire, no UCX: also in the sanitizer
// builds): the handshake's order (the listener proves the secret first, nothing about the
// channel travels before both did), the key derivation, the checks of active-message
// headers against the limits, and the committed fuzz corpus replayed through the harnesses.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "ferry/channel.hpp"
#include "ferry/error.hpp"
#include "ucx/ucx_am_wire.hpp"
#include "ucx/ucx_handshake_wire.hpp"
#include "ucx_wire_harness.hpp"

namespace ferry {
namespace {

using namespace ucx::detail;
namespace fs = std::filesystem;

struct Batch {
  int value = 0;
  template <class Archive>
  void serialize(Archive& ar) {
    ar(value);
  }
};

SecretKey key_of(unsigned char seed) {
  SecretKey key;
  key.key.fill(seed);
  return key;
}
const Salt kSalt{};
Nonce nonce_of(unsigned char seed) {
  Nonce nonce;
  nonce.fill(seed);
  return nonce;
}
ClientHandshake client_with(const SecretKey& key) {
  return ClientHandshake("ucx://test:1", ferry::detail::client_receiver_kind<Batch>(), FrameLimits{}, nonce_of(2),
                         [key](const Salt&) { return key; });
}
bool contains(const Bytes& bytes, const std::string& text) {
  const auto* begin = reinterpret_cast<const char*>(bytes.data());
  return std::search(begin, begin + bytes.size(), text.begin(), text.end()) != begin + bytes.size();
}

TEST(UcxHandshakeWire, AnHonestHandshakeCarriesTheKindAndBothLimits) {
  ListenerHandshake listener(key_of(1), kSalt, nonce_of(1));
  ClientHandshake client = client_with(key_of(1));
  const auto proof = listener.receive(client.receive(listener.hello()));
  ASSERT_TRUE(proof.refused.empty());
  const auto claim = listener.receive(client.receive(proof.reply));
  ASSERT_TRUE(claim.claim.has_value()) << claim.refused;
  EXPECT_TRUE(claim.claim->matches(ferry::detail::client_receiver_kind<Batch>()));
  FrameLimits mine;
  mine.max_body_bytes = 12345;
  const Bytes verdict = listener.accept(mine);
  EXPECT_TRUE(client.verdict_check()(verdict));
  EXPECT_TRUE(client.receive(verdict).empty());
  ASSERT_TRUE(client.done());
  EXPECT_EQ(client.listener_limits().max_body_bytes, 12345u);
}

// A rogue listener (another secret) gets a nonce from the client and nothing else: the
// client checks the listener's proof before it declares anything.
TEST(UcxHandshakeWire, TheListenerProvesFirstAndARogueListenerLearnsNothing) {
  ListenerHandshake rogue(key_of(9), kSalt, nonce_of(1));
  ClientHandshake client = client_with(key_of(1));
  const Bytes challenge = client.receive(rogue.hello());
  EXPECT_FALSE(contains(challenge, std::string(ferry::detail::type_name<Batch>())));
  EXPECT_EQ(challenge.size(), 40u);  // versions and a nonce
  const auto proof = rogue.receive(challenge);
  EXPECT_THROW((void)client.receive(proof.reply), UntrustedPeer);
  EXPECT_FALSE(client.awaiting_verdict());
}

// A client of another secret that got past the proof (here: a listener of its secret with
// the same nonce answered it) is refused at its claim, and the refusal names no limit.
TEST(UcxHandshakeWire, AClaimUnderAnotherSecretIsRefusedWithoutAnythingAboutTheChannel) {
  ListenerHandshake listener(key_of(1), kSalt, nonce_of(1));
  ListenerHandshake accomplice(key_of(9), kSalt, nonce_of(1));
  ClientHandshake client = client_with(key_of(9));
  const Bytes challenge = client.receive(listener.hello());
  (void)listener.receive(challenge);
  const Bytes claim = client.receive(accomplice.receive(challenge).reply);
  const auto refused = listener.receive(claim);
  EXPECT_FALSE(refused.claim.has_value());
  EXPECT_NE(refused.refused.find("did not prove the shared secret"), std::string::npos) << refused.refused;
  EXPECT_FALSE(client.verdict_check()(refused.reply));
  try {
    (void)client.receive(refused.reply);
    ADD_FAILURE() << "a refusal was taken as acceptance";
  } catch (const UntrustedPeer& error) {
    EXPECT_NE(std::string(error.what()).find("did not prove the listener's shared secret"), std::string::npos)
        << error.what();
  }
}

TEST(UcxHandshakeWire, MessagesOfAnotherVersionOrSizeAreRefused) {
  ListenerHandshake listener(key_of(1), kSalt, nonce_of(1));
  Bytes old_hello = listener.hello();
  old_hello[4] = std::byte{3};  // handshake version 3
  ClientHandshake client = client_with(key_of(1));
  try {
    (void)client.receive(old_hello);
    ADD_FAILURE() << "a listener of another version was taken";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("ucx handshake 3"), std::string::npos) << error.what();
  }
  Bytes long_challenge = client_with(key_of(1)).receive(listener.hello());
  long_challenge.push_back(std::byte{0});
  EXPECT_FALSE(listener.receive(long_challenge).refused.empty());
}

TEST(UcxHandshakeWire, TheKeyDependsOnSecretAndSalt) {
  Salt other = kSalt;
  other[0] = 1;
  const SecretKey a = derive_key("secret", kSalt);
  EXPECT_EQ(a.key, derive_key("secret", kSalt).key);
  EXPECT_NE(a.key, derive_key("secret", other).key);
  EXPECT_NE(a.key, derive_key("secreT", kSalt).key);
}

// The review's claims, 2 GiB and 16 TiB of frame, and a header that lies about its size,
// are refused before the receiver allocates; a frame within the limits is planned.
TEST(UcxAmWire, FrameHeadersAreCheckedAgainstTheLimitsBeforeAnyAllocation) {
  const FrameLimits limits;
  const char* why = nullptr;
  for (const std::uint64_t claimed : {std::uint64_t{2} << 30, std::uint64_t{16} << 40}) {
    const FrameAmHeader header{claimed, 0, 0};
    EXPECT_FALSE(parse_frame_am(std::as_bytes(std::span(&header, 1)), claimed, limits, &why)) << claimed;
    EXPECT_NE(std::string(why).find("limits"), std::string::npos) << why;
  }
  struct {
    FrameAmHeader header{100, 2, 0};
    CopyDescriptor copies[2] = {{10, 1}, {1 << 20, 0}};
  } message;
  const auto plan = parse_frame_am(std::as_bytes(std::span(&message, 1)), 110, limits, &why);
  ASSERT_TRUE(plan.has_value()) << why;
  EXPECT_EQ(plan->remote_count, 1u);
  EXPECT_EQ(plan->inline_bytes, 10u);
  EXPECT_FALSE(parse_frame_am(std::as_bytes(std::span(&message, 1)), 111, limits, &why));  // data too long
  message.copies[0].nbytes = kInlineCopyLimit + 1;
  EXPECT_FALSE(parse_frame_am(std::as_bytes(std::span(&message, 1)), 100 + kInlineCopyLimit + 1, limits, &why));
  EXPECT_TRUE(accepted_before_handshake(kControlAm));
  for (const unsigned id : {kFrameAm, kCopyAm, kDeliveredAm}) EXPECT_FALSE(accepted_before_handshake(id));
  EXPECT_FALSE(control_message_fits(kMaxControlBytes + 1, false, 0));
  EXPECT_FALSE(control_message_fits(16, false, kMaxQueuedControls));
}

std::vector<std::uint8_t> read_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// The committed corpus and every past crash of the ucx fuzz targets run cleanly.
TEST(UcxWireFuzzCorpus, EveryCorpusAndRegressionInputRunsCleanly) {
  std::size_t handshakes = 0;
  std::size_t frames = 0;
  for (const char* group : {"corpus", "regressions"}) {
    for (const auto& [target, count] : {std::pair{"ucx_handshake", &handshakes}, std::pair{"ucx_am", &frames}}) {
      const fs::path dir = fs::path(FERRY_FUZZ_DIR) / group / target;
      if (!fs::exists(dir)) continue;
      for (const auto& entry : fs::directory_iterator(dir)) {
        SCOPED_TRACE(entry.path().string());
        const auto input = read_bytes(entry.path());
        if (std::string(target) == "ucx_handshake") {
          (void)fuzz::run_ucx_handshake(input);
        } else {
          (void)fuzz::run_ucx_am(input);
        }
        ++*count;
      }
    }
  }
  EXPECT_GT(handshakes, 0u);
  EXPECT_GT(frames, 0u);
}

}  // namespace
}  // namespace ferry
