// One UCX connection: a UCP worker of its own (so that its wake-up fd tells of this
// connection only, for Selector and timed reads), one endpoint, and the messages that
// arrived on it. Messages are active messages of three kinds: control (the handshake),
// frame (a ferry frame, with its small storages inside) and copy (one large storage,
// received by rendezvous straight into a Device::SharedCpu storage of the caching
// allocator). The writer and the reader of a connection share it; every UCX call happens
// under its mutex, and waits release the mutex while they sleep on the wake-up fd.
#pragma once

#include <sys/socket.h>
#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <ucp/api/ucp.h>

#include "ferry/detail/deadline.hpp"
#include "ferry/detail/frame.hpp"
#include "ferry/detail/thread_annotations.hpp"
#include "ferry/storage.hpp"
#include "ucx_am_wire.hpp"
#include "ucx_context.hpp"

namespace ferry::ucx::detail {

/// The longest a wait sleeps on a UCX wake-up fd before it progresses the worker again.
/// UCX before 1.14 may leave the fd quiet for an event that did arrive (a wake-up stall of
/// seconds, reported upstream for TCP); such a miss then costs at most this long.
inline constexpr std::chrono::milliseconds kLongestWakeFdSleep{50};

/// A frame that arrived (or is arriving): its bytes and its storages.
struct IncomingFrame {
  std::vector<std::byte> bytes;  // the frame (header and payload)
  std::deque<std::shared_ptr<Storage>> copies;
  std::vector<CopyDescriptor> descriptors;
  std::size_t remote_expected = 0;  // copy messages this frame still waits to start
  std::size_t in_flight = 0;        // rendezvous receives not complete yet
  bool complete() const noexcept { return remote_expected == 0 && in_flight == 0; }
};

class UcxConnection {
 public:
  /// Connects to `address` (a listener's socket address). Failures surface later, as
  /// failed() (the listener is not there: retry).
  static std::shared_ptr<UcxConnection> connect(std::shared_ptr<UcxContext> context, const sockaddr_storage& address,
                                                socklen_t length, FrameLimits limits);
  /// Accepts the connection request `request` of `listener`, on a worker of its own. On
  /// failure the request is rejected or consumed: the caller does nothing more with it.
  static std::shared_ptr<UcxConnection> accept(std::shared_ptr<UcxContext> context, ucp_listener_h listener,
                                               ucp_conn_request_h request, FrameLimits limits);
  ~UcxConnection();
  UcxConnection(const UcxConnection&) = delete;
  UcxConnection& operator=(const UcxConnection&) = delete;

  /// Starts sending one control message (copied) and returns without waiting: it leaves
  /// as the worker progresses (any later wait, or close's linger). Throws ChannelClosed
  /// when the peer is gone; a send that fails later is reported by receive_control.
  void send_control(std::span<const std::byte> message);
  /// The next control message, waiting until `deadline`; nullopt on timeout. Throws
  /// ChannelClosed when the peer is gone.
  std::optional<std::vector<std::byte>> receive_control(const ferry::detail::Deadline& deadline);
  /// Control message already arrived (no wait); nullopt if none. Throws like receive_control.
  std::optional<std::vector<std::byte>> poll_control();
  /// The peer proved the shared secret: frame, copy and delivery messages are taken from now on.
  void authenticate() noexcept;
  /// For the side that learns of its peer's proof from the peer's last handshake message:
  /// the next control message to arrive is passed to `check` inside the callback that
  /// receives it, and `check` returning true authenticates the connection before any
  /// message behind it is looked at (a peer may send frames right behind its last
  /// handshake message). `check` must not throw.
  void authenticate_if(std::function<bool(std::span<const std::byte>)> check);
  /// Whether the handshake proved the peer.
  bool authenticated();

