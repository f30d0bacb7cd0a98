// Writes the seed corpus of the fuzz targets: real frames and bodies produced by
// MessageEncoder, with storages sized so that the harnesses resolve them to their own
// segments (see fuzz_message.hpp). Deterministic: running it again gives the same files.
// Usage: ferry_fuzz_seeds <corpus dir>   (writes <dir>/frame/*, body/*, value/*, handshake/*,
// listener/* and codec/*)
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "codec_harness.hpp"
#include "endpoints/handshake.hpp"
#include "ferry/detail/message_encoder.hpp"
#include "ferry/value.hpp"
#include "fuzz_message.hpp"
#include "handshake_harness.hpp"

namespace ferry::fuzz {
namespace {

using Bytes = std::vector<std::byte>;

Tensor shared_bytes(std::size_t bytes) {
  return Tensor::zeros({static_cast<std::int64_t>(bytes)}, DType::UInt8, Device::SharedCpu);
}

// Appends one encoded frame to `stream`. Segment entries named by /proc path are made
// deterministic and point at the harness segment the i-th fd of the frame would be (the
// harness rewrites pid, fd and identity), so both seed streams resolve alike.
void append_frame(Bytes& stream, detail::MessageEncoder& encoder, const detail::EncodedFrame& encoded) {
  const std::size_t start = stream.size();
  for (const iovec& part : encoded.iovecs()) {
    const auto* begin = static_cast<const std::byte*>(part.iov_base);
    stream.insert(stream.end(), begin, begin + part.iov_len);
  }
  encoder.commit();
  detail::FrameHeader header;
  std::memcpy(&header, stream.data() + start, sizeof header);
  const std::size_t table = start + sizeof header + header.type_name_bytes;
  for (std::uint32_t i = 0; i < header.segment_count; ++i) {
    detail::SegmentEntry entry;
    std::memcpy(&entry, stream.data() + table + i * sizeof entry, sizeof entry);
    if (entry.kind != static_cast<std::uint32_t>(::ferry::detail::SegmentKind::NewProcFd)) continue;
    entry.pid = 1;
    entry.device = 0;
    entry.inode = 0;
    entry.fd = static_cast<std::int32_t>((header.sequence + i) % kFrameSegmentCount);
    std::memcpy(stream.data() + table + i * sizeof entry, &entry, sizeof entry);
  }
}

// A message with tensors everywhere: storages a (4096 B), b (256 B), c (65536 B), first
// met in this order, each in a slab of its own size class: frame 1's segment table is the
// return board, then a's, b's and c's slabs, which the harness resolves to its segments 1
// (its return board), 2, 3 and 4.
FuzzMessage rich_message(const Tensor& a, const Tensor& b, const Tensor& c) {
  FuzzMessage m;
  m.step = 42;
  m.flag = true;
  m.tag = "train";
  m.tensor = a.view({32, 32});
  m.tensors = {a.slice(0, 8, 1000, 3), b, Tensor(), Tensor::zeros({0, 5}, DType::Int16, Device::SharedCpu)};
  m.named["pair"] = {b.select(0, 3), a.view({32, 32}).transpose(0, 1)};
  m.named["empty"] = {};
  m.either = c.view({4, 2048});
  m.inner = {FuzzInner{"w", a.view({2, 512}), {1, 2, 3}}, FuzzInner{"", std::nullopt, {}}};
  return m;
}

FuzzMessage plain_message() {
  FuzzMessage m;
  m.step = -7;
  m.tag = std::string(40, 'x');
  m.either = std::string("variant string");
  m.named["k"] = {Tensor()};
  m.inner = {FuzzInner{"only values", std::nullopt, {5, 6, 7, 8}}};
  return m;
}

// A stream of three frames: new storages, then a lease reuse with a release and a new block
// in a leased segment, then close.
Bytes stream_of_frames(detail::HandlePassing passing) {
  Bytes stream;
  detail::MessageEncoder encoder(passing);
  Tensor a = Tensor::zeros({1024}, DType::Float32, Device::SharedCpu);
  Tensor c = Tensor::zeros({8192}, DType::Int64, Device::SharedCpu);
  {
    Tensor b = Tensor::zeros({64}, DType::Float32, Device::SharedCpu);
    append_frame(stream, encoder, encoder.encode(rich_message(a, b, c)));
  }  // b dies: frame 2 announces its release
  FuzzMessage second = plain_message();
  second.tensor = a;
  second.tensors = {shared_bytes(256)};  // a new block in b's slab: no new segment
  append_frame(stream, encoder, encoder.encode(second));
  append_frame(stream, encoder, encoder.encode_close());
  return stream;
}

Bytes single_frame(const FuzzMessage& message) {
  Bytes stream;
  detail::MessageEncoder encoder(detail::HandlePassing::FdPassing);
  append_frame(stream, encoder, encoder.encode(message));
  return stream;
}

// The body of `message`: the last body_bytes bytes of its frame.
template <class Message>
Bytes body_of(const Message& message) {
  Bytes frame;
  detail::MessageEncoder encoder(detail::HandlePassing::FdPassing);
  append_frame(frame, encoder, encoder.encode(message));
  detail::FrameHeader header;
  std::memcpy(&header, frame.data(), sizeof header);
  return Bytes(frame.end() - static_cast<std::ptrdiff_t>(header.body_bytes), frame.end());
}

// Storages met in table order 128, 4096, 100, 1, 65536 bytes (kBodyStorageBytes).
FuzzMessage body_message() {
  Tensor s128 = Tensor::zeros({4, 8}, DType::Float32, Device::SharedCpu);
  Tensor s4096 = Tensor::zeros({16, 16, 8}, DType::Int16, Device::SharedCpu);
  Tensor s100 = Tensor::zeros({100}, DType::UInt8, Device::SharedCpu);
  Tensor s1 = Tensor::zeros({1}, DType::Bool, Device::SharedCpu);
  Tensor s65536 = Tensor::zeros({128, 64}, DType::Float64, Device::SharedCpu);
  FuzzMessage m;
  m.step = 3;
  m.tag = "body";
  m.tensor = s128.transpose(0, 1);
  m.tensors = {s4096.select(2, 7), s100.slice(0, 1, 100, 9), s1};
  m.named["big"] = {s65536.slice(1, 0, 64, 2), s128};
  m.either = s4096.view({256, 8});
  m.inner = {FuzzInner{"n", s1.view({1, 1}), {9}}};
  return m;
}

// A Value like a loader's batch, every kind in it, with tensors on storages met in the
// order of kBodyStorageBytes (128, 4096, 100, 1, 65536 bytes).
Value value_batch() {
  Tensor s128 = Tensor::zeros({32}, DType::Float32, Device::SharedCpu);
  Tensor s4096 = Tensor::zeros({4, 16, 16}, DType::Float32, Device::SharedCpu);
  Tensor s100 = Tensor::zeros({100}, DType::UInt8, Device::SharedCpu);
  Tensor s1 = Tensor::zeros({1}, DType::Bool, Device::SharedCpu);
  Tensor s65536 = Tensor::zeros({64, 128}, DType::Float64, Device::SharedCpu);
  ValueList names;
  for (int i = 0; i < 4; ++i) names.emplace_back("train/7/" + std::to_string(i) + ".jpg");
  ValueMap meta{{"none", nullptr}, {"yes", true}, {"no", false}, {"pi", 3.25}, {"neg", -(std::int64_t{1} << 40)}};
  meta.insert_or_assign("bytes", ferry::Bytes{std::string("\0\xff\x80 raw", 8)});
  meta.insert_or_assign("text", "r\xc3\xa9sum\xc3\xa9 \xe2\x9c\x93 \xf0\x9f\x98\x80");  // résumé ✓ 😀
  return ValueMap{{"step", 7},
                  {"mask", s128},
                  {"images", s4096.transpose(1, 2)},
                  {"small", ValueList{s100.slice(0, 1, 100, 9), s1, s65536.select(1, 3), s128.view({4, 8})}},
                  {"names", std::move(names)},
                  {"meta", std::move(meta)},
                  {"nested", ValueList{ValueList{}, ValueMap{}, ValueList{1, ValueMap{{"k", ValueList{2.5}}}}}}};
}

// kMaxValueDepth levels (the most the decoder accepts), lists and maps in turn.
Value value_at_depth_limit() {
  Value value = "leaf";
  for (std::size_t depth = 1; depth < kMaxValueDepth; ++depth) {
    value = depth % 2 ? Value(ValueList{std::move(value)}) : Value(ValueMap{{"d", std::move(value)}});
  }
  return value;
}

// Hand-made hostile bodies (the decoder refuses each): what a broken or malicious peer sends.
class RawBody {
 public:
  RawBody& kind(ValueKind kind) { return u8(static_cast<std::uint8_t>(kind)); }
  RawBody& u8(std::uint8_t value) { return raw(&value, 1); }
  RawBody& u64(std::uint64_t value) { return raw(&value, sizeof value); }
  RawBody& text(std::string_view text) { return u64(text.size()).raw(text.data(), text.size()); }
  RawBody& raw(const void* data, std::size_t size) {
    const auto* begin = static_cast<const std::byte*>(data);
    bytes.insert(bytes.end(), begin, begin + size);
    return *this;
  }
  Bytes bytes;
};

Bytes too_deep() {
  RawBody body;
  for (std::size_t i = 0; i < kMaxValueDepth; ++i) body.kind(ValueKind::List).u64(1);
  return body.kind(ValueKind::None).bytes;
}

void write_file(const std::filesystem::path& path, const Bytes& bytes) {
  std::filesystem::create_directories(path.parent_path());
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  if (!out) throw Error("cannot write " + path.string());
  std::printf("%s (%zu bytes)\n", path.c_str(), bytes.size());
}

// ---- the endpoint handshake ------------------------------------------------------------

Bytes hello_of(const detail::EndKind& kind, Transport transport) {
  return detail::encode_hello(detail::Hello{detail::kEndpointWireVersion, kind, transport, FrameLimits{}});
}

// A listener script (see ListenerOp in handshake_harness.hpp).
class Script {
 public:
  Script& connect(int times = 1) {
    for (int i = 0; i < times; ++i) op(ListenerOp::Connect);
    return *this;
  }
  Script& send(std::uint8_t client, const Bytes& bytes) {
    op(ListenerOp::Send);
    bytes_.push_back(static_cast<std::byte>(client));
    bytes_.push_back(static_cast<std::byte>(bytes.size()));
    bytes_.insert(bytes_.end(), bytes.begin(), bytes.end());
    return *this;
  }
  Script& close(std::uint8_t client) {
    op(ListenerOp::Close);
    bytes_.push_back(static_cast<std::byte>(client));
    return *this;
  }
  Script& pump() { return op(ListenerOp::Pump); }
  Script& accept(bool sender) {
    op(ListenerOp::Accept);
    bytes_.push_back(static_cast<std::byte>(sender ? 1 : 0));
    return *this;
  }
  Script& read() { return op(ListenerOp::Read); }
  const Bytes& bytes() const { return bytes_; }

