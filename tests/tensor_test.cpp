#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "ferry/detail/view_bounds.hpp"
#include "ferry/tensor.hpp"
#include "support/leak_check.hpp"

namespace ferry {
namespace {

using test::LeakCheckedTest;

std::vector<float> iota(std::size_t n) {
  std::vector<float> values(n);
  std::iota(values.begin(), values.end(), 0.0f);
  return values;
}

class TensorTest : public LeakCheckedTest {};

TEST_F(TensorTest, EmptyHasShapeStridesAndSizes) {
  Tensor t = Tensor::empty({2, 3, 4}, DType::Float32);
  EXPECT_TRUE(t.defined());
  EXPECT_EQ(t.dim(), 3);
  EXPECT_EQ(t.shape(), (Shape{2, 3, 4}));
  EXPECT_EQ(t.strides(), (Shape{12, 4, 1}));
  EXPECT_EQ(t.numel(), 24);
  EXPECT_EQ(t.nbytes(), 96u);
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_FALSE(t.is_shared());
  EXPECT_EQ(t.device(), Device::Cpu);
}

TEST_F(TensorTest, ZerosOnEveryDeviceAndDType) {
  for (Device device : {Device::Cpu, Device::SharedCpu}) {
    for (int raw = 0; raw < kDTypeCount; ++raw) {
      const auto dtype = static_cast<DType>(raw);
      Tensor t = Tensor::zeros({5, 7}, dtype, device);
      EXPECT_EQ(t.nbytes(), 35 * dtype_size(dtype));
      const auto* bytes = static_cast<const unsigned char*>(t.data_ptr());
      for (std::size_t i = 0; i < t.nbytes(); ++i) ASSERT_EQ(bytes[i], 0) << dtype_name(dtype);
      EXPECT_EQ(t.is_shared(), device == Device::SharedCpu);
    }
  }
}

TEST_F(TensorTest, FromCopiesValuesAndChecksCount) {
  Tensor t = Tensor::from(iota(6), {2, 3});
  EXPECT_EQ(t.at<float>({1, 2}), 5.0f);
  try {
    (void)Tensor::from(iota(5), {2, 3});
    ADD_FAILURE() << "5 values for a shape of 6 elements were accepted";
  } catch (const Error& error) {
    EXPECT_STREQ(error.what(), "Tensor::from: 5 values do not fill shape of 6 elements");
  }
  Tensor one_d = Tensor::from({std::int64_t{4}, std::int64_t{5}});
  EXPECT_EQ(one_d.dtype(), DType::Int64);
  EXPECT_EQ(one_d.to_vector<std::int64_t>(), (std::vector<std::int64_t>{4, 5}));
}

TEST_F(TensorTest, TypedAccessChecksDTypeAndBounds) {
  Tensor t = Tensor::zeros({2, 2}, DType::Int32);
  EXPECT_THROW(t.data<float>(), Error);
  EXPECT_THROW(Tensor().data<float>(), Error);
  EXPECT_THROW(t.at<std::int32_t>({2, 0}), Error);
  EXPECT_THROW(t.at<std::int32_t>({0}), Error);
  t.at<std::int32_t>({1, 1}) = 7;
  EXPECT_EQ(t.data<std::int32_t>()[3], 7);
}

TEST_F(TensorTest, SliceSharesStorageWithOffsetAndStep) {
  Tensor t = Tensor::from(iota(20), {4, 5});
  Tensor rows = t.slice(0, 1, 3);
  EXPECT_EQ(rows.shape(), (Shape{2, 5}));
  EXPECT_EQ(rows.storage_offset(), 5);
  EXPECT_TRUE(rows.shares_storage_with(t));
  Tensor cols = t.slice(1, 0, 5, 2);
  EXPECT_EQ(cols.shape(), (Shape{4, 3}));
  EXPECT_EQ(cols.strides(), (Shape{5, 2}));
  EXPECT_FALSE(cols.is_contiguous());
  EXPECT_EQ(cols.at<float>({3, 2}), 19.0f);
  cols.at<float>({0, 1}) = -1.0f;
  EXPECT_EQ(t.at<float>({0, 2}), -1.0f);
  EXPECT_EQ(t.slice(1, -2, 100).shape(), (Shape{4, 2}));
  EXPECT_EQ(t.slice(0, 3, 1).numel(), 0);
  EXPECT_THROW(t.slice(0, 0, 1, 0), Error);
  EXPECT_THROW(t.slice(2, 0, 1), Error);
}

TEST_F(TensorTest, SelectRemovesDimension) {
  Tensor t = Tensor::from(iota(24), {2, 3, 4});
  Tensor s = t.select(1, 2);
  EXPECT_EQ(s.shape(), (Shape{2, 4}));
  EXPECT_EQ(s.at<float>({1, 3}), 23.0f);
  EXPECT_EQ(t.select(-1, -1).at<float>({0, 0}), 3.0f);
  EXPECT_THROW(t.select(0, 2), Error);
}

TEST_F(TensorTest, UnbindGivesEveryIndexOfADimensionAsAViewOfTheSameStorage) {
  Tensor t = Tensor::from(iota(24), {2, 3, 4});
  const std::vector<Tensor> rows = t.unbind();
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[1].shape(), (Shape{3, 4}));
  EXPECT_EQ(rows[1].at<float>({0, 0}), 12.0f);
  const std::vector<Tensor> columns = t.unbind(-1);
  ASSERT_EQ(columns.size(), 4u);
  EXPECT_EQ(columns[3].shape(), (Shape{2, 3}));
  EXPECT_EQ(columns[3].strides(), (Shape{12, 4}));
  EXPECT_EQ(columns[3].at<float>({1, 2}), 23.0f);
  for (const Tensor& column : columns) EXPECT_TRUE(column.shares_storage_with(t));
  columns[2].data<float>()[0] = -1.0f;  // element (0, 0, 2) of t
  EXPECT_EQ(t.at<float>({0, 0, 2}), -1.0f);
  EXPECT_TRUE(Tensor::empty({0, 5}, DType::Float32).unbind().empty());
  EXPECT_THROW(t.unbind(3), Error);
}

TEST_F(TensorTest, ViewAndReshape) {
  Tensor t = Tensor::from(iota(12), {3, 4});
  Tensor v = t.view({2, -1});
  EXPECT_EQ(v.shape(), (Shape{2, 6}));
  EXPECT_TRUE(v.shares_storage_with(t));
  EXPECT_THROW(t.view({5, -1}), Error);
  EXPECT_THROW(t.view({-1, -1}), Error);
  Tensor transposed = t.transpose(0, 1);
  EXPECT_THROW(transposed.view({12}), Error);
  Tensor reshaped = transposed.reshape({12});
  EXPECT_FALSE(reshaped.shares_storage_with(t));
  EXPECT_EQ(reshaped.at<float>({1}), 4.0f);
}

TEST_F(TensorTest, TransposeContiguousClone) {
  Tensor t = Tensor::from(iota(6), {2, 3});
  Tensor tr = t.transpose(0, 1);
  EXPECT_EQ(tr.shape(), (Shape{3, 2}));
  EXPECT_EQ(tr.strides(), (Shape{1, 3}));
  EXPECT_EQ(tr.at<float>({2, 1}), 5.0f);
  Tensor dense = tr.contiguous();
  EXPECT_TRUE(dense.is_contiguous());
  EXPECT_EQ(dense.to_vector<float>(), (std::vector<float>{0, 3, 1, 4, 2, 5}));
  EXPECT_TRUE(t.contiguous().shares_storage_with(t));
  Tensor copy = t.clone();
  EXPECT_FALSE(copy.shares_storage_with(t));
  copy.at<float>({0, 0}) = 9.0f;
  EXPECT_EQ(t.at<float>({0, 0}), 0.0f);
  Tensor shared_copy = t.clone(Device::SharedCpu);
  EXPECT_TRUE(shared_copy.is_shared());
  EXPECT_EQ(shared_copy.to_vector<float>(), t.to_vector<float>());
}

TEST_F(TensorTest, ShareMemoryMovesStorageInPlaceForEveryView) {
  Tensor t = Tensor::from(iota(8), {8});
  Tensor view = t.slice(0, 2, 6);
  const void* before = t.data_ptr();
  t.share_memory();
  EXPECT_TRUE(t.is_shared());
  EXPECT_TRUE(view.is_shared());
  EXPECT_NE(t.data_ptr(), before);
  EXPECT_EQ(view.to_vector<float>(), (std::vector<float>{2, 3, 4, 5}));
  view.at<float>({0}) = 42.0f;
  EXPECT_EQ(t.at<float>({2}), 42.0f);
  const void* after = t.data_ptr();
  t.share_memory();  // already shared: no-op
  EXPECT_EQ(t.data_ptr(), after);
}

TEST_F(TensorTest, FillAndCopyFrom) {
  Tensor t = Tensor::empty({3, 4}, DType::Float64);
  t.fill(2.5);
  for (double v : t.to_vector<double>()) EXPECT_EQ(v, 2.5);
  Tensor column = t.select(1, 0);
  column.fill(-1.0);
  EXPECT_EQ(t.at<double>({2, 0}), -1.0);
  EXPECT_EQ(t.at<double>({2, 1}), 2.5);
  Tensor other = Tensor::zeros({3}, DType::Float64);
  other.copy_from(column);
  EXPECT_EQ(other.to_vector<double>(), (std::vector<double>{-1, -1, -1}));
  EXPECT_THROW(other.copy_from(t), Error);
}

// Tensor::fill converts its value to the tensor's dtype as torch's fill_() does (the
// expectations below are torch 2's results): integers and floating values go to any dtype,
// a floating value is truncated toward zero into an integer dtype, a negative integer wraps
// into uint8, and a value out of the dtype's range is an Error, not a wrapped or infinite
// element (infinities and NaN stay themselves in a floating dtype).
template <class T>
T first_after_fill(DType dtype, auto value) {
  Tensor t = Tensor::zeros({2, 3}, dtype);
  t.fill(value);
  const T* all = t.data<T>();
  for (std::int64_t i = 1; i < t.numel(); ++i) EXPECT_EQ(std::memcmp(&all[i], &all[0], sizeof(T)), 0);
  return all[0];
}

void expect_overflow(DType dtype, auto value) {
  Tensor t = Tensor::zeros({2}, dtype);
  try {
    t.fill(value);
    ADD_FAILURE() << "fill(" << +value << ") of a " << dtype_name(dtype) << " tensor was accepted";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("without overflow"), std::string::npos) << error.what();
    EXPECT_NE(std::string(error.what()).find(dtype_name(dtype)), std::string::npos) << error.what();
  }
  const auto* bytes = static_cast<const std::uint8_t*>(t.data_ptr());
  EXPECT_EQ(std::count(bytes, bytes + t.nbytes(), 0), static_cast<std::ptrdiff_t>(t.nbytes()))
      << "a refused fill wrote";
}

