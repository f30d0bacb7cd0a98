// ucx:// listeners attacked by peers that know no secret (docs/hardening.md lists each
// attack): plain UCP peers that skip the handshake and send frame messages claiming huge
// sizes, and floods of silent peers that connect and vanish. The listener allocates nothing
// for them, never aborts, gives back every worker, fd and byte, and keeps serving a good
// client meanwhile.
//
// A process forked after it used UCX must not touch UCX: each test forks its listener
// before the parent's first UCX call and gets the address through a pipe.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "ferry/ferry.hpp"
#include "support/address_pipe.hpp"
#include "support/leak_check.hpp"
#include "support/process.hpp"
#include "support/ucx_test_endpoints.hpp"
#include "ucx/ucx_address.hpp"
#include "ucx/ucx_am_wire.hpp"
#include "ucx/ucx_context.hpp"

namespace ferry {
namespace {

using namespace std::chrono_literals;
using test::AddressPipe;
using test::fork_child;
using test::wait_child;

using Batch = test::UcxBatch;

// Connecting waits longer than in ucx_test.cpp: floods of peers load the listener.
EndpointOptions quiet_options() { return test::quiet_ucx_options("attack test secret", 10s, 500ms); }

// A line of /proc/self/status in kB ("VmHWM", "VmRSS").
std::size_t status_kib(const std::string& field) {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind(field + ":", 0) == 0) return std::stoul(line.substr(field.size() + 1));
  }
  throw std::runtime_error("no " + field + " in /proc/self/status");
}

// A UCP peer that speaks no ferry: its own worker and endpoint to a listener, and raw
// active messages. It counts the listener's handshake messages and never answers them.
class RawUcpPeer {
 public:
  RawUcpPeer(ucp_context_h context, const ucx::detail::UcxAddress& to) {
    ucp_worker_params_t worker_params{};
    worker_params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    worker_params.thread_mode = UCS_THREAD_MODE_SINGLE;
    ucx::detail::check_ucs(ucp_worker_create(context, &worker_params, &worker_), "ucp_worker_create");
    ucp_am_handler_param_t handler{};
    handler.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                         UCP_AM_HANDLER_PARAM_FIELD_ARG | UCP_AM_HANDLER_PARAM_FIELD_FLAGS;
    handler.id = ucx::detail::kControlAm;
    handler.flags = UCP_AM_FLAG_WHOLE_MSG;
    handler.arg = this;
    handler.cb = [](void* self, const void*, std::size_t, void*, std::size_t, const ucp_am_recv_param_t*) {
      ++static_cast<RawUcpPeer*>(self)->controls_;
      return UCS_OK;
    };
    ucx::detail::check_ucs(ucp_worker_set_am_recv_handler(worker_, &handler), "ucp_worker_set_am_recv_handler");
    ucp_ep_params_t params{};
    params.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR | UCP_EP_PARAM_FIELD_ERR_HANDLER |
                        UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
    params.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
    params.sockaddr.addr = reinterpret_cast<const sockaddr*>(&to.socket);
    params.sockaddr.addrlen = to.length;
    params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    params.err_handler.cb = [](void* self, ucp_ep_h, ucs_status_t) { static_cast<RawUcpPeer*>(self)->gone_ = true; };
    params.err_handler.arg = this;
    ucx::detail::check_ucs(ucp_ep_create(worker_, &params, &ep_), "ucp_ep_create");
  }
  ~RawUcpPeer() {
    ucp_request_param_t params{};
    params.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    params.flags = UCP_EP_CLOSE_FLAG_FORCE;
    ucs_status_ptr_t close = ucp_ep_close_nbx(ep_, &params);
    for (int round = 0; close != nullptr && !UCS_PTR_IS_ERR(close) && round < 100000 &&
                        ucp_request_check_status(close) == UCS_INPROGRESS;
         ++round) {
      ucp_worker_progress(worker_);
    }
    if (close != nullptr && !UCS_PTR_IS_ERR(close)) ucp_request_free(close);
    for (void* request : requests_) ucp_request_free(request);
    ucp_worker_destroy(worker_);
  }
  RawUcpPeer(const RawUcpPeer&) = delete;
  RawUcpPeer& operator=(const RawUcpPeer&) = delete;