 private:
  Script& op(ListenerOp what) {
    bytes_.push_back(static_cast<std::byte>(what));
    return *this;
  }
  Bytes bytes_;
};

void write_handshake_seeds(const std::filesystem::path& dir) {
  const Bytes receiver = hello_of(detail::client_receiver_kind<int>(), Transport::UnixSocket);
  const Bytes sender = hello_of(detail::client_sender_kind<double>(), Transport::UnixSocket);
  const Bytes duplex = hello_of(detail::client_duplex_kind<int, double>(), Transport::ShmRing);
  Bytes other_version = receiver;
  other_version[8] = std::byte{99};
  detail::Reply refused;
  refused.status = detail::ReplyStatus::TypeMismatch;
  refused.message = "it connects as Receiver<int>, and this listener serves Sender<double>";
  detail::Reply accepted;
  accepted.transport = Transport::ShmRing;
  accepted.writer_fds = 2;
  accepted.reader_fds = 2;
  write_file(dir / "handshake" / "hello_receiver", receiver);
  write_file(dir / "handshake" / "hello_duplex", duplex);
  write_file(dir / "handshake" / "hello_truncated", Bytes(receiver.begin(), receiver.begin() + 40));
  write_file(dir / "handshake" / "reply_accepted", detail::encode_reply(accepted));
  write_file(dir / "handshake" / "reply_refused", detail::encode_reply(refused));

  const Bytes garbage{std::byte{'G'}, std::byte{'E'}, std::byte{'T'}, std::byte{' '}, std::byte{'/'}};
  write_file(dir / "listener" / "accept_both_kinds",
             Script().connect(2).send(0, receiver).send(1, sender).pump().accept(false).accept(true).read().bytes());
  write_file(dir / "listener" / "refusals", Script()
                                                .connect(4)
                                                .send(0, garbage)
                                                .send(1, Bytes(receiver.begin(), receiver.begin() + 20))
                                                .close(1)
                                                .send(2, other_version)
                                                .send(3, duplex)
                                                .pump()
                                                .read()
                                                .bytes());
  write_file(dir / "listener" / "split_hello", Script()
                                                   .connect()
                                                   .send(0, Bytes(receiver.begin(), receiver.begin() + 10))
                                                   .pump()
                                                   .send(0, Bytes(receiver.begin() + 10, receiver.end()))
                                                   .pump()
                                                   .accept(false)
                                                   .read()
                                                   .bytes());
  write_file(dir / "listener" / "pending_cap",
             Script().connect(8).pump().read().send(7, receiver).pump().read().bytes());
  Script waiting;
  waiting.connect(4);
  for (std::uint8_t i = 0; i < 4; ++i) waiting.send(i, receiver);
  write_file(dir / "listener" / "waiting_cap",
             waiting.pump().read().close(0).pump().accept(false).accept(false).read().bytes());
}

// Codec scripts (see codec_harness.hpp): a connection's life, then each way a frame or an
// end can fail.
void write_script(const std::filesystem::path& path, const CodecScript& script) {
  const auto* begin = reinterpret_cast<const std::byte*>(script.bytes().data());
  write_file(path, Bytes(begin, begin + script.bytes().size()));
}

void write_codec_seeds(const std::filesystem::path& dir) {
  // Three storages (small, medium, one in a segment of its own), sent, sent again as
  // leases, one dropped on both sides (released, its slot given back and reused), the
  // large one dropped (its segment released).
  CodecScript life;
  life.allocate(0, 6, 1).allocate(1, 12, 2).allocate(2, 20, 3).send(0b111).send(0b011);
  life.drop_sent(0).drop_received(255).send(0b110).allocate(3, 6, 4).send(0b1010);
  life.drop_sent(2).drop_received(255).send(0);
  write_script(dir / "codec" / "life", life);
  const auto one_then = [] { return CodecScript().allocate(0, 8, 7).send(1).allocate(1, 16, 8); };
  write_script(dir / "codec" / "not_sent", one_then().send_not_sent(0b11).send(0b11));
  write_script(dir / "codec" / "cut", one_then().send_corrupted(0b11, 0, 3, 0, 0));
  write_script(dir / "codec" / "flipped", one_then().send_corrupted(0b11, 1, 0x40, 0, 60));
  write_script(dir / "codec" / "lost_fd", one_then().send_corrupted(0b11, 2, 0, 0, 0));
  write_script(dir / "codec" / "lying_release", one_then().send_corrupted(0b11, 3, 9, 0, 0));
  write_script(dir / "codec" / "receiver_lets_go", one_then().send(0b10).receiver_lets_go());
  write_script(dir / "codec" / "receiver_gone", one_then().send_not_sent(0b10).receiver_gone());
}

}  // namespace
}  // namespace ferry::fuzz