TEST_F(TensorTest, FillConvertsItsValueToTheTensorsDTypeAsTorchDoes) {
  constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
  constexpr double kInf = std::numeric_limits<double>::infinity();
  constexpr std::int64_t kInt64Max = std::numeric_limits<std::int64_t>::max();
  EXPECT_EQ(first_after_fill<float>(DType::Float32, 1), 1.0f);
  EXPECT_EQ(first_after_fill<float>(DType::Float32, true), 1.0f);
  EXPECT_EQ(first_after_fill<float>(DType::Float32, Half(1.5f)), 1.5f);
  EXPECT_EQ(first_after_fill<float>(DType::Float32, kInt64Max), 9.223372036854775807e18f);
  EXPECT_TRUE(std::isnan(first_after_fill<float>(DType::Float32, kNaN)));
  expect_overflow(DType::Float32, 1e39);
  expect_overflow(DType::Float32, 3.5e38);
  EXPECT_EQ(first_after_fill<double>(DType::Float64, kInt64Max), 9.223372036854775807e18);
  EXPECT_EQ(first_after_fill<double>(DType::Float64, 1.0f), 1.0);

  EXPECT_EQ(float(first_after_fill<Half>(DType::Float16, 1)), 1.0f);
  EXPECT_EQ(float(first_after_fill<Half>(DType::Float16, 65504)), 65504.0f);
  EXPECT_EQ(float(first_after_fill<Half>(DType::Float16, true)), 1.0f);
  EXPECT_EQ(float(first_after_fill<Half>(DType::Float16, 1e-8)), 0.0f);
  EXPECT_EQ(float(first_after_fill<Half>(DType::Float16, kInf)), std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(float(first_after_fill<Half>(DType::Float16, kNaN))));
  expect_overflow(DType::Float16, 65520);
  expect_overflow(DType::Float16, 1e6);
  expect_overflow(DType::Float16, std::int64_t{1} << 60);
  EXPECT_EQ(float(first_after_fill<BFloat16>(DType::BFloat16, 1)), 1.0f);
  EXPECT_EQ(float(first_after_fill<BFloat16>(DType::BFloat16, kInt64Max)), 9.223372036854775807e18f);
  EXPECT_EQ(float(first_after_fill<BFloat16>(DType::BFloat16, -kInf)), -std::numeric_limits<float>::infinity());
  expect_overflow(DType::BFloat16, 3.4e38);
  expect_overflow(DType::BFloat16, -1e39);

  EXPECT_EQ(first_after_fill<std::int32_t>(DType::Int32, 1.9), 1);
  EXPECT_EQ(first_after_fill<std::int32_t>(DType::Int32, -1.9f), -1);
  EXPECT_EQ(first_after_fill<std::int32_t>(DType::Int32, 2147483647), 2147483647);
  expect_overflow(DType::Int32, std::int64_t{1} << 31);
  expect_overflow(DType::Int32, kNaN);
  expect_overflow(DType::Int32, kInf);
  EXPECT_EQ(first_after_fill<std::int64_t>(DType::Int64, kInt64Max), kInt64Max);
  EXPECT_EQ(first_after_fill<std::int64_t>(DType::Int64, (std::int64_t{1} << 53) + 1), (std::int64_t{1} << 53) + 1);
  expect_overflow(DType::Int64, 9.3e18);
  expect_overflow(DType::Int64, 9223372036854775808.0);  // 2^63
  expect_overflow(DType::Int64, std::uint64_t{1} << 63);
  EXPECT_EQ(first_after_fill<std::int16_t>(DType::Int16, -32768), -32768);
  expect_overflow(DType::Int16, 32768);
  EXPECT_EQ(first_after_fill<std::int8_t>(DType::Int8, -128), -128);
  EXPECT_EQ(first_after_fill<std::int8_t>(DType::Int8, -1.5), -1);
  expect_overflow(DType::Int8, 128);
  expect_overflow(DType::Int8, -129);
  EXPECT_EQ(first_after_fill<std::uint8_t>(DType::UInt8, -1), 255);
  EXPECT_EQ(first_after_fill<std::uint8_t>(DType::UInt8, -255), 1);
  EXPECT_EQ(first_after_fill<std::uint8_t>(DType::UInt8, 1.7), 1);
  EXPECT_EQ(first_after_fill<std::uint8_t>(DType::UInt8, 255u), 255);
  expect_overflow(DType::UInt8, 300);
  expect_overflow(DType::UInt8, -256);
  expect_overflow(DType::UInt8, -1.5);
  expect_overflow(DType::UInt8, 255.9);
  expect_overflow(DType::UInt8, kNaN);

  EXPECT_TRUE(first_after_fill<bool>(DType::Bool, 2));
  EXPECT_TRUE(first_after_fill<bool>(DType::Bool, -1));
  EXPECT_TRUE(first_after_fill<bool>(DType::Bool, 0.5));
  EXPECT_TRUE(first_after_fill<bool>(DType::Bool, kNaN));
  EXPECT_FALSE(first_after_fill<bool>(DType::Bool, 0.0));
  EXPECT_FALSE(first_after_fill<bool>(DType::Bool, 0));
  // A strided view is filled through its strides only.
  Tensor t = Tensor::zeros({3, 4}, DType::Float32);
  t.select(1, 2).fill(7);
  EXPECT_EQ(t.at<float>({1, 2}), 7.0f);
  EXPECT_EQ(t.at<float>({1, 1}), 0.0f);
}

