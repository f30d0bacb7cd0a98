// A frame writer that always passes segment fds: wraps the writer of a transport that can
// pass fds beside its frames (a pipe's or a ring's side socket, can_pass_fds) and
// reports passes_fds, so the encoder hands every new segment over as an fd and never
// names it by pid and fd number. Endpoints connect unrelated processes, which may not be
// allowed to take each other's fds through /proc or pidfd_getfd.
#pragma once

#include <memory>
#include <utility>

#include "ferry/detail/transport.hpp"
#include "ferry/error.hpp"

namespace ferry::detail {

class FdPassingWriter final : public FrameWriter {
 public:
  explicit FdPassingWriter(std::unique_ptr<FrameWriter> inner)
      : FrameWriter(passing_fds(inner->capabilities())), inner_(std::move(inner)) {}
  void charge_waits_to(EndStats* stats) noexcept override { inner_->charge_waits_to(stats); }
  BodySpace* body_space(const Deadline& deadline) override { return inner_->body_space(deadline); }
  bool write(std::span<const iovec> parts, std::span<const int> fds, const Deadline& deadline) override {
    return inner_->write(parts, fds, deadline);
  }
  std::uint64_t acknowledged() override { return inner_->acknowledged(); }
  bool wait_acknowledged(std::uint64_t sequence, const Deadline& deadline) override {
    return inner_->wait_acknowledged(sequence, deadline);
  }
  bool flush(const Deadline& deadline) override { return inner_->flush(deadline); }
  void close() noexcept override { inner_->close(); }
  void shut_down() noexcept override { inner_->shut_down(); }
  std::vector<int> descriptors() const override { return inner_->descriptors(); }
  UniqueFd liveness_probe() const override { return inner_->liveness_probe(); }

 private:
  static TransportCapabilities passing_fds(TransportCapabilities capabilities) noexcept {
    capabilities.passes_fds = true;
    capabilities.can_pass_fds = true;
    return capabilities;
  }

  std::unique_ptr<FrameWriter> inner_;
};

/// `writer`, passing every segment fd (FdPassingWriter) when it can pass fds but does not
/// by default; unchanged otherwise. Throws Error when it cannot pass fds at all.
inline std::unique_ptr<FrameWriter> always_passing_fds(std::unique_ptr<FrameWriter> writer) {
  if (writer->capabilities().passes_fds) return writer;
  if (!writer->capabilities().can_pass_fds) {
    throw Error("this transport cannot pass descriptors, which a connection between unrelated processes needs");
  }
  return std::make_unique<FdPassingWriter>(std::move(writer));
}

}  // namespace ferry::detail
