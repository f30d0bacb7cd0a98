#include "harness.hpp"
#include "ferry/detail/frame_channel.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <set>
#include <string_view>

#include "ferry/detail/body_reader.hpp"
#include "ferry/detail/message_decoder.hpp"
#include "ferry/value.hpp"
#include "fuzz_message.hpp"

namespace ferry::fuzz {
namespace {

[[noreturn]] void harness_failure(const char* what) {
  std::fprintf(stderr, "fuzz harness: %s\n", what);
  std::abort();
}

// 128-bit arithmetic cannot overflow for products of two 64-bit values.
__extension__ typedef __int128 Wide;

// The oracle for "never reads outside what it mapped": every element of every tensor must
// lie inside its storage. Computed here independently of view_bounds_problem.
void check_view(const Tensor& tensor) {
  if (!tensor.defined() || tensor.numel() == 0) return;
  const auto& storage = tensor.storage();
  if (storage == nullptr) harness_failure("a tensor with elements has no storage");
  Wide first = tensor.storage_offset();
  Wide last = first;
  for (std::int64_t d = 0; d < tensor.dim(); ++d) {
    const Wide reach = static_cast<Wide>(tensor.size(d) - 1) * tensor.stride(d);
    if (reach < 0)
      first += reach;
    else
      last += reach;
  }
  const auto item = static_cast<Wide>(tensor.element_size());
  if (first < 0 || (last + 1) * item > static_cast<Wide>(storage->nbytes())) {
    harness_failure("a received tensor reaches outside its storage");
  }
  // Read every element of small tensors: AddressSanitizer checks heap storages bytewise.
  // The copy goes to the heap: a shared one would come from the caching allocator, whose
  // new segment (kept cached) would take the number of an fd the decoder closed and fail
  // the fd oracle below.
  if (tensor.numel() <= 4096) {
    const Tensor dense = tensor.clone(Device::Cpu);
    volatile std::uint8_t sink = 0;
    const auto* bytes = static_cast<const std::uint8_t*>(dense.data_ptr());
    for (std::size_t i = 0; i < dense.nbytes(); ++i) sink = sink ^ bytes[i];
  }
}

void check_message(const FuzzMessage& message) {
  check_view(message.tensor);
  for (const Tensor& t : message.tensors) check_view(t);
  for (const auto& [name, tensors] : message.named) {
    for (const Tensor& t : tensors) check_view(t);
  }
  if (const Tensor* t = std::get_if<Tensor>(&message.either)) check_view(*t);
  for (const FuzzInner& inner : message.inner) {
    if (inner.maybe) check_view(*inner.maybe);
  }
}

// The lowest free descriptor number: any fd leaked during a run takes it.
int lowest_free_fd() {
  const int probe = ::fcntl(0, F_DUPFD_CLOEXEC, 0);
  if (probe < 0) harness_failure("cannot probe the lowest free fd");
  ::close(probe);
  return probe;
}

detail::UniqueFd checked(int fd, const char* what) {
  if (fd < 0) harness_failure(what);
  return detail::UniqueFd(fd);
}

}  // namespace

// ---- frames -------------------------------------------------------------------------

FrameHarness::FrameHarness() {
  for (const SegmentSpec& spec : kFrameSegments) {
    Segment segment;
    switch (spec.source) {
      case SegmentSource::ReturnBoard:
        segment.board = detail::ReturnBoard::create();
        segment.fd = checked(::fcntl(segment.board->fd(), F_DUPFD_CLOEXEC, 0), "dup of a return board");
        break;
      case SegmentSource::CachedShared: {
        segment.storage = Storage::allocate(spec.bytes, Device::SharedCpu);
        const detail::SharedSegment& slab = *segment.storage->shared_block()->segment();
        if (slab.size() != kSegmentBytes) harness_failure("a cached segment is not a slab of kSegmentBytes");
        segment.fd = checked(::fcntl(slab.fd(), F_DUPFD_CLOEXEC, 0), "dup of a segment");
        break;
      }
      case SegmentSource::UncachedShared:
        segment.uncached = std::make_unique<detail::SharedMemory>(detail::SharedMemory::create(spec.bytes));
        segment.fd = checked(::fcntl(segment.uncached->fd(), F_DUPFD_CLOEXEC, 0), "dup of a segment");
        break;
      case SegmentSource::UnsealedMemfd:
        segment.fd = checked(::memfd_create("fuzz-unsealed", MFD_CLOEXEC | MFD_ALLOW_SEALING), "memfd_create");
        if (::ftruncate(segment.fd.get(), static_cast<off_t>(spec.bytes)) != 0) harness_failure("ftruncate");
        break;
      case SegmentSource::NotAMemfd: {
        int ends[2];
        if (::pipe2(ends, O_CLOEXEC) != 0) harness_failure("pipe2");
        segment.fd = detail::UniqueFd(ends[0]);
        segment.extra = detail::UniqueFd(ends[1]);
        break;
      }
    }
    if (!segment.fd) harness_failure("segment without fd");
    segment.identity = detail::identify_fd(segment.fd.get());
    segments_.push_back(std::move(segment));
  }
}

// /proc/<pid>/fd/<n> segment entries name descriptors by number: point them at the
// harness's own segments (pid: this process, fd: segment n % count) so that no number from
// the input is ever opened. The claimed identity becomes the segment's, unless `reserved` is
// non-zero: then the input's identity stays, to exercise the mismatch check.
void FrameHarness::rewrite_proc_entries(std::vector<std::byte>& payload) const {
  detail::FrameHeader header;
  std::memcpy(&header, payload.data(), sizeof header);
  const std::size_t table = sizeof header + header.type_name_bytes;
  for (std::uint32_t i = 0; i < header.segment_count; ++i) {
    const std::size_t at = table + std::size_t{i} * sizeof(detail::SegmentEntry);
    if (at + sizeof(detail::SegmentEntry) > payload.size()) return;
    detail::SegmentEntry entry;
    std::memcpy(&entry, payload.data() + at, sizeof entry);
    if (entry.kind != static_cast<std::uint32_t>(::ferry::detail::SegmentKind::NewProcFd)) continue;
    const Segment& segment = segments_[static_cast<std::uint32_t>(entry.fd) % segments_.size()];
    if (entry.pid > 0) entry.pid = ::getpid();
    if (entry.fd >= 0) entry.fd = segment.fd.get();
    if (entry.reserved == 0) {
      entry.device = segment.identity.device;
      entry.inode = segment.identity.inode;
    }
    std::memcpy(payload.data() + at, &entry, sizeof entry);
  }
}

std::size_t FrameHarness::run(std::span<const std::uint8_t> input) {
  const int lowest_before = lowest_free_fd();
  std::size_t decoded = 0;
  std::vector<int> handed;
  {
    detail::MessageDecoder decoder(detail::type_fingerprint<FuzzMessage>(), detail::type_name<FuzzMessage>());
    std::deque<detail::UniqueFd> fds;  // what the transport queues for the receiver
    std::vector<std::byte> frame;
    const FrameLimits limits{};
    while (input.size() >= sizeof(detail::FrameHeader)) {
      detail::FrameHeader header;
      std::memcpy(&header, input.data(), sizeof header);
      try {
        detail::validate_header(header, limits);
      } catch (const ProtocolError&) {
        break;
      }
      const std::uint64_t total = detail::payload_bytes(header);
      if (total > input.size() - sizeof header) break;  // a transport would wait for more
      // The whole frame, header included, so that the /proc rewrite sees the header.
      frame.assign(reinterpret_cast<const std::byte*>(input.data()),
                   reinterpret_cast<const std::byte*>(input.data()) + sizeof header + total);
      input = input.subspan(sizeof header + total);
      if (header.kind == static_cast<std::uint8_t>(detail::FrameKind::Close)) break;
      rewrite_proc_entries(frame);

      std::uint64_t count = header.fd_count;
      if ((header.flags & kHarnessOneFdShort) && count > 0) --count;
      if (header.flags & kHarnessOneFdExtra) ++count;
      for (std::uint64_t i = 0; i < count; ++i) {
        const Segment& segment = segments_[(header.sequence + i) % segments_.size()];
        fds.emplace_back(checked(::fcntl(segment.fd.get(), F_DUPFD_CLOEXEC, 0), "dup of a segment"));
        handed.push_back(fds.back().get());
      }
      try {
        decoder.decode(header, std::span<const std::byte>(frame).subspan(sizeof header), fds);
        const FuzzMessage message = decoder.read<FuzzMessage>();
        check_message(message);
        ++decoded;
      } catch (const ProtocolError&) {
        break;  // the receiver is broken from here on, as ReceiverCore marks it
      }
    }
    decoder.release_all();
  }
  // Nothing the receiver was handed may stay open once its channel is gone. (Each number
  // was free when it was handed out, and the harness's own fds stay open throughout.)
  for (const int fd : handed) {
    if (::fcntl(fd, F_GETFD) != -1) harness_failure("an fd handed to the decoder is still open after the run");
  }
  if (lowest_free_fd() != lowest_before) harness_failure("the decoder leaked a file descriptor");
  return decoded;
}

// ---- bodies -------------------------------------------------------------------------

BodyHarness::BodyHarness() {
  for (const std::size_t bytes : kBodyStorageBytes) storages_.push_back(Storage::allocate(bytes, Device::Cpu));
}

bool BodyHarness::run(std::span<const std::uint8_t> input) {
  const std::span<const std::byte> body(reinterpret_cast<const std::byte*>(input.data()), input.size());
  try {
    check_message(detail::read_body<FuzzMessage>(body, storages_));
    return true;
  } catch (const ProtocolError&) {
    return false;
  }
}

// ---- Values -------------------------------------------------------------------------

namespace {

// What the decoder promises of every Value it returns; `elements` counts the whole tree.
void check_value(const Value& value, std::size_t depth, std::size_t& elements) {
  if (depth > kMaxValueDepth) harness_failure("a decoded Value nests deeper than kMaxValueDepth");
  if (++elements > kMaxValueElements) harness_failure("a decoded Value holds more than kMaxValueElements values");
  switch (value.kind()) {
    case ValueKind::String:
      if (!is_valid_utf8(value.as_string())) harness_failure("a decoded Value string is not valid UTF-8");
      return;
    case ValueKind::Tensor: check_view(value.as_tensor()); return;
    case ValueKind::List:
      for (const Value& element : value.as_list()) check_value(element, depth + 1, elements);
      return;
    case ValueKind::Map: {
      std::set<std::string_view> keys;
      for (const auto& [key, element] : value.as_map()) {
        if (!is_valid_utf8(key)) harness_failure("a decoded Value map key is not valid UTF-8");
        if (!keys.insert(key).second) harness_failure("a decoded Value map holds a key twice");
        check_value(element, depth + 1, elements);
      }
      return;
    }
    default: return;
  }
}

}  // namespace

ValueHarness::ValueHarness() {
  for (const std::size_t bytes : kBodyStorageBytes) storages_.push_back(Storage::allocate(bytes, Device::Cpu));
}

bool ValueHarness::run(std::span<const std::uint8_t> input) {
  const std::span<const std::byte> body(reinterpret_cast<const std::byte*>(input.data()), input.size());
  try {
    const Value value = detail::read_body<Value>(body, storages_);
    std::size_t elements = 0;
    check_value(value, 1, elements);
    return true;
  } catch (const ProtocolError&) {
    return false;
  }
}

}  // namespace ferry::fuzz