TEST_F(TensorTest, EmptyTensorsNeedNoMemory) {
  Tensor shared = Tensor::empty({0, 3}, DType::Float32, Device::SharedCpu);
  EXPECT_EQ(shared.numel(), 0);
  EXPECT_EQ(shared.data_ptr(), nullptr);
  EXPECT_EQ(shared.storage()->nbytes(), 0u);
  Tensor undefined;
  EXPECT_FALSE(undefined.defined());
  EXPECT_EQ(undefined.to_string(), "Tensor(undefined)");
}

TEST_F(TensorTest, InvalidShapesAreRejected) {
  EXPECT_THROW(Tensor::empty({-1}, DType::Float32), Error);
  EXPECT_THROW(Tensor::empty({std::int64_t{1} << 62, 8}, DType::Float32), Error);
  EXPECT_THROW(Tensor::empty(Shape(kMaxDims + 1, 1), DType::Float32), Error);
  auto storage = Storage::allocate(16, Device::Cpu);
  EXPECT_THROW(Tensor::from_storage(storage, DType::Float32, {5}, {1}, 0), Error);
  EXPECT_THROW(Tensor::from_storage(storage, DType::Float32, {2}, {4}, 0), Error);
  EXPECT_THROW(Tensor::from_storage(storage, DType::Float32, {1}, {1}, 4), Error);
  EXPECT_THROW(Tensor::from_storage(storage, DType::Float32, {2}, {-1}, 1), Error);
  EXPECT_EQ(Tensor::from_storage(storage, DType::Float32, {2}, {3}, 0).numel(), 2);
}

