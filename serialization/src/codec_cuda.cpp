// Where the encoder and decoder hand a CUDA storage to the connection's CUDA strategy
// (cuda_records.hpp), in every build: without CUDA there is none, and these refuse it. Apart
// from the codecs' own sources, so that their hot paths are compiled without these callers.
#include "ferry/detail/cuda_records.hpp"
#include "ferry/detail/message_decoder.hpp"
#include "ferry/detail/message_encoder.hpp"

namespace ferry {

// ---- sending ---------------------------------------------------------------------------

std::uint32_t detail::MessageEncoder::add_cuda_storage(const std::shared_ptr<Storage>& storage) {
  if (!connection_.cuda) {
    connection_.cuda = detail::CudaRecordWriter::make(pool_);
    if (!connection_.cuda) {
      throw Error("cannot send a " + storage->device().to_string() +
                  " tensor: this build of ferry has no CUDA support");
    }
  }
  // The board travels as an ordinary shared storage (a block of a leased segment), ahead of
  // the storages that use it.
  const std::shared_ptr<Storage> board = connection_.cuda->hold(storage);
  connection_.cuda->board_added(add_storage(board));
  return append_storage(storage, storage.get());
}

detail::HandleEntry detail::MessageEncoder::cuda_entry(const std::shared_ptr<Storage>& storage) {
  connection_.cuda->write_record(*storage);
  detail::HandleEntry entry;
  entry.kind = static_cast<std::uint32_t>(detail::HandleKind::CudaIpc);
  entry.nbytes = storage->nbytes();
  if (const auto slot = connection_.leased_ids.find(storage->id())) {
    entry.slot = *slot;
  } else {
    // A slot like any storage's, but never pinned and never given back on the return board:
    // the hold-counter board's counter is the hold (see MessageEncoder::commit).
    entry.slot = lease_storage(storage, false);
  }
  return entry;
}

// ---- receiving -------------------------------------------------------------------------

std::shared_ptr<Storage> detail::MessageDecoder::resolve_cuda(const HandleEntry& entry, std::uint32_t index,
                                                              std::size_t record) {
  if (!connection_.cuda) {
    connection_.cuda = detail::CudaRecordReader::make();
    if (!connection_.cuda) {
      throw ProtocolError("the sender shares a CUDA tensor (CUDA handle " + std::to_string(index) +
                          ") but this build of ferry has no CUDA support; build the receiver with the CUDA toolkit "
                          "(FERRY_WITH_CUDA) or send CPU tensors");
    }
  }
  // A CUDA lease has no core (owning the Storage would hold the producer's memory, see Lease).
  Lease* leased = connection_.leases.find(entry.slot);
  Lease fresh;
  Lease& lease = leased != nullptr ? *leased : fresh;
  std::shared_ptr<Storage> storage = connection_.cuda->resolve(entry, index, record, body_, storages_,
                                                               {leased != nullptr, lease.allocation, lease.handle});
  if (leased == nullptr) connection_.leases.place(entry.slot, std::move(fresh));
  return storage;
}

}  // namespace ferry