  /// Sends a frame (`parts`, copied) and the bytes of its Copied storages, read in place
  /// (`owners` keep them alive meanwhile), and waits until the frame left or `deadline`
  /// passed: large copies travel by rendezvous, which moves only while both workers
  /// progress, so it returns once the receiver took them (it is reading). A frame not gone
  /// at `deadline` stays in flight (true: it is sent, as a timed write of a socket leaves
  /// bytes in the kernel). Returns false, sending nothing, when the frames in flight were
  /// still above their cap (kMaxFramesInFlight, kMaxBytesInFlight) at `deadline`. Throws
  /// ChannelClosed when the peer is gone (then also for a frame whose send it had started).
  /// These three charge their time blocked to `charged` (FrameWriter::waits_charged_to()).
  bool send_frame(std::span<const iovec> parts, std::span<const iovec> copies,
                  std::span<const std::shared_ptr<Storage>> owners, const ferry::detail::Deadline& deadline,
                  ferry::detail::EndStats* charged);
  /// Waits until every frame sent has left (false: `deadline` passed first). Throws
  /// ChannelClosed when the peer is gone.
  bool flush(const ferry::detail::Deadline& deadline, ferry::detail::EndStats* charged);
  /// The oldest complete frame, waiting until `deadline`; nullopt on timeout. Throws
  /// PeerDied when the peer vanished (no complete frame left), ProtocolError for a frame
  /// message that breaks the protocol.
  std::optional<IncomingFrame> receive_frame(const ferry::detail::Deadline& deadline, ferry::detail::EndStats* charged);
  /// True when a complete frame is queued, the connection failed, or it broke (after
  /// progressing the worker and arming its wake-up fd, so that a poll on wake_fd() after
  /// false wakes for the next event).
  bool frame_ready();
  /// Like frame_ready(), for control messages (the listener waits on many handshakes).
  bool control_ready();

  /// Tells the writer at the other end that recv() returned its frame `sequence`, which it
  /// tracks (a fan-out's consumer): a small message, not waited for. Nothing once the
  /// connection failed.
  void send_delivered(std::uint64_t sequence) noexcept;
  /// The highest sequence the reader at the other end reported delivered (0: none), after
  /// progressing the worker.
  std::uint64_t delivered();
  /// The worker's wake-up fd.
  int wake_fd() const noexcept { return wake_fd_; }
  /// True once the endpoint reported an error (peer gone, connection refused).
  bool failed();
  /// The error's text ("" while none).
  std::string failure();
  /// Closes the endpoint, flushing what was sent (unless `force`), waiting at most `linger`.
  void close(std::chrono::milliseconds linger, bool force = false) noexcept;
  /// The peer's address ("HOST:PORT") for messages; set once by whoever made the connection.
  std::string peer_address();
  void set_peer_address(std::string name) { peer_name_ = std::move(name); }
  /// Once the handshake is through: TCP keepalive on the connection's own sockets (those to
  /// the peer's host that UCX made since the endpoint was created; keep_sockets_alive), and
  /// while this end waits for frames it sent, a look every kHostCheck at them: when the host
  /// answered nothing for keepalive_bound() while data waited for it, the connection fails
  /// (shut_down_unanswering_sockets). The program's other sockets are left alone.
  void keep_alive(const sockaddr_storage& peer);

 private:
  UcxConnection(std::shared_ptr<UcxContext> context, FrameLimits limits);
  void create_worker();
  void create_endpoint(const ucp_ep_params_t& params);
  // Progresses the worker until it has nothing more to do (mutex_ held).
  void progress_locked() FERRY_REQUIRES(mutex_);
  // Progress, then arm the wake-up fd; true when something may have arrived meanwhile.
  bool arm_locked() FERRY_REQUIRES(mutex_);
  // Waits until `ready()` (checked under the lock after progress) or `deadline`; false on
  // timeout. Its sleeps are charged to `charged` as blocked time.
  template <class Ready>
  bool wait_until(ferry::detail::MutexLock& lock, const ferry::detail::Deadline& deadline, Ready ready,
                  ferry::detail::EndStats* charged = nullptr) FERRY_REQUIRES(mutex_);
  // How long one sleep of wait_until lasts at most (mutex_ held): until `deadline`, or the
  // next host check while frames sent wait for a watched host (keep_alive()).
  ferry::detail::Deadline sleep_until(const ferry::detail::Deadline& deadline) const;
  // A sleep of wait_until ended without news: when a host check is due (every kHostCheck,
  // across waits), fails the connection if its host answered nothing for the keepalive
  // bound while data waited for it (mutex_ held).
  void check_host_locked() FERRY_REQUIRES(mutex_);
  // `memh`: the registration of `data`'s segment, or nullptr.
  void send_am(unsigned id, const void* header, std::size_t header_bytes, const void* data, std::size_t bytes,
               bool rendezvous, std::vector<void*>& requests, ucp_mem_h memh = nullptr);