  void progress_for(std::chrono::milliseconds time) {
    const auto until = std::chrono::steady_clock::now() + time;
    while (std::chrono::steady_clock::now() < until) {
      ucp_worker_progress(worker_);
      std::this_thread::sleep_for(100us);
    }
  }
  // Progresses until the listener's first handshake message came (true) or it hung up.
  bool wait_for_handshake(std::chrono::milliseconds timeout) {
    const auto until = std::chrono::steady_clock::now() + timeout;
    while (controls_ == 0 && !gone_ && std::chrono::steady_clock::now() < until) ucp_worker_progress(worker_);
    return controls_ > 0;
  }
  // An active message `id` with `header`, whose data `bytes` of `data` go by rendezvous.
  void send_rendezvous(unsigned id, const void* header, std::size_t header_bytes, const void* data, std::size_t bytes) {
    ucp_request_param_t params{};
    params.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    params.flags = UCP_AM_SEND_FLAG_RNDV;
    ucs_status_ptr_t request = ucp_am_send_nbx(ep_, id, header, header_bytes, data, bytes, &params);
    if (UCS_PTR_IS_ERR(request)) throw std::runtime_error("ucp_am_send_nbx failed");
    if (request != nullptr) requests_.push_back(request);
  }
  bool gone() const noexcept { return gone_; }

 private:
  ucp_worker_h worker_ = nullptr;
  ucp_ep_h ep_ = nullptr;
  int controls_ = 0;
  bool gone_ = false;
  std::vector<void*> requests_;
};