// Found by the body fuzz target: a shape with a zero extent has no elements whatever its
// other extents are, but its row-major strides used to overflow int64 (undefined behaviour).
TEST_F(TensorTest, ZeroElementShapeWhoseStridesOverflowIsRejected) {
  const std::int64_t huge = std::int64_t{1} << 40;
  EXPECT_THROW(Tensor::empty({0, huge, huge}, DType::Float32), Error);
  EXPECT_THROW(Tensor::empty({0, 3}, DType::Float32).view({0, huge, huge}), Error);
  // Large extents after the zero are fine as long as the strides fit.
  Tensor wide = Tensor::empty({4, 0, huge}, DType::Float32);
  EXPECT_EQ(wide.numel(), 0);
  EXPECT_EQ(wide.strides(), (Shape{huge, huge, 1}));
}

// Found by the body fuzz target: the stride of a dimension of size 1 is never applied, so a
// valid view may carry any stride there (a received one does), and copying such a view
// multiplied it by the element size: signed overflow, undefined behaviour.
TEST_F(TensorTest, SizeOneDimensionsWithHugeStridesAreCopiedSafely) {
  auto storage = Storage::allocate(16, Device::Cpu);
  std::memcpy(storage->data(), std::vector<float>{1, 2, 3, 4}.data(), 16);
  const std::int64_t huge = std::int64_t{1} << 62;
  Tensor inner = Tensor::from_storage(storage, DType::Float32, {2, 1}, {2, huge}, 0);
  EXPECT_FALSE(inner.is_contiguous());
  EXPECT_EQ(inner.contiguous().to_vector<float>(), (std::vector<float>{1, 3}));
  Tensor outer = Tensor::from_storage(storage, DType::Float32, {1, 2}, {huge, 2}, 1);
  EXPECT_EQ(outer.contiguous().to_vector<float>(), (std::vector<float>{2, 4}));
  // A slice that keeps one element never multiplies the stride by its step.
  Tensor one = Tensor::from_storage(storage, DType::Float32, {4}, {1}, 0).slice(0, 1, 4, huge);
  EXPECT_EQ(one.to_vector<float>(), (std::vector<float>{2}));
  EXPECT_EQ(Tensor::from_storage(storage, DType::Float32, {1}, {huge}, 3).slice(0, 0, 1, 8).to_vector<float>(),
            (std::vector<float>{4}));
}

