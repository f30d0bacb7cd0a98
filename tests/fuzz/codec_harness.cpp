#include "codec_harness.hpp"

#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>

#include <cereal/types/vector.hpp>

#include "support/codec_loop.hpp"

namespace ferry::fuzz {
namespace {

using namespace ferry::detail;  // the codecs and their wire types

[[noreturn]] void codec_failure(const char* what) {
  std::fprintf(stderr, "codec fuzz harness: %s\n", what);
  std::abort();
}

struct CodecMessage {
  std::uint64_t tag = 0;
  std::vector<Tensor> tensors;
  template <class Archive>
  void serialize(Archive& ar) {
    ar(tag, tensors);
  }
};

// Reads the script: one byte at a time, zero past its end.
class Reader {
 public:
  explicit Reader(std::span<const std::uint8_t> input) : input_(input) {}
  bool done() const { return at_ >= input_.size(); }
  std::uint8_t next() { return at_ < input_.size() ? input_[at_++] : 0; }
  std::uint16_t mask() { return static_cast<std::uint16_t>(next() | next() << 8); }

 private:
  std::span<const std::uint8_t> input_;
  std::size_t at_ = 0;
};

// One run: the two ends, what the sender holds and what the receiver kept.
class CodecRun {
 public:
  explicit CodecRun(std::span<const std::uint8_t> input) : in_(input) {}
  std::size_t run();

 private:
  bool step();  // false: the script ends
  void allocate();
  CodecMessage message_of(std::uint16_t mask);
  void send(std::uint16_t mask);
  bool send_corrupted(std::uint16_t mask);
  void corrupt(test::WireFrame& frame);
  void check_delivered(const CodecMessage& sent, const CodecMessage& got) const;
  void finish();

