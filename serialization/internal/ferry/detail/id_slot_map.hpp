// IdSlotMap: which slot an encoder gave a storage, by the storage's id.
#pragma once

#include <bit>
#include <cstdint>
#include <optional>
#include <vector>

namespace ferry::detail {

/// A map from non-zero 64-bit ids to 32-bit slots in one flat table (open addressing,
/// linear probing, deletion by backward shift): finding, adding and removing an entry
/// touch one or two cache lines and never allocate once the table has grown, where a
/// std::unordered_map allocates a node per entry. Not thread-safe.
class IdSlotMap {
 public:
  /// The slot of `id`, if present.
  std::optional<std::uint32_t> find(std::uint64_t id) const noexcept {
    if (size_ == 0) return std::nullopt;
    for (std::size_t at = home(id);; at = next(at)) {
      if (table_[at].id == id) return table_[at].slot;
      if (table_[at].id == 0) return std::nullopt;
    }
  }
  /// Adds `id` (not present yet) with `slot`.
  void insert(std::uint64_t id, std::uint32_t slot) {
    if (2 * (size_ + 1) > table_.size()) grow();
    place(id, slot);
    ++size_;
  }
  /// Removes `id`; returns false when it was not present.
  bool erase(std::uint64_t id) noexcept {
    if (size_ == 0) return false;
    std::size_t hole = home(id);
    while (table_[hole].id != id) {
      if (table_[hole].id == 0) return false;
      hole = next(hole);
    }
    // Shift back every following entry of the run that may sit at the hole, so that lookups
    // never need tombstones.
    for (std::size_t at = next(hole); table_[at].id != 0; at = next(at)) {
      const std::size_t wanted = home(table_[at].id);
      const bool reaches_hole = hole <= at ? (wanted <= hole || wanted > at) : (wanted <= hole && wanted > at);
      if (reaches_hole) {
        table_[hole] = table_[at];
        hole = at;
      }
    }
    table_[hole] = Entry{};
    --size_;
    return true;
  }
  std::size_t size() const noexcept { return size_; }
  void clear() noexcept {
    table_.assign(table_.size(), Entry{});
    size_ = 0;
  }

 private:
  struct Entry {
    std::uint64_t id = 0;  // 0: empty
    std::uint32_t slot = 0;
  };
  std::size_t home(std::uint64_t id) const noexcept {
    // Fibonacci hashing: consecutive ids (the usual case) spread over the table.
    return static_cast<std::size_t>((id * 0x9e3779b97f4a7c15ull) >> shift_);
  }
  std::size_t next(std::size_t at) const noexcept { return (at + 1) & (table_.size() - 1); }
  void place(std::uint64_t id, std::uint32_t slot) noexcept {
    std::size_t at = home(id);
    while (table_[at].id != 0) at = next(at);
    table_[at] = Entry{id, slot};
  }
  void grow() {
    const std::size_t capacity = table_.empty() ? 64 : 2 * table_.size();
    std::vector<Entry> old(capacity);
    old.swap(table_);
    shift_ = 64 - std::countr_zero(capacity);
    for (const Entry& entry : old) {
      if (entry.id != 0) place(entry.id, entry.slot);
    }
  }

  std::vector<Entry> table_;
  std::size_t size_ = 0;
  int shift_ = 64;
};

}  // namespace ferry::detail
