#include "resolve/platform/platform.h"

#include "gtest/gtest.h"
#include "base/status.h"
#include "resolve/platform/local.h"

namespace kplan {
namespace {

// vllm.platforms.rocm.on_gfx9() / on_gfx1x(): arch names, not prefixes.
TEST(PlatformArchTest, Gfx9AndGfx1xAreVllmsLists) {
  for (const char* spec : {"rocm:gfx90a", "rocm:gfx942", "rocm:gfx950"}) {
    EXPECT_TRUE(ParsePlatformSpec(spec)->on_gfx9()) << spec;
  }
  for (const char* spec : {"rocm:gfx908", "rocm:gfx906", "rocm:gfx1100", "cuda:9.0"}) {
    EXPECT_FALSE(ParsePlatformSpec(spec)->on_gfx9()) << spec;
  }
  EXPECT_TRUE(ParsePlatformSpec("rocm:gfx1100")->on_gfx1x());
  EXPECT_TRUE(ParsePlatformSpec("rocm:gfx1201")->on_gfx1x());
  EXPECT_FALSE(ParsePlatformSpec("rocm:gfx1030")->on_gfx1x());
  EXPECT_FALSE(ParsePlatformSpec("rocm:gfx942")->on_gfx1x());
}

TEST(PlatformTest, CapabilityPredicatesFollowVllm) {
  Platform p = ParsePlatformSpec("cuda:10.3").value();
  EXPECT_TRUE(p.HasDeviceCapability(90));
  EXPECT_TRUE(p.HasDeviceCapability(103));
  EXPECT_FALSE(p.HasDeviceCapability(110));
  EXPECT_FALSE(p.IsDeviceCapability(100));
  EXPECT_TRUE(p.IsDeviceCapability(103));
  EXPECT_TRUE(p.IsDeviceCapabilityFamily(100));
  EXPECT_FALSE(p.IsDeviceCapabilityFamily(120));
}

TEST(PlatformTest, ParsesSpecs) {
  Platform h = ParsePlatformSpec("cuda:9.0+flashinfer").value();
  EXPECT_TRUE(h.is_cuda());
  EXPECT_EQ(h.capability->AsInt(), 90);
  EXPECT_TRUE(h.HasLibrary("flashinfer"));
  EXPECT_FALSE(h.HasLibrary("deep_gemm"));

  Platform defaults = ParsePlatformSpec("cuda:12.0").value();
  EXPECT_TRUE(defaults.HasLibrary("deep_gemm"));

  Platform r = ParsePlatformSpec("rocm:gfx950").value();
  EXPECT_TRUE(r.is_rocm());
  EXPECT_EQ(r.gcn_arch_name, "gfx950");
  EXPECT_EQ(r.capability->AsInt(), 95);

  Platform none = ParsePlatformSpec("cpu+").value();
  EXPECT_TRUE(none.is_cpu());
  EXPECT_TRUE(none.libraries.empty());
}

TEST(PlatformTest, RejectsBadSpecsNamingTheField) {
  absl::StatusOr<Platform> bad = ParsePlatformSpec("gpu:9.0");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(FieldOf(bad.status()).value(), "platform");
  EXPECT_FALSE(ParsePlatformSpec("cuda:nine").ok());
}

TEST(LocalPlatformTest, CpuWithoutDevicesCudaWithThem) {
  EXPECT_TRUE(LocalPlatform({}, true).is_cpu());
  // The CPU reference is kplan's emulation: the server's CPU platform lists it.
  EXPECT_TRUE(LocalPlatform({}, false).HasLibrary("kplan"));
  LocalDevice d{0, "NVIDIA H200", {9, 0}, 141LL << 30, 132};
  Platform p = LocalPlatform({d}, true);
  EXPECT_TRUE(p.is_cuda());
  EXPECT_EQ(p.device_name, "NVIDIA H200");
  EXPECT_TRUE(p.HasLibrary("kplan"));
  EXPECT_FALSE(LocalPlatform({d}, false).HasLibrary("kplan"));
}

TEST(LocalPlatformTest, SelectsDevices) {
  std::vector<LocalDevice> all = {{0, "a", {9, 0}, 1, 1}, {1, "b", {9, 0}, 1, 1}};
  EXPECT_EQ(SelectDevices(all, "all")->size(), 2u);
  EXPECT_EQ(SelectDevices(all, "none")->size(), 0u);
  EXPECT_EQ(SelectDevices(all, "1")->front().name, "b");
  EXPECT_FALSE(SelectDevices(all, "2").ok());
  EXPECT_FALSE(SelectDevices(all, "0,0").ok());
  EXPECT_EQ(FieldOf(SelectDevices(all, "x").status()).value(), "devices");
}

}  // namespace
}  // namespace kplan