TEST_F(TensorTest, HalfElements) {
  Tensor t = Tensor::from(std::vector<Half>{Half(1.5f), Half(-2.0f)}, {2});
  EXPECT_EQ(t.dtype(), DType::Float16);
  EXPECT_EQ(static_cast<float>(t.at<Half>({1})), -2.0f);
}

// The receiver's one-pass check (view_in_bounds) and the check that explains a refusal
// (view_bounds_problem) agree on every layout, including zero-element views whose reach
// overflows, negative entries and extents at the edge of the storage.
TEST(ViewBoundsTest, TheFastCheckAndTheExplainingCheckAgree) {
  std::mt19937_64 random(7);
  const std::int64_t edges[] = {
      0, 1, 2, 3, 7, 64, -1, std::int64_t{1} << 40, std::int64_t{1} << 62, std::numeric_limits<std::int64_t>::max()};
  const auto pick = [&] {
    return random() % 2 == 0 ? edges[random() % std::size(edges)] : static_cast<std::int64_t>(random() % 9);
  };
  int valid = 0;
  for (int round = 0; round < 20000; ++round) {
    const std::size_t ndim = random() % 4;
    Shape shape(ndim), strides(ndim);
    for (std::size_t d = 0; d < ndim; ++d) {
      shape[d] = pick();
      strides[d] = pick();
    }
    const std::int64_t offset = pick();
    const std::size_t bytes = static_cast<std::size_t>(random() % 512);
    const DType dtype = random() % 2 == 0 ? DType::Float32 : DType::UInt8;
    const bool fast = detail::view_in_bounds(bytes, dtype, shape, strides, offset);
    const auto problem = detail::view_bounds_problem(bytes, dtype, shape, strides, offset);
    std::string layout;
    for (std::size_t d = 0; d < ndim; ++d) layout += std::to_string(shape[d]) + "/" + std::to_string(strides[d]) + " ";
    ASSERT_EQ(fast, !problem.has_value())
        << "sizes/strides " << layout << "offset " << offset << " bytes " << bytes << ": " << problem.value_or("valid");
    valid += fast;
  }
  EXPECT_GT(valid, 1000);  // both outcomes were exercised
  EXPECT_LT(valid, 19000);
}

}  // namespace
}  // namespace ferry
