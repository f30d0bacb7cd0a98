#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "ferry/dtype.hpp"

namespace ferry {
namespace {

TEST(DType, SizesAndNames) {
  EXPECT_EQ(dtype_size(DType::Bool), 1u);
  EXPECT_EQ(dtype_size(DType::UInt8), 1u);
  EXPECT_EQ(dtype_size(DType::Int8), 1u);
  EXPECT_EQ(dtype_size(DType::Int16), 2u);
  EXPECT_EQ(dtype_size(DType::Int32), 4u);
  EXPECT_EQ(dtype_size(DType::Int64), 8u);
  EXPECT_EQ(dtype_size(DType::Float16), 2u);
  EXPECT_EQ(dtype_size(DType::BFloat16), 2u);
  EXPECT_EQ(dtype_size(DType::Float32), 4u);
  EXPECT_EQ(dtype_size(DType::Float64), 8u);
  EXPECT_EQ(dtype_name(DType::BFloat16), "bfloat16");
  EXPECT_FALSE(is_valid_dtype(kDTypeCount));
  EXPECT_TRUE(is_valid_dtype(kDTypeCount - 1));
}

TEST(DType, HalfRoundTripsExactValues) {
  for (float value : {0.0f, -0.0f, 1.0f, -2.5f, 65504.0f, 0.000061035156f, 5.9604645e-08f, 1025.0f}) {
    EXPECT_EQ(static_cast<float>(Half(value)), value) << value;
  }
}

TEST(DType, HalfRoundsAndSaturates) {
  EXPECT_EQ(static_cast<float>(Half(1.0009765625f + 0.0001f)), 1.0009765625f);
  EXPECT_TRUE(std::isinf(static_cast<float>(Half(1e6f))));
  EXPECT_TRUE(std::isnan(static_cast<float>(Half(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_EQ(static_cast<float>(Half(1e-9f)), 0.0f);
}

TEST(DType, BFloat16RoundTrip) {
  for (float value : {0.0f, 1.0f, -3.0f, 256.0f, 0.15625f}) {
    EXPECT_EQ(static_cast<float>(BFloat16(value)), value) << value;
  }
  EXPECT_NEAR(static_cast<float>(BFloat16(3.14159f)), 3.14159f, 0.02f);
  EXPECT_TRUE(std::isnan(static_cast<float>(BFloat16(std::numeric_limits<float>::quiet_NaN()))));
}

}  // namespace
}  // namespace ferry
