// Shape's members that need not be inline (none is on the path of copying, moving or
// receiving a tensor): kept out of the header so that every file that includes it does not
// compile them.
#include "ferry/shape.hpp"

#include <algorithm>

namespace ferry {

Shape::Shape(std::initializer_list<value_type> values) { assign(values.begin(), values.end()); }

Shape::operator std::vector<value_type>() const { return std::vector<value_type>(begin(), end()); }

Shape::reverse_iterator Shape::rbegin() noexcept { return reverse_iterator(end()); }
Shape::reverse_iterator Shape::rend() noexcept { return reverse_iterator(begin()); }
Shape::const_reverse_iterator Shape::rbegin() const noexcept { return const_reverse_iterator(end()); }
Shape::const_reverse_iterator Shape::rend() const noexcept { return const_reverse_iterator(begin()); }

void Shape::resize(size_type count, value_type value) {
  reserve(count);
  if (count > size_) std::fill(data() + size_, data() + count, value);
  size_ = static_cast<std::uint32_t>(count);
}

Shape::iterator Shape::insert(const_iterator position, value_type value) {
  const auto at = static_cast<size_type>(position - begin());
  if (size_ == capacity_) grow(size_type{capacity_} * 2);
  value_type* first = data();
  std::copy_backward(first + at, first + size_, first + size_ + 1);
  first[at] = value;
  ++size_;
  return first + at;
}

Shape::iterator Shape::erase(const_iterator first, const_iterator last) noexcept {
  value_type* base = data();
  const auto from = static_cast<size_type>(first - base);
  const auto to = static_cast<size_type>(last - base);
  std::copy(base + to, base + size_, base + from);
  size_ -= static_cast<std::uint32_t>(to - from);
  return base + from;
}

bool operator==(const Shape& a, const Shape& b) noexcept { return std::equal(a.begin(), a.end(), b.begin(), b.end()); }

std::strong_ordering operator<=>(const Shape& a, const Shape& b) noexcept {
  return std::lexicographical_compare_three_way(a.begin(), a.end(), b.begin(), b.end());
}

void Shape::grow(size_type count) {
  count = std::max<size_type>(count, kInlineDims + 1);
  auto* bigger = new value_type[count];
  std::copy(begin(), end(), bigger);
  free_heap();
  heap_ = bigger;
  capacity_ = static_cast<std::uint32_t>(count);
}

}  // namespace ferry
