#include "c10d/core/dtype.h"

#include <gtest/gtest.h>

#include "c10d/core/env.h"
#include "c10d/core/exception.h"

namespace c10d::core {
namespace {

TEST(DType, NamesSizesAndRoundTrips) {
  for (int i = 0; i < kNumDTypes; ++i) {
    auto d = static_cast<DType>(i);
    EXPECT_EQ(dtype_from_name(dtype_name(d)), d) << dtype_name(d);
    EXPECT_EQ(from_dlpack_type(to_dlpack_type(d)), d) << dtype_name(d);
    EXPECT_EQ(to_dlpack_type(d).bits, element_size(d) * 8) << dtype_name(d);
    if (d != DType::kBFloat16) {
      EXPECT_EQ(from_buffer_format(buffer_format(d), element_size(d)), d) << dtype_name(d);
    }
  }
  EXPECT_EQ(element_size(DType::kComplex128), 16u);
  EXPECT_EQ(dtype_from_name("torch.float"), DType::kFloat32);
  EXPECT_EQ(dtype_from_name("half"), DType::kFloat16);
  EXPECT_FALSE(dtype_from_name("float8").has_value());
  EXPECT_EQ(from_buffer_format("<l", 8), DType::kInt64);
  EXPECT_EQ(from_buffer_format("l", 4), DType::kInt32);
  EXPECT_FALSE(from_buffer_format(">f", 4).has_value());  // big-endian is not supported
}

TEST(DType, Classification) {
  EXPECT_TRUE(is_floating(DType::kBFloat16));
  EXPECT_FALSE(is_floating(DType::kComplex64));
  EXPECT_TRUE(is_complex(DType::kComplex64));
  EXPECT_TRUE(is_integral(DType::kUInt8, false));
  EXPECT_FALSE(is_integral(DType::kBool, false));
  EXPECT_TRUE(is_integral(DType::kBool, true));
  EXPECT_EQ(complex_to_real(DType::kComplex128), DType::kFloat64);
  EXPECT_THROW(complex_to_real(DType::kFloat32), InvalidArgument);
}

TEST(Env, RegistryAndDebugLevel) {
  bool found = false;
  for (const auto& var : env_registry()) {
    EXPECT_NE(std::string(var.doc), "");
    found |= std::string(var.name) == "TORCH_DISTRIBUTED_DEBUG";
  }
  EXPECT_TRUE(found);
  ::setenv("TORCH_DISTRIBUTED_DEBUG", "detail", 1);
  set_debug_level_from_env();
  EXPECT_EQ(debug_level(), DebugLevel::kDetail);
  ::setenv("TORCH_DISTRIBUTED_DEBUG", "loud", 1);
  EXPECT_THROW(set_debug_level_from_env(), InvalidArgument);
  ::unsetenv("TORCH_DISTRIBUTED_DEBUG");
  set_debug_level_from_env();
  EXPECT_EQ(debug_level(), DebugLevel::kOff);
  set_debug_level(DebugLevel::kInfo);
  EXPECT_EQ(debug_level(), DebugLevel::kInfo);
  set_debug_level(DebugLevel::kOff);

  ::setenv("C10D_STORE_MAX_KEY_BYTES", "12x", 1);
  EXPECT_THROW(env_int(kEnvStoreMaxKeyBytes), InvalidArgument);
  ::unsetenv("C10D_STORE_MAX_KEY_BYTES");
  EXPECT_EQ(env_int(kEnvStoreMaxKeyBytes), 8192);
}

TEST(Check, MessagesCarryOperands) {
  try {
    C10D_CHECK_ARG_EQ(3, 4, "sizes differ");
    FAIL();
  } catch (const InvalidArgument& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("sizes differ"), std::string::npos);
    EXPECT_NE(msg.find("3 vs 4"), std::string::npos) << msg;
  }
}

}  // namespace
}  // namespace c10d::core