  static void on_error(void* self, ucp_ep_h ep, ucs_status_t status);
  static ucs_status_t on_control(void* self, const void* header, std::size_t header_length, void* data,
                                 std::size_t length, const ucp_am_recv_param_t* param);
  static ucs_status_t on_frame(void* self, const void* header, std::size_t header_length, void* data,
                               std::size_t length, const ucp_am_recv_param_t* param);
  static ucs_status_t on_delivered(void* self, const void* header, std::size_t header_length, void* data,
                                   std::size_t length, const ucp_am_recv_param_t* param);
  static ucs_status_t on_copy(void* self, const void* header, std::size_t header_length, void* data, std::size_t length,
                              const ucp_am_recv_param_t* param);
  // Starts receiving a rendezvous message of `length` into `into`; `frame` counts it in flight.
  void receive_rendezvous(void* descriptor, void* into, std::size_t length, IncomingFrame& frame, ucp_mem_h memh);
  // Records the first protocol breach (noexcept: called inside UCX callbacks).
  void break_protocol(const std::string& reason) noexcept;
  void break_protocol(const char* reason) noexcept;
  // Runs a callback's body; an exception breaks the connection instead of unwinding into UCX.
  template <class Body>
  static ucs_status_t guarded(void* self, Body body) noexcept;
  // Breaks the connection when a message of `id` arrives before the handshake ended.
  bool refuse_unauthenticated(unsigned id) noexcept;

  std::shared_ptr<UcxContext> context_;
  FrameLimits limits_;
  pid_t owner_;
  ferry::detail::Mutex mutex_;
  ucp_worker_h worker_ = nullptr;
  ucp_ep_h ep_ = nullptr;
  int wake_fd_ = -1;
  bool failed_ = false;
  std::string failure_;
  std::string broken_;                                             // a protocol error in what arrived
  bool authenticated_ = false;                                     // the handshake proved the peer: frames are taken
  std::function<bool(std::span<const std::byte>)> authenticator_;  // authenticate_if()
  std::string peer_name_;
  std::vector<ino_t> sockets_before_;                        // sockets() before the endpoint was made
  std::optional<sockaddr_storage> watched_host_;             // keep_alive(): the peer, whose host is watched
  std::vector<ino_t> own_sockets_;                           // keep_alive(): the sockets UCX made for this connection
  std::chrono::milliseconds host_silence_{0};                // keepalive_bound() of the context
  std::chrono::steady_clock::time_point next_host_check_{};  // check_host_locked() runs again then
  std::uint64_t delivered_ = 0;  // the highest sequence the peer's reader reported delivered
  std::deque<std::vector<std::byte>> controls_;
  std::list<IncomingFrame> frames_;  // list: rendezvous receives point into its elements
  struct RendezvousReceive {
    UcxConnection* connection;
    IncomingFrame* frame;
    void* request = nullptr;
  };
  std::list<RendezvousReceive> receives_;  // the user data of rendezvous receives in flight
  // A frame being sent: its message (the AM header must live until its send completes in
  // UCX 1.13), the storages its copies read, and its UCX requests.
  struct Outgoing {
    std::vector<std::byte> buffer;
    std::vector<std::shared_ptr<Storage>> owners;
    std::vector<void*> requests;
    std::size_t bytes = 0;
  };
  // Frees completed requests and drops frames that left; records a failed one.
  void reap_locked() FERRY_REQUIRES(mutex_);
  std::size_t outgoing_bytes_locked() const noexcept FERRY_REQUIRES(mutex_);
  std::deque<Outgoing> outgoing_;
  ucs_status_t send_failure_ = UCS_OK;
};

}  // namespace ferry::ucx::detail