int main(int argc, char** argv) {
  using namespace ferry::fuzz;
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <corpus dir>\n", argv[0]);
    return 2;
  }
  const std::filesystem::path dir = argv[1];
  ferry::Tensor a = ferry::Tensor::zeros({1024}, ferry::DType::Float32, ferry::Device::SharedCpu);
  ferry::Tensor b = ferry::Tensor::zeros({64}, ferry::DType::Float32, ferry::Device::SharedCpu);
  ferry::Tensor c = ferry::Tensor::zeros({8192}, ferry::DType::Int64, ferry::Device::SharedCpu);
  write_file(dir / "frame" / "fd_stream", stream_of_frames(ferry::detail::HandlePassing::FdPassing));
  write_file(dir / "frame" / "proc_stream", stream_of_frames(ferry::detail::HandlePassing::ProcFd));
  write_file(dir / "frame" / "rich", single_frame(rich_message(a, b, c)));
  write_file(dir / "frame" / "plain", single_frame(plain_message()));
  write_file(dir / "body" / "tensors", body_of(body_message()));
  write_file(dir / "body" / "rich", body_of(rich_message(a, b, c)));
  write_file(dir / "body" / "plain", body_of(plain_message()));
  const Bytes batch = body_of(value_batch());
  write_file(dir / "value" / "batch", batch);
  write_file(dir / "value" / "depth_limit", body_of(value_at_depth_limit()));
  // Hostile seeds (each refused): the fuzzer starts next to every check of the decoder.
  using ferry::ValueKind;
  write_file(dir / "value" / "too_deep", too_deep());
  write_file(dir / "value" / "truncated",
             Bytes(batch.begin(), batch.begin() + static_cast<std::ptrdiff_t>(batch.size() / 2)));
  write_file(dir / "value" / "huge_list",
             RawBody().kind(ValueKind::List).u64(std::uint64_t{1} << 62).kind(ValueKind::None).bytes);
  write_file(dir / "value" / "huge_map",
             RawBody().kind(ValueKind::Map).u64(~std::uint64_t{0}).text("k").kind(ValueKind::None).bytes);
  write_file(dir / "value" / "huge_string",
             RawBody().kind(ValueKind::String).u64(std::uint64_t{1} << 40).raw("ab", 2).bytes);
  write_file(dir / "value" / "bad_utf8", RawBody().kind(ValueKind::String).text("ok \xed\xa0\x80 surrogate").bytes);
  write_file(dir / "value" / "bad_utf8_key",
             RawBody().kind(ValueKind::Map).u64(1).text("\xc0\xaf").kind(ValueKind::Int).u64(1).bytes);
  write_file(dir / "value" / "duplicate_key", RawBody()
                                                  .kind(ValueKind::Map)
                                                  .u64(2)
                                                  .text("k")
                                                  .kind(ValueKind::None)
                                                  .text("k")
                                                  .kind(ValueKind::Bool)
                                                  .u8(1)
                                                  .bytes);
  write_file(dir / "value" / "bad_bool", RawBody().kind(ValueKind::Bool).u8(2).bytes);
  write_file(dir / "value" / "bad_kind", RawBody().kind(ValueKind::List).u64(1).u8(9).bytes);
  write_handshake_seeds(dir);
  write_codec_seeds(dir);
  return 0;
}
