// Shape: the sizes (or strides) of a tensor, a vector of int64 that keeps the entries of
// common tensors inside the object.
#pragma once

#include <compare>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <iterator>
#include <vector>

namespace ferry {

/// Sizes (or strides) of a tensor, one entry per dimension. A vector of std::int64_t with
/// std::vector's interface (the common part of it), that holds up to kInlineDims entries
/// without a heap allocation: creating, copying and receiving a tensor of up to that many
/// dimensions allocates nothing for its shape. Converts to and from std::vector<std::int64_t>.
class Shape {
 public:
  using value_type = std::int64_t;
  using size_type = std::size_t;
  using difference_type = std::ptrdiff_t;
  using reference = value_type&;
  using const_reference = const value_type&;
  using pointer = value_type*;
  using const_pointer = const value_type*;
  using iterator = value_type*;
  using const_iterator = const value_type*;
  using reverse_iterator = std::reverse_iterator<iterator>;
  using const_reverse_iterator = std::reverse_iterator<const_iterator>;

  /// Entries held inside the object; more go to the heap.
  static constexpr std::uint32_t kInlineDims = 6;

  Shape() noexcept = default;
  /// `count` entries equal to `value`.
  explicit Shape(size_type count, value_type value = 0) { assign(count, value); }
  Shape(std::initializer_list<value_type> values);
  template <std::input_iterator It>
  Shape(It first, It last) {
    assign(first, last);
  }
  /// The entries of `values` (implicit, so that a std::vector works where a Shape is asked).
  Shape(const std::vector<value_type>& values) { assign(values.begin(), values.end()); }  // NOLINT
  Shape(const Shape& other) {
    if (other.on_heap()) {
      assign(other.begin(), other.end());
    } else {
      copy_inline(other);
    }
  }
  Shape(Shape&& other) noexcept { take(other); }
  Shape& operator=(const Shape& other) {
    if (this == &other) return *this;
    if (other.on_heap() || on_heap()) {
      assign(other.begin(), other.end());
    } else {
      copy_inline(other);
    }
    return *this;
  }
  Shape& operator=(Shape&& other) noexcept {
    if (this != &other) {
      free_heap();
      take(other);
    }
    return *this;
  }
  Shape& operator=(std::initializer_list<value_type> values) {
    assign(values.begin(), values.end());
    return *this;
  }
  ~Shape() { free_heap(); }

  /// The entries as a std::vector.
  operator std::vector<value_type>() const;  // NOLINT

  size_type size() const noexcept { return size_; }
  bool empty() const noexcept { return size_ == 0; }
  size_type capacity() const noexcept { return capacity_; }
  value_type* data() noexcept { return on_heap() ? heap_ : inline_; }
  const value_type* data() const noexcept { return on_heap() ? heap_ : inline_; }

  iterator begin() noexcept { return data(); }
  iterator end() noexcept { return data() + size_; }
  const_iterator begin() const noexcept { return data(); }
  const_iterator end() const noexcept { return data() + size_; }
  const_iterator cbegin() const noexcept { return begin(); }
  const_iterator cend() const noexcept { return end(); }
  reverse_iterator rbegin() noexcept;
  reverse_iterator rend() noexcept;
  const_reverse_iterator rbegin() const noexcept;
  const_reverse_iterator rend() const noexcept;

  reference operator[](size_type i) noexcept { return data()[i]; }
  const_reference operator[](size_type i) const noexcept { return data()[i]; }
  reference front() noexcept { return data()[0]; }
  const_reference front() const noexcept { return data()[0]; }
  reference back() noexcept { return data()[size_ - 1]; }
  const_reference back() const noexcept { return data()[size_ - 1]; }

  void reserve(size_type count) {
    if (count > capacity_) grow(count);
  }
  void clear() noexcept { size_ = 0; }
  void resize(size_type count, value_type value = 0);
  /// Sets the size to `count` without setting new entries: for a caller that writes them
  /// at once (reading them before is undefined behaviour).
  void resize_for_overwrite(size_type count) {
    reserve(count);
    size_ = static_cast<std::uint32_t>(count);
  }
  void assign(size_type count, value_type value) {
    size_ = 0;
    resize(count, value);
  }
  template <std::input_iterator It>
  void assign(It first, It last) {
    if constexpr (std::forward_iterator<It>) {
      const auto count = static_cast<size_type>(std::distance(first, last));
      reserve(count);
      for (value_type* out = data(); first != last; ++first) *out++ = *first;
      size_ = static_cast<std::uint32_t>(count);
    } else {
      clear();
      for (; first != last; ++first) push_back(*first);
    }
  }
  void push_back(value_type value) {
    if (size_ == capacity_) grow(size_type{capacity_} * 2);
    data()[size_++] = value;
  }
  void pop_back() noexcept { --size_; }
  /// Inserts `value` before `position`; returns an iterator to it.
  iterator insert(const_iterator position, value_type value);
  /// Removes the entry at `position`; returns an iterator to the entry that followed it.
  iterator erase(const_iterator position) noexcept { return erase(position, position + 1); }
  iterator erase(const_iterator first, const_iterator last) noexcept;
  void swap(Shape& other) noexcept {
    Shape held(std::move(other));
    other = std::move(*this);
    *this = std::move(held);
  }

  friend bool operator==(const Shape& a, const Shape& b) noexcept;
  friend std::strong_ordering operator<=>(const Shape& a, const Shape& b) noexcept;

 private:
  bool on_heap() const noexcept { return capacity_ > kInlineDims; }
  void grow(size_type count);
  void free_heap() noexcept {
    if (on_heap()) delete[] heap_;
    capacity_ = kInlineDims;
  }
  // Takes the entries of `other` (whose heap block, if any, moves here) and empties it.
  // This object holds no heap block.
  void take(Shape& other) noexcept {
    if (other.on_heap()) {
      heap_ = other.heap_;
      capacity_ = other.capacity_;
      other.capacity_ = kInlineDims;
      size_ = other.size_;
    } else {
      copy_inline(other);
    }
    other.size_ = 0;
  }
  // Copies the whole inline array of `other` (this object holds no heap block): a copy of
  // a fixed size compiles to a few moves, one of a variable size to a call or `rep movs`.
  void copy_inline(const Shape& other) noexcept {
    std::memcpy(inline_, other.inline_, sizeof inline_);
    size_ = other.size_;
  }

  std::uint32_t size_ = 0;
  std::uint32_t capacity_ = kInlineDims;
  union {
    value_type inline_[kInlineDims]{};  // zeroed: copies move the whole array
    value_type* heap_;
  };
};

inline void swap(Shape& a, Shape& b) noexcept { a.swap(b); }

}  // namespace ferry
