// Config hashes against the vectors of reference §4.3 (computed with CPython's
// json + hashlib) and against CPython for the seed KernelConfig's fields.
#include "gtest/gtest.h"
#include "base/pyjson.h"
#include "resolve/plan/kernel_config.h"
#include "resolve/plan/vocabulary.h"

namespace kplan {
namespace {

constexpr char kIrJulyEmpty[] = "91d23ffb134e4ac31772127984b4e8590fd78c1b0e05aedc32f22d5a59db9ecf";
constexpr char kIr3Empty[] = "761b8949de3522fc93f33bfff361404644903d3d3017d88a61a66408d3b8679b";

PyJson EmptyIrFactors(const std::vector<std::string>& ops) {
  PyJson::Object f;
  PyJson::Object impls;
  for (const auto& op : ops) {
    f[op] = PyJson::Array{};
    impls[op] = PyJson::Object{};
  }
  f["_impls"] = PyJson(impls);
  return PyJson(f);
}

TEST(ConfigHashTest, IrVectorJulyFields) {
  EXPECT_EQ(HashFactors(EmptyIrFactors({"rms_norm", "fused_add_rms_norm"})), kIrJulyEmpty);
}

TEST(ConfigHashTest, IrVectorThreeFieldsFromTheRealConfig) {
  EXPECT_EQ(ComputeHash(IrOpPriorityConfig{}), kIr3Empty);
}

TEST(ConfigHashTest, KernelConfigJulyVectors) {
  PyJson::Object f{{"enable_bf16x3_router_gemm", false},
                   {"ir_op_priority", kIrJulyEmpty},
                   {"linear_backend", "auto"},
                   {"moe_backend", "auto"}};
  EXPECT_EQ(HashFactors(PyJson(f)),
            "10fc6fbd0bbb37d00e090ed04416d95a2697ff35e14f8d02b24c0badabe14d63");
  f["moe_backend"] = "triton";
  EXPECT_EQ(HashFactors(PyJson(f)),
            "fc2346b9d547feead50d4fd10192aad95bb564a3eda7e0ff9e448bc956304dfa");
}

TEST(ConfigHashTest, HypotheticalNewerKernelConfigVector) {
  PyJson::Object f{{"enable_bf16x3_router_gemm", false},
                   {"ir_op_priority", ComputeHash(IrOpPriorityConfig{})},
                   {"linear_backend", "auto"},
                   {"moe_backend", "auto"},
                   {"sparse_indexer_topk_backend", "auto"},
                   {"linear_backend_per_quant", nullptr}};
  EXPECT_EQ(HashFactors(PyJson(f)),
            "cba142ad72087079f349a8904c2466b7518baef66eb7b5fb8db267bdbce4741b");
}

// The seed KernelConfig: monokernel, the three backends and the IR hash; the
// warmup/autotune switches are ignored; per-quant overrides count once set.
TEST(ConfigHashTest, SeedKernelConfigMatchesCPython) {
  KernelConfig c;
  EXPECT_EQ(ComputeHash(c), "a0a9384d312805a94192443dbfa33a7bac7a091d8a3e5a6b7af3ffba5f661731");
  c.linear_backend_per_quant = std::map<std::string, std::string>{{"nvfp4_w4a16", "humming"}};
  EXPECT_EQ(ComputeHash(c), "4d84d0b07ca37fd95adac0bddfb16b201d7d0bef26706ba86737f9e01701b88a");
}

TEST(ConfigHashTest, IgnoredFieldsDoNotChangeTheHash) {
  KernelConfig base;
  const std::string h = ComputeHash(base);
  KernelConfig c = base;
  c.enable_cutedsl_warmup = false;
  c.enable_jit_warmup = false;
  c.enable_flashinfer_autotune = true;
  c.enable_rocm_segmented_attn_autotune = true;
  EXPECT_EQ(ComputeHash(c), h);
  c.monokernel = true;
  EXPECT_NE(ComputeHash(c), h);
}

TEST(ConfigHashTest, EveryHashedFieldChangesTheHash) {
  const std::string h = ComputeHash(KernelConfig{});
  KernelConfig a;
  a.moe_backend = "triton";
  KernelConfig b;
  b.linear_backend = "marlin";
  KernelConfig c;
  c.sparse_indexer_topk_backend = "torch";
  KernelConfig d;
  d.ir_op_priority.of("rms_norm") = {"native"};
  for (const KernelConfig* k : {&a, &b, &c, &d}) EXPECT_NE(ComputeHash(*k), h);
}

TEST(ConfigHashTest, IrHashCoversProviderOrderAndUuids) {
  IrOpPriorityConfig a;
  a.of("rms_norm") = {"vllm_c", "native"};
  IrOpPriorityConfig b;
  b.of("rms_norm") = {"native", "vllm_c"};
  EXPECT_NE(ComputeHash(a), ComputeHash(b));
  EXPECT_EQ(IrProviderUuid("rms_norm", "native").size(), 64u);
  EXPECT_NE(IrProviderUuid("rms_norm", "native"), IrProviderUuid("fused_add_rms_norm", "native"));
  EXPECT_EQ(IrProviderUuid("rms_norm", "nope"), "");
}

}  // namespace
}  // namespace kplan