  Reader in_;
  test::CodecLoop<CodecMessage> loop_;
  std::array<Tensor, kCodecStorages> held_by_sender_;
  std::vector<CodecMessage> held_by_receiver_;
  std::uint64_t tag_ = 0;
  std::size_t delivered_ = 0;
  bool corrupted_ = false;  // a corrupted frame was delivered
};

std::size_t CodecRun::run() {
  while (!in_.done() && step()) {
  }
  finish();
  return delivered_;
}

bool CodecRun::step() {
  switch (static_cast<CodecOp>(in_.next() % kCodecOps)) {
    case CodecOp::Allocate: allocate(); return true;
    case CodecOp::DropSent: held_by_sender_[in_.next() % kCodecStorages] = Tensor(); return true;
    case CodecOp::Send: send(in_.mask()); return true;
    case CodecOp::SendCorrupted: return send_corrupted(in_.mask());
    case CodecOp::DropReceived: {
      const std::size_t which = in_.next();
      if (which < held_by_receiver_.size()) {
        held_by_receiver_.erase(held_by_receiver_.begin() + static_cast<std::ptrdiff_t>(which));
      } else {
        held_by_receiver_.clear();
      }
      return true;
    }
    case CodecOp::SendNotSent:
      loop_.encoder.encode(message_of(in_.mask()));
      loop_.encoder.rollback();
      return true;
    case CodecOp::ReceiverLetsGo: loop_.decoder.release_all(); return false;
    case CodecOp::ReceiverGone: loop_.encoder.receiver_gone(); return false;
  }
  return false;
}

void CodecRun::allocate() {
  const std::size_t index = in_.next() % kCodecStorages;
  const auto bytes = std::int64_t{1} << (in_.next() % 21);
  const std::uint8_t fill = in_.next();
  Tensor tensor = Tensor::zeros({bytes}, DType::UInt8, Device::SharedCpu);
  std::memset(tensor.data_ptr(), fill, static_cast<std::size_t>(bytes));
  held_by_sender_[index] = std::move(tensor);
}

CodecMessage CodecRun::message_of(std::uint16_t mask) {
  CodecMessage message;
  message.tag = ++tag_;
  for (std::size_t i = 0; i < kCodecStorages; ++i) {
    if ((mask >> i & 1) != 0 && held_by_sender_[i].defined()) message.tensors.push_back(held_by_sender_[i]);
  }
  return message;
}

void CodecRun::send(std::uint16_t mask) {
  const CodecMessage sent = message_of(mask);
  CodecMessage got;
  try {
    got = loop_.deliver(loop_.send(sent));
  } catch (const ProtocolError&) {
    codec_failure("an intact frame was refused");
  }
  check_delivered(sent, got);
  ++delivered_;
  held_by_receiver_.push_back(std::move(got));
  if (loop_.encoder.tracked_storages() != loop_.decoder.leased()) {
    codec_failure("the ends disagree on the storages leased");
  }
  if (loop_.encoder.tracked_segments() != loop_.decoder.leased_segments()) {
    codec_failure("the ends disagree on the segments leased");
  }
}

void CodecRun::check_delivered(const CodecMessage& sent, const CodecMessage& got) const {
  if (got.tag != sent.tag || got.tensors.size() != sent.tensors.size()) codec_failure("a message arrived changed");
  for (std::size_t i = 0; i < sent.tensors.size(); ++i) {
    const Tensor& a = sent.tensors[i];
    const Tensor& b = got.tensors[i];
    if (a.nbytes() != b.nbytes() || std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()) != 0) {
      codec_failure("a tensor arrived with other bytes");
    }
  }
}

// The corrupted frame either is refused or decodes; either way the receiver ends here.
bool CodecRun::send_corrupted(std::uint16_t mask) {
  test::WireFrame frame = loop_.send(message_of(mask));
  corrupt(frame);
  corrupted_ = true;
  try {
    if (frame.bytes.size() >= sizeof(FrameHeader) &&
        frame.header().kind == static_cast<std::uint8_t>(FrameKind::Message)) {
      held_by_receiver_.push_back(loop_.deliver(std::move(frame)));
    }
  } catch (const ProtocolError&) {
  }
  loop_.encoder.receiver_gone();
  return false;
}

void CodecRun::corrupt(test::WireFrame& frame) {
  const std::uint8_t how = in_.next() % 4, a = in_.next(), b = in_.next(), c = in_.next();
  const std::size_t payload = frame.bytes.size() - sizeof(FrameHeader);
  if (how == 0) frame.bytes.resize(frame.bytes.size() - std::min<std::size_t>(payload, std::size_t{a} + 1));
  if (how == 1) frame.bytes[(std::size_t{b} << 8 | c) % frame.bytes.size()] ^= static_cast<std::byte>(a | 1);
  if (how == 2 && !frame.fds.empty()) frame.fds.pop_back();
  if (how == 3) frame.add_release(a);
  // A /proc entry made by the corruption would name the input's pid and fd: pid 0 is refused.
  const FrameHeader header = frame.header();
  for (std::uint32_t i = 0; i < header.segment_count; ++i) {
    if (frame.segments_at() + (i + 1) * sizeof(SegmentEntry) > frame.bytes.size()) break;
    SegmentEntry entry = frame.segment(i);
    if (entry.kind == static_cast<std::uint32_t>(SegmentKind::NewFd)) continue;
    entry.pid = 0;
    frame.set_segment(i, entry);
  }
}

void CodecRun::finish() {
  held_by_receiver_.clear();
  held_by_sender_ = {};
  loop_.decoder.release_all();
  loop_.encoder.receiver_gone();
  // Every block the receiver held gave its slot back, and every frame it never resolved
  // was abandoned: nothing stays pinned. (A corrupted frame resolved in part may name
  // slots other than those the sender pinned: those pins wait for the receiving process to
  // exit, as for any lying receiver, which never happens here.)
  loop_.encoder.encode(CodecMessage{});
  loop_.encoder.rollback();
  if (!corrupted_ && loop_.encoder.pinned_storages() != 0) {
    codec_failure("the sender still pins storages after both ends let go");
  }
}

}  // namespace

std::size_t run_codec(std::span<const std::uint8_t> input) {
  CodecRun run(input);
  return run.run();
}

}  // namespace ferry::fuzz
