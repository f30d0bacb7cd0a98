// DLPack interchange in C++: exported tensors view ferry's memory and keep it alive until
// the consumer's deleter runs; foreign tensors are wrapped without a copy and released when
// the last ferry view dies; what DLPack 0.6 cannot say (bool) is refused clearly.
#include <gtest/gtest.h>

#include <vector>

#include "ferry/dlpack.hpp"
#include "ferry/storage.hpp"

namespace ferry {
namespace {

TEST(DlpackTest, ExportViewsTheSameMemoryWithDataAtElementZero) {
  Tensor base = Tensor::from<float>({0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}).view({3, 4});
  const Tensor view = base.slice(1, 1, 4, 2).transpose(0, 1);  // offset 1, strides {2, 4}
  DLManagedTensor* managed = to_dlpack(view);
  const DLTensor& dl = managed->dl_tensor;
  EXPECT_EQ(dl.data, view.data_ptr()) << "data must point at element 0: torch 1.13 ignores byte_offset";
  EXPECT_EQ(dl.byte_offset, 0u);
  EXPECT_EQ(dl.device.device_type, kDLCPU);
  EXPECT_EQ(dl.ndim, 2);
  EXPECT_EQ(dl.dtype.code, kDLFloat);
  EXPECT_EQ(dl.dtype.bits, 32);
  EXPECT_EQ(dl.dtype.lanes, 1);
  EXPECT_EQ((std::vector<std::int64_t>(dl.shape, dl.shape + 2)), (std::vector<std::int64_t>{2, 3}));
  EXPECT_EQ((std::vector<std::int64_t>(dl.strides, dl.strides + 2)), (std::vector<std::int64_t>{2, 4}));
  static_cast<float*>(dl.data)[0] = 42.f;  // a write through the export is seen by ferry
  EXPECT_EQ(base.at<float>({0, 1}), 42.f);
  managed->deleter(managed);
}

TEST(DlpackTest, TheExportKeepsTheStorageAliveUntilItsDeleterRuns) {
  std::weak_ptr<Storage> watched;
  DLManagedTensor* managed = nullptr;
  {
    Tensor tensor = Tensor::zeros({1000}, DType::Int32, Device::SharedCpu);
    watched = tensor.storage();
    managed = to_dlpack(tensor);
  }
  EXPECT_FALSE(watched.expired()) << "the exported storage died while the consumer holds it";
  managed->deleter(managed);
  EXPECT_TRUE(watched.expired());
}

TEST(DlpackTest, BoolAndUndefinedTensorsAreRefusedClearly) {
  try {
    (void)to_dlpack(Tensor::zeros({2}, DType::Bool));
    FAIL() << "bool must be refused";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("DLPack 0.6 has no bool type"), std::string::npos) << error.what();
  }
  EXPECT_THROW((void)to_dlpack(Tensor()), Error);
}

TEST(DlpackTest, EveryOtherDtypeRoundTrips) {
  for (int raw = 1; raw < kDTypeCount; ++raw) {
    const auto dtype = static_cast<DType>(raw);
    const Tensor tensor = Tensor::zeros({3, 2}, dtype);
    const Tensor back = from_dlpack(to_dlpack(tensor.transpose(0, 1)));
    EXPECT_EQ(back.dtype(), dtype) << dtype_name(dtype);
    EXPECT_EQ(back.shape(), (Shape{2, 3}));
    EXPECT_EQ(back.strides(), (Shape{1, 2}));
    EXPECT_EQ(back.data_ptr(), tensor.data_ptr()) << "no copy for " << dtype_name(dtype);
  }
}

// A foreign tensor whose deleter counts its calls.
struct Foreign {
  std::vector<double> data = std::vector<double>(12, 0.0);
  std::vector<std::int64_t> shape;
  std::vector<std::int64_t> strides;
  DLManagedTensor managed{};
  int* deleted = nullptr;
};

DLManagedTensor* make_foreign(int* deleted, std::vector<std::int64_t> shape, std::vector<std::int64_t> strides,
                              std::uint64_t byte_offset) {
  auto* foreign = new Foreign;
  for (std::size_t i = 0; i < foreign->data.size(); ++i) foreign->data[i] = static_cast<double>(i);
  foreign->shape = std::move(shape);
  foreign->strides = std::move(strides);
  foreign->deleted = deleted;
  DLTensor& dl = foreign->managed.dl_tensor;
  dl.data = foreign->data.data();
  dl.byte_offset = byte_offset;
  dl.device = {kDLCPU, 0};
  dl.ndim = static_cast<int>(foreign->shape.size());
  dl.dtype = {kDLFloat, 64, 1};
  dl.shape = foreign->shape.data();
  dl.strides = foreign->strides.empty() ? nullptr : foreign->strides.data();
  foreign->managed.manager_ctx = foreign;
  foreign->managed.deleter = [](DLManagedTensor* self) {
    auto* owner = static_cast<Foreign*>(self->manager_ctx);
    ++*owner->deleted;
    delete owner;
  };
  return &foreign->managed;
}

TEST(DlpackTest, AForeignTensorIsWrappedWithoutACopyAndReleasedWithItsLastView) {
  int deleted = 0;
  DLManagedTensor* managed = make_foreign(&deleted, {2, 3}, {}, 2 * sizeof(double));  // elements 2..7
  const void* element0 = static_cast<std::byte*>(managed->dl_tensor.data) + 2 * sizeof(double);
  {
    Tensor tensor = from_dlpack(managed);
    EXPECT_EQ(tensor.data_ptr(), element0) << "byte_offset is honoured, and nothing is copied";
    EXPECT_EQ(tensor.to_vector<double>(), (std::vector<double>{2, 3, 4, 5, 6, 7}));
    Tensor row = tensor.select(0, 1);
    tensor = Tensor();
    EXPECT_EQ(deleted, 0) << "a view still holds the foreign memory";
    EXPECT_EQ(row.to_vector<double>(), (std::vector<double>{5, 6, 7}));
  }
  EXPECT_EQ(deleted, 1);
}

TEST(DlpackTest, ForeignStridesAreHonouredAndWhatFerryCannotViewIsRefused) {
  int deleted = 0;
  {
    const Tensor columns = from_dlpack(make_foreign(&deleted, {3, 2}, {1, 3}, 0));
    EXPECT_EQ(columns.to_vector<double>(), (std::vector<double>{0, 3, 1, 4, 2, 5}));
  }
  EXPECT_EQ(deleted, 1);
  EXPECT_THROW((void)from_dlpack(make_foreign(&deleted, {3}, {-1}, 2 * sizeof(double))), Error);
  EXPECT_EQ(deleted, 2) << "a refused tensor is released at once";
  DLManagedTensor* gpu = make_foreign(&deleted, {3}, {}, 0);
  gpu->dl_tensor.device = {kDLCUDA, 0};
  EXPECT_THROW((void)from_dlpack(gpu), Error);
  DLManagedTensor* complex = make_foreign(&deleted, {3}, {}, 0);
  complex->dl_tensor.dtype = {kDLComplex, 64, 1};
  EXPECT_THROW((void)from_dlpack(complex), Error);
  EXPECT_EQ(deleted, 4);
}

}  // namespace
}  // namespace ferry
