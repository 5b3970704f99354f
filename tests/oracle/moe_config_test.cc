#include "resolve/oracle/moe_config.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "base/status.h"
#include "resolve/oracle/experts.h"

namespace kplan {
namespace {

using ::testing::HasSubstr;

TEST(MoEActivationTest, ParsesValuesAndAlias) {
  EXPECT_EQ(MoEActivationFromStr("silu").value(), MoEActivation::kSilu);
  EXPECT_EQ(MoEActivationFromStr("gelu_pytorch_tanh").value(), MoEActivation::kGeluTanh);
  EXPECT_EQ(MoEActivationFromStr("relu2_no_mul").value(), MoEActivation::kRelu2NoMul);
  EXPECT_EQ(MoEActivationRepr(MoEActivation::kSwigluoai), "MoEActivation.SWIGLUOAI");
}

TEST(MoEActivationTest, UnknownListsValidValues) {
  absl::Status s = MoEActivationFromStr("swish").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(),
            "Unknown MoE activation: 'swish'. Valid activations: ['silu', 'gelu', 'gelu_tanh', "
            "'relu2', 'swigluoai', 'swigluoai_uninterleave', 'swiglustep', 'silu_no_mul', "
            "'gelu_no_mul', 'gelu_tanh_no_mul', 'relu2_no_mul']");
}

TEST(MoEActivationTest, GatedAndWithoutMul) {
  EXPECT_TRUE(IsGated(MoEActivation::kRelu2));  // by the endswith rule
  EXPECT_FALSE(IsGated(MoEActivation::kSiluNoMul));
  EXPECT_EQ(WithoutMul(MoEActivation::kSilu), MoEActivation::kSiluNoMul);
  EXPECT_EQ(WithoutMul(MoEActivation::kGelu), MoEActivation::kGeluNoMul);
  EXPECT_EQ(WithoutMul(MoEActivation::kGeluTanh), MoEActivation::kGeluTanhNoMul);
  EXPECT_EQ(WithoutMul(MoEActivation::kRelu2), MoEActivation::kRelu2NoMul);
  EXPECT_EQ(WithoutMul(MoEActivation::kSwigluoai), MoEActivation::kSwigluoai);
}

TEST(RoutingTest, GetRoutingMethodType) {
  using R = RoutingMethodType;
  struct Case {
    const char* scoring;
    bool renorm;
    int groups;
    bool bias;
    std::optional<float> scale;
    R want;
  } cases[] = {
      {"sqrtsoftplus", true, 0, true, 1.0f, R::kDeepseekV4},
      {"sqrtsoftplus", false, 0, false, 1.0f, R::kUnspecified},
      {"sigmoid", true, 8, true, 2.5f, R::kDeepSeekV3},
      {"sigmoid", true, 0, true, 1.0f, R::kMiniMax2},
      {"sigmoid", true, 0, true, std::nullopt, R::kMiniMax2},
      {"sigmoid", true, 0, true, 2.0f, R::kUnspecified},
      {"softmax", true, 0, true, 1.0f, R::kUnspecified},
      {"sigmoid", true, 0, false, 1.0f, R::kSigmoidRenorm},
      {"sigmoid", false, 0, false, 1.0f, R::kSigmoid},
      {"softmax", true, 0, false, 1.0f, R::kRenormalizeNaive},
      {"softmax", false, 0, false, 1.0f, R::kDefault},
      {"other", false, 0, false, 1.0f, R::kUnspecified},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(GetRoutingMethodType(c.scoring, 8, c.renorm, c.groups, c.bias, c.scale), c.want)
        << c.scoring << " renorm=" << c.renorm << " groups=" << c.groups << " bias=" << c.bias;
  }
  EXPECT_EQ(RoutingMethodFromName("DeepSeekV3"), R::kDeepSeekV3);
  EXPECT_EQ(RoutingMethodName(R::kSimulated), "Simulated");
  EXPECT_EQ(static_cast<int>(R::kDeepseekV4), 100);
  EXPECT_FALSE(RoutingMethodFromName("deepseekv3").has_value());
}

TEST(QuantKeyTest, NamesRoundTrip) {
  for (QuantKey k : AllQuantKeys()) {
    EXPECT_EQ(QuantKeyFromName(QuantKeyName(k)), k);
  }
  EXPECT_EQ(QuantKeyFromName(""), QuantKey::kNone);
  EXPECT_FALSE(QuantKeyFromName("kFp8").has_value());
  EXPECT_EQ(QuantKeyStr(QuantKey::kFp8StaticTensorSym),
            "QuantKey(f8e4m3fn,scale(f32,static,per_tensor),symmetric)");
  EXPECT_EQ(QuantKeyStr(QuantKey::kNone), "None");
}

// FusedMoEParallelConfig.make() docstring examples.
TEST(ParallelConfigTest, MakeFlattening) {
  struct Case {
    int tp, dp;
    bool ep;
    int tp_rank, dp_rank;
    int want_tp, want_tp_rank, want_ep, want_ep_rank, want_dp;
    bool want_use_ep;
  } cases[] = {
      {2, 1, false, 1, 0, 2, 1, 1, 0, 1, false},  // TP=2 -> TP{2,r}
      {1, 2, false, 0, 1, 2, 1, 1, 0, 2, false},  // DP=2 -> TP{2,r} DP{2,r}
      {2, 2, false, 1, 1, 4, 3, 1, 0, 2, false},  // TP=2 DP=2 -> TP{4,r}
      {2, 1, true, 1, 0, 1, 0, 2, 1, 1, true},    // TP=2 EP -> TP{1,0} EP{2,r}
      {2, 2, true, 1, 1, 1, 0, 4, 3, 2, true},    // TP=2 DP=2 EP -> EP{4,r}
      {1, 1, true, 0, 0, 1, 0, 1, 0, 1, false},   // EP needs more than one device
  };
  for (const Case& c : cases) {
    ParallelConfig p;
    p.tp_size = c.tp;
    p.dp_size = c.dp;
    p.enable_expert_parallel = c.ep;
    p.tp_rank = c.tp_rank;
    p.dp_rank = c.dp_rank;
    FusedMoEParallelConfig m = FusedMoEParallelConfig::Make(p);
    EXPECT_EQ(m.tp_size, c.want_tp) << c.tp << "x" << c.dp << " ep=" << c.ep;
    EXPECT_EQ(m.tp_rank, c.want_tp_rank);
    EXPECT_EQ(m.ep_size, c.want_ep);
    EXPECT_EQ(m.ep_rank, c.want_ep_rank);
    EXPECT_EQ(m.dp_size, c.want_dp);
    EXPECT_EQ(m.use_ep, c.want_use_ep);
  }
}

TEST(ParallelConfigTest, Predicates) {
  ParallelConfig p;
  p.dp_size = 2;
  p.enable_expert_parallel = true;
  for (const char* a2a :
       {"deepep_high_throughput", "deepep_low_latency", "deepep_v2", "flashinfer_all2allv",
        "flashinfer_nvlink_one_sided", "allgather_reducescatter", "mori_low_latency", "nixl_ep"}) {
    p.all2all_backend = a2a;
    FusedMoEParallelConfig m = FusedMoEParallelConfig::Make(p);
    std::string b = a2a;
    EXPECT_TRUE(m.use_all2all_kernels());
    EXPECT_EQ(m.use_deepep_ht_kernels(), b == "deepep_high_throughput");
    EXPECT_EQ(m.use_deepep_ll_kernels(), b == "deepep_low_latency");
    EXPECT_EQ(m.use_deepep_v2_kernels(), b == "deepep_v2");
    EXPECT_EQ(m.use_fi_nvl_two_sided_kernels(), b == "flashinfer_all2allv");
    EXPECT_EQ(m.use_fi_nvl_one_sided_kernels(), b == "flashinfer_nvlink_one_sided");
    EXPECT_EQ(m.use_ag_rs_all2all_kernels(), b == "allgather_reducescatter");
    EXPECT_EQ(m.use_mori_kernels(), b == "mori_low_latency");
    EXPECT_EQ(m.use_nixl_ep_kernels(), b == "nixl_ep");
    EXPECT_EQ(m.use_batched_activation_format(), b == "deepep_low_latency" || b == "nixl_ep");
  }
  // EP without DP/PCP/SP: no all2all kernels, so no batched format either.
  p.dp_size = 1;
  p.tp_size = 2;
  p.all2all_backend = "deepep_low_latency";
  FusedMoEParallelConfig m = FusedMoEParallelConfig::Make(p);
  EXPECT_TRUE(m.use_ep);
  EXPECT_FALSE(m.use_all2all_kernels());
  EXPECT_FALSE(m.use_batched_activation_format());
  EXPECT_EQ(FusedMoEParallelConfig::MakeNoParallel().Repr(),
            "FusedMoEParallelConfig(tp_size=1, pcp_size=1, dp_size=1, ep_size=1, tp_rank=0, "
            "pcp_rank=0, dp_rank=0, ep_rank=0, sp_size=1, use_ep=False, "
            "all2all_backend='allgather_reducescatter', enable_eplb=False)");
}

TEST(FusedMoEConfigTest, PostInitChecks) {
  MoeLayerSpec l;
  l.num_experts = 8;
  l.experts_per_token = 2;
  l.hidden_dim = 1024;
  l.intermediate_size = 1000;
  Platform cuda = ParsePlatformSpec("cuda:9.0").value();
  EnvVars env;
  ParallelConfig p;
  p.tp_size = 3;
  absl::Status s = FusedMoEConfig::Make(l, MoEActivation::kSilu, RoutingMethodType::kRenormalize,
                                        FusedMoEParallelConfig::Make(p), "auto", cuda, env)
                       .status();
  EXPECT_EQ(FieldOf(s).value(), "intermediate_size");

  p.tp_size = 2;
  FusedMoEConfig c = FusedMoEConfig::Make(l, MoEActivation::kSilu, RoutingMethodType::kRenormalize,
                                          FusedMoEParallelConfig::Make(p), "auto", cuda, env)
                         .value();
  EXPECT_EQ(c.intermediate_size_per_partition, 500);
  EXPECT_EQ(c.router_logits_dtype, "bfloat16");
  EXPECT_EQ(c.max_num_tokens, kDefaultMoeMaxNumTokens);
  EXPECT_EQ(c.device, "cuda");

  Platform cpu = ParsePlatformSpec("cpu").value();
  absl::Status nm =
      FusedMoEConfig::Make(l, MoEActivation::kSiluNoMul, RoutingMethodType::kRenormalize,
                           FusedMoEParallelConfig::Make(p), "auto", cpu, env)
          .status();
  EXPECT_EQ(nm.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(nm.message(), "is_act_and_mul=False is supported only for CUDA, XPU and ROCm for now");

  // Mori needs AITER fused MoE.
  ParallelConfig mori;
  mori.dp_size = 2;
  mori.enable_expert_parallel = true;
  mori.all2all_backend = "mori_high_throughput";
  Platform rocm = ParsePlatformSpec("rocm:gfx942").value();
  absl::Status ms = FusedMoEConfig::Make(l, MoEActivation::kSilu, RoutingMethodType::kRenormalize,
                                         FusedMoEParallelConfig::Make(mori), "auto", rocm, env)
                        .status();
  EXPECT_EQ(ms.message(), "Mori needs to be used with aiter fused_moe for now.");
  EnvVars aiter{{"VLLM_ROCM_USE_AITER", "1"}};
  EXPECT_TRUE(FusedMoEConfig::Make(l, MoEActivation::kSilu, RoutingMethodType::kRenormalize,
                                   FusedMoEParallelConfig::Make(mori), "auto", rocm, aiter)
                  .ok());
  EnvVars shared{{"VLLM_ROCM_USE_AITER", "1"}, {"VLLM_ROCM_USE_AITER_FUSION_SHARED_EXPERTS", "1"}};
  EXPECT_THAT(
      std::string(FusedMoEConfig::Make(l, MoEActivation::kSilu, RoutingMethodType::kRenormalize,
                                       FusedMoEParallelConfig::Make(mori), "auto", rocm, shared)
                      .status()
                      .message()),
      HasSubstr("Mori does not support fusion shared expert now."));
}

TEST(CapabilityTest, DevicePredicates) {
  Platform sm90 = ParsePlatformSpec("cuda:9.0").value();
  Platform sm103 = ParsePlatformSpec("cuda:10.3").value();
  Platform sm110 = ParsePlatformSpec("cuda:11.0").value();
  Platform sm121 = ParsePlatformSpec("cuda:12.1").value();
  EXPECT_TRUE(sm103.IsDeviceCapabilityFamily(100));
  EXPECT_TRUE(sm121.IsDeviceCapabilityFamily(120));
  EXPECT_FALSE(sm110.IsDeviceCapabilityFamily(100));
  EXPECT_TRUE(SupportsFp8(sm90));
  EXPECT_FALSE(SupportsFp8(ParsePlatformSpec("cuda:8.0").value()));
  EXPECT_TRUE(SupportsFp8(ParsePlatformSpec("cuda:8.9").value()));
  EXPECT_TRUE(RocmSupportsMx(ParsePlatformSpec("rocm:gfx950").value()));
  EXPECT_FALSE(RocmSupportsMx(ParsePlatformSpec("rocm:gfx942").value()));
}

}  // namespace
}  // namespace kplan
