#include "c10d/core/tensor.h"

#include <dlpack/dlpack.h>
#include <gtest/gtest.h>

#include <numeric>

#include "c10d/core/exception.h"

namespace c10d::core {
namespace {

TEST(Tensor, EmptyIsContiguousAndAligned) {
  Tensor t = Tensor::empty({3, 4}, DType::kFloat64);
  EXPECT_EQ(t.numel(), 12);
  EXPECT_EQ(t.nbytes(), 96u);
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data()) % 64, 0u);
  EXPECT_EQ(t.strides(), (std::vector<int64_t>{4, 1}));
  EXPECT_EQ(t.str(), "float64[3, 4]");
  Tensor zero = Tensor::empty({0, 5}, DType::kInt8);
  EXPECT_EQ(zero.numel(), 0);
  EXPECT_TRUE(zero.is_contiguous());
}

TEST(Tensor, StridedViewsAndDenseCheck) {
  std::vector<float> data(12);
  std::iota(data.begin(), data.end(), 0.f);
  // A transposed 3x4 -> 4x3 view.
  Tensor t(data.data(), DType::kFloat32, {4, 3}, {1, 4});
  EXPECT_FALSE(t.is_contiguous());
  try {
    check_dense_cpu(t, "all_reduce: tensor");
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("contiguous"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("all_reduce"), std::string::npos);
  }
  Tensor copy = t.contiguous_copy();
  EXPECT_TRUE(copy.is_contiguous());
  const float* c = copy.data_as<float>();
  EXPECT_EQ(c[0], 0.f);
  EXPECT_EQ(c[1], 4.f);
  EXPECT_EQ(c[3], 1.f);
  // Size-1 dimensions may carry any stride.
  Tensor column(data.data(), DType::kFloat32, {12, 1}, {1, 99});
  EXPECT_TRUE(column.is_contiguous());
}

TEST(Tensor, CopyElementsBetweenAnyStrides) {
  std::vector<int32_t> src(24), dst(48, -1);
  std::iota(src.begin(), src.end(), 0);
  // src seen as 2x3x4 in C order; dst holds the same indices at strides (1, 4, 12), with gaps.
  Tensor from(src.data(), DType::kInt32, {2, 3, 4});
  Tensor to(dst.data(), DType::kInt32, {2, 3, 4}, {1, 4, 12});
  EXPECT_FALSE(to.elements_overlap());
  copy_elements(to, from);
  for (int i = 0; i < 2; ++i) {
    for (int j = 0; j < 3; ++j) {
      for (int k = 0; k < 4; ++k) EXPECT_EQ(dst[i + 4 * j + 12 * k], 12 * i + 4 * j + k);
    }
  }
  // Back into C order through contiguous_copy, and through a reversed view.
  Tensor back = to.contiguous_copy();
  EXPECT_TRUE(std::equal(src.begin(), src.end(), back.data_as<int32_t>()));
  Tensor reversed(src.data() + 23, DType::kInt32, {24}, {-1});
  Tensor r = reversed.contiguous_copy();
  EXPECT_EQ(r.data_as<int32_t>()[0], 23);
  EXPECT_EQ(r.data_as<int32_t>()[23], 0);
  EXPECT_THROW(copy_elements(r, from), InvalidArgument);  // other sizes
}

TEST(Tensor, OverlappingElements) {
  std::vector<float> data(16);
  EXPECT_FALSE(Tensor(data.data(), DType::kFloat32, {4, 4}).elements_overlap());
  EXPECT_FALSE(Tensor(data.data(), DType::kFloat32, {4, 4}, {1, 4}).elements_overlap());
  EXPECT_FALSE(Tensor(data.data(), DType::kFloat32, {4, 2}, {4, 2}).elements_overlap());
  EXPECT_TRUE(Tensor(data.data(), DType::kFloat32, {4}, {0}).elements_overlap());
  EXPECT_TRUE(Tensor(data.data(), DType::kFloat32, {3, 4}, {2, 1}).elements_overlap());
  EXPECT_FALSE(Tensor(data.data(), DType::kFloat32, {1, 4}, {0, 1}).elements_overlap());
}

TEST(Tensor, SlicesReshapeAndComplexViews) {
  Tensor t = Tensor::empty({10}, DType::kInt32);
  for (int i = 0; i < 10; ++i) t.data_as<int32_t>()[i] = i;
  Tensor s = t.flat_slice(3, 4);
  EXPECT_EQ(s.data_as<int32_t>()[0], 3);
  EXPECT_EQ(s.numel(), 4);
  EXPECT_THROW(t.flat_slice(8, 4), InvalidArgument);
  EXPECT_EQ(t.reshape({2, 5}).sizes(), (std::vector<int64_t>{2, 5}));
  EXPECT_THROW(t.reshape({3, 3}), InvalidArgument);
  Tensor c = Tensor::empty({3}, DType::kComplex64);
  Tensor r = c.view_as_real();
  EXPECT_EQ(r.dtype(), DType::kFloat32);
  EXPECT_EQ(r.sizes(), (std::vector<int64_t>{3, 2}));
  EXPECT_TRUE(r.is_contiguous());
  EXPECT_EQ(r.data(), c.data());
}

TEST(Tensor, DLPackRoundTripSharesMemoryAndReleasesOnce) {
  Tensor t = Tensor::empty({2, 3}, DType::kBFloat16);
  DLManagedTensor* managed = t.to_dlpack();
  EXPECT_EQ(managed->dl_tensor.data, t.data());
  EXPECT_EQ(managed->dl_tensor.dtype.code, kDLBfloat);
  {
    Tensor back = Tensor::from_dlpack(managed);  // takes ownership of `managed`
    EXPECT_EQ(back.data(), t.data());
    EXPECT_EQ(back.dtype(), DType::kBFloat16);
    EXPECT_EQ(back.sizes(), t.sizes());
    EXPECT_EQ(t.owner().use_count(), 2);  // t and the export context's copy
  }
  EXPECT_EQ(t.owner().use_count(), 1);
}

TEST(Tensor, SameDtypeAndSizesChecks) {
  std::vector<Tensor> ok = {Tensor::empty({2}, DType::kFloat32),
                            Tensor::empty({2}, DType::kFloat32)};
  check_same_dtype(ok, "x");
  check_same_sizes(ok, "x");
  std::vector<Tensor> bad_dtype = {ok[0], Tensor::empty({2}, DType::kInt32)};
  EXPECT_THROW(check_same_dtype(bad_dtype, "x"), InvalidArgument);
  std::vector<Tensor> bad_size = {ok[0], Tensor::empty({3}, DType::kFloat32)};
  EXPECT_THROW(check_same_sizes(bad_size, "x"), InvalidArgument);
}

}  // namespace
}  // namespace c10d::core