// Address space the peer claims to send from: readable, never backed (reads give zeros).
class Reservation {
 public:
  explicit Reservation(std::size_t bytes) : bytes_(bytes) {
    data_ = ::mmap(nullptr, bytes, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (data_ == MAP_FAILED) throw std::runtime_error("mmap of the claimed size failed");
  }
  ~Reservation() { ::munmap(data_, bytes_); }
  const void* data() const noexcept { return data_; }

 private:
  void* data_;
  std::size_t bytes_;
};

class UcxAttackTest : public test::LeakCheckedTest {};

// The review's attack: a plain UCP peer that never answers the challenge sends a frame
// message by rendezvous claiming 2 GiB, another one 16 TiB. Before the fix the listener
// allocated the claimed size in the frame handler (2 GiB), or threw std::bad_alloc inside
// ucp_worker_progress and aborted (16 TiB). Now each connection is refused before anything
// is allocated, the listener's memory stays put, and a good client is served after them.
TEST_F(UcxAttackTest, FramesBeforeTheHandshakeAllocateNothingAndTheListenerServesOn) {
  AddressPipe address_pipe;
  const pid_t listener_process = fork_child([&] {
    std::vector<std::string> refusals;
    EndpointOptions options = quiet_options();
    options.on_refusal = [&](const std::string& why) { refusals.push_back(why); };
    auto listener = listen("ucx://127.0.0.1:0", options);
    listener.serve_sender<Batch>();
    const std::size_t peak_before = status_kib("VmHWM");
    address_pipe.put(listener.address());
    auto sender = listener.accept_sender_for<Batch>(30s);
    CHILD_CHECK(sender.has_value());
    sender->send(Batch{5, {}});
    CHILD_CHECK(sender->flush(10s));
    const std::size_t grown_kib = status_kib("VmHWM") - peak_before;
    std::fprintf(stderr, "listener peak memory grew by %zu KiB\n", grown_kib);
    CHILD_CHECK(grown_kib < 256 * 1024);
    CHILD_CHECK(refusals.size() == 2);
    for (const std::string& why : refusals) {
      CHILD_CHECK(why.find("before the peer proved the shared secret") != std::string::npos);
    }
  });
  const std::string address = address_pipe.get();
  const ucx::detail::UcxAddress parsed = ucx::detail::parse_ucx_address(address);
  auto context = ucx::detail::UcxContext::get({}, AF_INET);
  for (const std::size_t claimed : {std::size_t{2} << 30, std::size_t{16} << 40}) {
    const Reservation buffer(claimed);
    RawUcpPeer peer(context->handle(), parsed);
    ASSERT_TRUE(peer.wait_for_handshake(10s)) << "the listener sent no challenge";
    const ucx::detail::FrameAmHeader header{claimed, 0, 0};
    peer.send_rendezvous(ucx::detail::kFrameAm, &header, sizeof header, buffer.data(), claimed);
    // The listener refuses the connection: the peer sees it closed.
    const auto until = std::chrono::steady_clock::now() + 10s;
    while (!peer.gone() && std::chrono::steady_clock::now() < until) peer.progress_for(10ms);
    EXPECT_TRUE(peer.gone()) << "the listener kept a connection that sent a frame before its handshake";
  }
  {
    Receiver<Batch> good = connect_receiver<Batch>(address, quiet_options());
    auto batch = good.recv_for(10s);
    ASSERT_TRUE(batch.has_value());
    EXPECT_EQ(batch->index, 5);
  }  // closed before the wait: the listener's end then closes without waiting for it
  const auto exit = wait_child(listener_process);
  EXPECT_TRUE(exit.exited && exit.code == 0) << exit.describe();
}

// Forks (before the caller's first UCX call) a process of `peers` silent UCP peers: once
// the listener's address comes through `go`, each connects; the first `answering` wait
// until the listener's challenge arrived, the others not at all; then all vanish at once
// (_Exit: no close, as a killed process), or, with `hold`, stay until killed.
pid_t fork_silent_peers(AddressPipe& go, int peers, int answering, bool hold) {
  return fork_child([&go, peers, answering, hold] {
    const ucx::detail::UcxAddress parsed = ucx::detail::parse_ucx_address(go.get(60s));
    auto context = ucx::detail::UcxContext::get({}, AF_INET);
    std::vector<std::unique_ptr<RawUcpPeer>> all;
    for (int i = 0; i < peers; ++i) all.push_back(std::make_unique<RawUcpPeer>(context->handle(), parsed));
    for (int i = 0; i < answering; ++i) (void)all[i]->wait_for_handshake(5s);
    for (auto& peer : all) peer->progress_for(1ms);
    if (hold) {
      for (;;) ::pause();
    }
    std::_Exit(0);
  });
}

bool exited(pid_t child) {
  int status = 0;
  return ::waitpid(child, &status, WNOHANG) == child;
}

// Keeps the listener's handshakes moving (accepting nothing) until `done` or `timeout`.
template <class Done>
bool pump_until(Listener& listener, std::chrono::milliseconds timeout, Done done) {
  const auto until = std::chrono::steady_clock::now() + timeout;
  while (!done()) {
    if (std::chrono::steady_clock::now() > until) return false;
    (void)listener.accept_sender_for<Batch>(10ms);
  }
  return true;
}

// Two rounds of silent peers that connect and vanish, some after the listener's challenge
// arrived, some before their connection was accepted: every worker, endpoint and fd goes
// back, and the second round leaves the listener's memory where the first left it. (The
// review saw two rounds of 200 such peers take a listener from 17 to 1,211 fds, not given
// back.)
TEST_F(UcxAttackTest, SilentPeersThatConnectAndVanishGiveBackEveryFdAndByte) {
  constexpr int kPeers = 32;
  AddressPipe go[2];
  const pid_t rounds[2] = {fork_silent_peers(go[0], kPeers, kPeers / 2, false),
                           fork_silent_peers(go[1], kPeers, kPeers / 2, false)};
  EndpointOptions options = quiet_options();
  options.handshake_timeout = 1s;
  auto listener = listen("ucx://127.0.0.1:0", options);
  listener.serve_sender<Batch>();
  const std::size_t fds_before = test::count_open_fds();
  std::size_t rss_after_first = 0;
  for (int round = 0; round < 2; ++round) {
    go[round].put(listener.address());
    bool child_gone = false;
    EXPECT_TRUE(pump_until(listener, 30s,
                           [&] {
                             child_gone = child_gone || exited(rounds[round]);
                             return child_gone && detail::EndAccess::core(listener).pending_count() == 0 &&
                                    test::count_open_fds() == fds_before;
                           }))
        << "round " << round << ": " << test::count_open_fds() << " fds open, " << fds_before << " before; "
        << detail::EndAccess::core(listener).pending_count() << " handshakes pending";
    if (round == 0) rss_after_first = status_kib("VmRSS");
  }
  const std::size_t rss_after_second = status_kib("VmRSS");
  std::fprintf(stderr, "listener RSS after round 1: %zu KiB, after round 2: %zu KiB\n", rss_after_first,
               rss_after_second);
  EXPECT_LT(rss_after_second, rss_after_first + 16 * 1024) << "the second round's peers left memory behind";
  // And the listener still serves.
  std::optional<Receiver<Batch>> good;
  std::thread client([&] { good = connect_receiver<Batch>(listener.address(), quiet_options()); });
  auto sender = listener.accept_sender_for<Batch>(10s);
  client.join();
  EXPECT_TRUE(sender.has_value());
}

// A flood of silent peers that stay: at most max_pending_handshakes of them hold a
// connection at any time, and a good client that arrives during the flood is served at once.
TEST_F(UcxAttackTest, AFloodOfSilentPeersIsCappedAndAGoodClientIsServedMeanwhile) {
  constexpr std::size_t kCap = 8;
  AddressPipe go;
  const pid_t flood = fork_silent_peers(go, 40, 40, true);
  EndpointOptions options = quiet_options();
  options.max_pending_handshakes = kCap;
  options.handshake_timeout = 30s;  // the cap, not the deadline, bounds them here
  auto listener = listen("ucx://127.0.0.1:0", options);
  listener.serve_sender<Batch>();
  const std::size_t fds_before = test::count_open_fds();
  go.put(listener.address());
  std::size_t most_pending = 0;
  EXPECT_TRUE(pump_until(listener, 20s, [&] {
    most_pending = std::max(most_pending, detail::EndAccess::core(listener).pending_count());
    return most_pending == kCap;
  }));
  std::optional<Receiver<Batch>> good;
  const auto start = std::chrono::steady_clock::now();
  std::thread client([&] { good = connect_receiver<Batch>(listener.address(), quiet_options()); });
  std::optional<Sender<Batch>> sender;
  while (!sender && std::chrono::steady_clock::now() - start < 10s) {
    sender = listener.accept_sender_for<Batch>(10ms);
    most_pending = std::max(most_pending, detail::EndAccess::core(listener).pending_count());
  }
  client.join();
  ASSERT_TRUE(sender.has_value());
  EXPECT_LT(std::chrono::steady_clock::now() - start, 3s) << "the flood delayed the good client";
  sender->send(Batch{9, {}});
  auto batch = good->recv_for(5s);
  EXPECT_TRUE(batch.has_value() && batch->index == 9);
  EXPECT_LE(most_pending, kCap);
  good.reset();  // first: the sender's close then finds its peer gone and waits for nothing
  sender.reset();
  ASSERT_EQ(::kill(flood, SIGKILL), 0);
  EXPECT_EQ(wait_child(flood).signal, SIGKILL);
  EXPECT_TRUE(pump_until(
      listener, 20s,
      [&] { return detail::EndAccess::core(listener).pending_count() == 0 && test::count_open_fds() == fds_before; }))
      << test::count_open_fds() << " fds open, " << fds_before << " before";
}

}  // namespace
}  // namespace ferry
