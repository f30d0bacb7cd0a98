// Shape: a vector of int64 that keeps up to kInlineDims entries inside the object.
#include <gtest/gtest.h>

#include <numeric>
#include <utility>
#include <vector>

#include "ferry/tensor.hpp"

namespace ferry {
namespace {

constexpr std::size_t kInline = Shape::kInlineDims;

Shape counting(std::size_t n) {
  Shape shape(n);
  std::iota(shape.begin(), shape.end(), std::int64_t{1});
  return shape;
}

std::vector<std::int64_t> counting_vector(std::size_t n) {
  std::vector<std::int64_t> values(n);
  std::iota(values.begin(), values.end(), std::int64_t{1});
  return values;
}

TEST(ShapeTest, ConstructsLikeAVector) {
  EXPECT_TRUE(Shape().empty());
  EXPECT_EQ(Shape(3, 7), (Shape{7, 7, 7}));
  EXPECT_EQ(Shape(2), (Shape{0, 0}));
  const std::vector<std::int64_t> values{4, 5, 6};
  const Shape from_vector = values;
  EXPECT_EQ(from_vector, (Shape{4, 5, 6}));
  EXPECT_EQ(Shape(values.begin(), values.end()), from_vector);
  const std::vector<std::int64_t> back = from_vector;
  EXPECT_EQ(back, values);
  EXPECT_EQ(from_vector.front(), 4);
  EXPECT_EQ(from_vector.back(), 6);
  EXPECT_NE(from_vector, (Shape{4, 5}));
  EXPECT_LT((Shape{1, 2}), (Shape{1, 3}));
}

TEST(ShapeTest, KeepsSmallShapesInsideAndLargerOnesOnTheHeap) {
  for (const std::size_t n : {std::size_t{0}, std::size_t{1}, kInline, kInline + 1, std::size_t{40}}) {
    SCOPED_TRACE(n);
    const Shape shape = counting(n);
    EXPECT_EQ(shape.size(), n);
    EXPECT_EQ(shape.capacity() > kInline, n > kInline);
    EXPECT_EQ(std::vector<std::int64_t>(shape), counting_vector(n));
    // The entries live inside the object exactly when they fit.
    const auto* inside = reinterpret_cast<const std::byte*>(&shape);
    const auto* entries = reinterpret_cast<const std::byte*>(shape.data());
    EXPECT_EQ(entries >= inside && entries < inside + sizeof shape, n <= kInline);
  }
}

TEST(ShapeTest, CopiesAndMovesBetweenInlineAndHeapShapes) {
  for (const std::size_t from : {std::size_t{2}, kInline, kInline + 3}) {
    for (const std::size_t to : {std::size_t{0}, std::size_t{3}, kInline + 5}) {
      SCOPED_TRACE(std::to_string(from) + " -> " + std::to_string(to));
      const Shape source = counting(from);
      Shape copy = counting(to);
      copy = source;
      EXPECT_EQ(copy, source);
      Shape moved = counting(to);
      Shape temporary = source;
      moved = std::move(temporary);
      EXPECT_EQ(moved, source);
      EXPECT_TRUE(temporary.empty());  // NOLINT(bugprone-use-after-move): a moved-from Shape is empty
      temporary.push_back(9);          // and usable
      EXPECT_EQ(temporary, (Shape{9}));
      Shape constructed(std::move(copy));
      EXPECT_EQ(constructed, source);
      copy = constructed;  // self-contained again after the move
      const Shape& alias = copy;
      copy = alias;  // self-assignment
      EXPECT_EQ(copy, source);
      swap(copy, moved = counting(to));
      EXPECT_EQ(copy, counting(to));
      EXPECT_EQ(moved, source);
    }
  }
}

TEST(ShapeTest, GrowsAndShrinksAcrossTheInlineLimit) {
  Shape shape;
  for (std::int64_t i = 1; i <= 20; ++i) shape.push_back(i);
  EXPECT_EQ(std::vector<std::int64_t>(shape), counting_vector(20));
  shape.erase(shape.begin() + 2, shape.begin() + 18);  // {1, 2, 19, 20}
  EXPECT_EQ(shape, (Shape{1, 2, 19, 20}));
  shape.insert(shape.begin() + 1, 7);
  EXPECT_EQ(shape, (Shape{1, 7, 2, 19, 20}));
  shape.erase(shape.begin());
  EXPECT_EQ(shape, (Shape{7, 2, 19, 20}));
  Shape small{1, 2, 3, 4, 5, 6};
  small.insert(small.begin(), 0);  // spills to the heap
  EXPECT_EQ(small, (Shape{0, 1, 2, 3, 4, 5, 6}));
  small.resize(9, 8);
  EXPECT_EQ(small, (Shape{0, 1, 2, 3, 4, 5, 6, 8, 8}));
  small.resize(2);
  small.pop_back();
  EXPECT_EQ(small, (Shape{0}));
  small.clear();
  EXPECT_TRUE(small.empty());
}

TEST(ShapeTest, TensorsOfManyDimensionsKeepTheirShape) {
  Shape sizes(kInline + 2, 1);
  sizes[0] = 3;
  const Tensor tensor = Tensor::zeros(sizes, DType::Int32);
  EXPECT_EQ(tensor.shape(), sizes);
  EXPECT_EQ(tensor.strides(), Shape(kInline + 2, 1));
  const Tensor copy = tensor;  // NOLINT(performance-unnecessary-copy-initialization): the copy is tested
  EXPECT_EQ(copy.shape(), sizes);
  EXPECT_EQ(copy.select(0, 2).shape(), Shape(kInline + 1, 1));
}

}  // namespace
}  // namespace ferry
