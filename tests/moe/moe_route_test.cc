// RunMoE's backend choice (server/moe/moe_route.h): the resident set and the
// request as the oracle's layer, the oracle loop over the backends this
// server runs, and the code path each plan maps to. CPU only: residency is
// given as facts.
#include "server/moe/moe_route.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "base/status.h"
#include "resolve/oracle/experts.h"
#include "resolve/platform/local.h"

namespace kplan {
namespace {

using ::testing::HasSubstr;

constexpr int kExperts = 8;
constexpr int64_t kHidden = 256;
constexpr int64_t kInter = 128;
constexpr int64_t kTokens = 2;

ExpertsSpec Spec(kernels::DType dtype = kernels::DType::kBFloat16, const std::string& scheme = "") {
  ExpertsSpec s;
  s.experts_id = "mix";
  s.num_experts = kExperts;
  s.hidden = kHidden;
  s.intermediate = kInter;
  s.dtype = dtype;
  s.quant.scheme = scheme;
  return s;
}

ExpertsSpec Fp8(const std::string& scheme, const std::string& act_scale = "per_token") {
  ExpertsSpec s = Spec(kernels::DType::kFp8E4m3, scheme);
  s.quant.activation_scale = act_scale;
  return s;
}

ExpertsSpec IntGroup(const std::string& scheme, int group, bool zero_points) {
  ExpertsSpec s =
      Spec(scheme == "int8_group" ? kernels::DType::kInt8 : kernels::DType::kInt4Packed, scheme);
  s.quant.group_size = group;
  s.quant.has_zero_points = zero_points;
  return s;
}

// Routed by logits (Renormalize, top-2) unless `by_ids`.
MoeRunInput Input(kernels::DType act = kernels::DType::kBFloat16, bool by_ids = false) {
  MoeRunInput in;
  in.act_dtype = act;
  in.hidden_shape = {kTokens, kHidden};
  in.hidden_states.assign(kTokens * kHidden * kernels::DTypeSize(act), '\1');
  if (by_ids) {
    in.topk_shape = {kTokens, 2};
    std::vector<int32_t> ids = {0, 1, 2, 3};
    in.topk_ids.assign(reinterpret_cast<const char*>(ids.data()), ids.size() * 4);
    in.topk_weights.assign(kTokens * 2 * 4, '\0');
  } else {
    in.logits_shape = {kTokens, kExperts};
    in.router_logits.assign(kTokens * kExperts * 4, '\0');
    in.routing.routing_method = "Renormalize";
    in.routing.top_k = 2;
  }
  return in;
}

MoeLayerSpec LayerOf(const ExpertsSpec& spec, const MoeRunInput& in = Input()) {
  absl::StatusOr<MoeRunShape> shape = CheckMoeRunInput(spec, in);
  EXPECT_TRUE(shape.ok()) << shape.status();
  return LayerSpecOf(spec, in, *shape);
}

Platform Sm90() {
  LocalDevice d{0, "NVIDIA H200", {9, 0}, 141LL << 30, 132};
  return LocalPlatform({d}, /*have_cuda_kernels=*/true);
}
Platform Cpu() { return LocalPlatform({}, /*have_cuda_kernels=*/false); }

const std::vector<std::string> kGpuRuns = {"kplan", "emulation"};
const std::vector<std::string> kCpuRuns = {"emulation"};
constexpr MoeResidency kFastGpu{true, true};
constexpr MoeResidency kSlowGpu{true, false};
constexpr MoeResidency kHost{false, false};

std::string Explain(const absl::StatusOr<MoeRoute>& r) {
  return r.ok() ? ExplainPlan(r->plan) : r.status().ToString();
}

// --- LayerSpecOf --------------------------------------------------------------------------

TEST(LayerSpecOfTest, ShapesRoutingAndDtypes) {
  ExpertsSpec spec = Spec();
  spec.activation = "gelu";
  spec.has_bias = true;
  MoeLayerSpec l = LayerOf(spec, Input(kernels::DType::kFloat16));
  EXPECT_EQ(l.name, "mix");
  EXPECT_EQ(l.num_experts, kExperts);
  EXPECT_EQ(l.experts_per_token, 2);
  EXPECT_EQ(l.hidden_dim, kHidden);
  EXPECT_EQ(l.intermediate_size, kInter);
  EXPECT_EQ(l.activation, "gelu");
  EXPECT_EQ(l.in_dtype, "float16");
  EXPECT_EQ(l.router_logits_dtype, "float32");
  EXPECT_EQ(l.routing_method, "Renormalize");
  EXPECT_EQ(l.scoring_func, "softmax");
  EXPECT_TRUE(l.renormalize);
  EXPECT_TRUE(l.has_bias);
  EXPECT_EQ(l.weight_quant, "");
  EXPECT_EQ(l.activation_quant, "");
}

TEST(LayerSpecOfTest, GroupedRoutingAndGivenIds) {
  MoeRunInput in = Input();
  in.routing.routing_method = "DeepSeekV3";
  in.routing.num_expert_group = 4;
  in.routing.topk_group = 2;
  in.routing.routed_scaling_factor = 2.5f;
  in.routing.e_score_correction_bias.assign(kExperts, 0.0f);
  MoeLayerSpec l = LayerOf(Spec(), in);
  EXPECT_EQ(l.routing_method, "DeepSeekV3");
  EXPECT_EQ(l.scoring_func, "sigmoid");
  EXPECT_TRUE(l.renormalize);
  EXPECT_EQ(l.num_expert_group, 4);
  EXPECT_EQ(l.topk_group, 2);
  EXPECT_TRUE(l.has_e_score_correction_bias);
  EXPECT_EQ(l.routed_scaling_factor, 2.5f);

  MoeLayerSpec ids = LayerOf(Spec(), Input(kernels::DType::kBFloat16, /*by_ids=*/true));
  EXPECT_EQ(ids.routing_method, "Custom");
  EXPECT_EQ(ids.experts_per_token, 2);
}

TEST(LayerSpecOfTest, QuantKeysOfEveryScheme) {
  ExpertsSpec static_a1 = Fp8("fp8_per_tensor", "per_tensor");
  static_a1.quant.a1_scale = 0.5f;
  ExpertsSpec chan_static = Fp8("fp8_per_channel", "per_tensor");
  chan_static.quant.a1_scale = 0.5f;
  struct Case {
    const char* what;
    ExpertsSpec spec;
    const char* w;
    const char* a;
  } cases[] = {
      {"bf16", Spec(), "", ""},
      {"fp32", Spec(kernels::DType::kFloat32), "", ""},
      {"fp8 tensor, token", Fp8("fp8_per_tensor"), "kFp8StaticTensorSym", "kFp8DynamicTokenSym"},
      {"fp8 tensor, static a1", static_a1, "kFp8StaticTensorSym", "kFp8StaticTensorSym"},
      {"fp8 tensor, dynamic tensor", Fp8("fp8_per_tensor", "per_tensor"), "kFp8StaticTensorSym",
       "kFp8DynamicTensorSym"},
      {"fp8 channel, token", Fp8("fp8_per_channel"), "kFp8StaticChannelSym", "kFp8DynamicTokenSym"},
      {"fp8 channel, static a1", chan_static, "kFp8StaticChannelSym", "kFp8StaticTensorSym"},
      {"fp8 channel, dynamic tensor", Fp8("fp8_per_channel", "per_tensor"), "kFp8StaticChannelSym",
       "kFp8DynamicTensorSym"},
      {"fp8 block", Fp8("fp8_block"), "kFp8Static128BlockSym", "kFp8Dynamic128Sym"},
      {"int8 group", IntGroup("int8_group", 128, false), "kInt8Static", ""},
      {"int8 group, zero points", IntGroup("int8_group", 32, true), "kInt8Static", ""},
      {"int4 g128", IntGroup("int4_group", 128, false), "kInt4Static", ""},
      {"int4 g128 asym", IntGroup("int4_group", 128, true), "kInt4StaticAsym", ""},
      {"int4 g32", IntGroup("int4_group", 32, false), "kInt4Static32", ""},
      {"int4 g32 asym", IntGroup("int4_group", 32, true), "kInt4Static32Asym", ""},
  };
  for (const Case& c : cases) {
    ASSERT_TRUE(ValidateExpertsSpec(c.spec).ok()) << c.what;
    MoeLayerSpec l = LayerOf(c.spec);
    EXPECT_EQ(l.weight_quant, c.w) << c.what;
    EXPECT_EQ(l.activation_quant, c.a) << c.what;
  }
  EXPECT_EQ(LayerOf(IntGroup("int8_group", 128, false)).weight_bits, 8);
  EXPECT_EQ(LayerOf(IntGroup("int4_group", 128, false)).weight_bits, 4);
}

// Every mapped layer plans on the CPU server (emulation runs anything).
TEST(LayerSpecOfTest, EveryMappingPlansOnTheCpuServer) {
  for (ExpertsSpec spec :
       {Spec(), Fp8("fp8_per_tensor"), Fp8("fp8_per_channel", "per_tensor"), Fp8("fp8_block"),
        IntGroup("int8_group", 128, true), IntGroup("int4_group", 32, true)}) {
    absl::StatusOr<MoeRoute> r = ChooseMoeRoute(spec, Input(), "auto", kHost, Cpu(), kCpuRuns);
    ASSERT_TRUE(r.ok()) << spec.quant.scheme << ": " << r.status();
    EXPECT_EQ(r->plan.backend, "EMULATION") << spec.quant.scheme;
    EXPECT_EQ(r->kind, MoeRouteKind::kCpuReference);
  }
}

// --- the oracle loop over what this server runs -------------------------------------------

TEST(ChooseMoeRouteTest, AutoPicksKplanOnSm90ForBf16AndFp8) {
  for (ExpertsSpec spec :
       {Spec(), Fp8("fp8_block"), Fp8("fp8_per_tensor"), Fp8("fp8_per_channel")}) {
    absl::StatusOr<MoeRoute> r = ChooseMoeRoute(spec, Input(), "auto", kFastGpu, Sm90(), kGpuRuns);
    ASSERT_TRUE(r.ok()) << r.status();
    // bf16 weights: the wgmma kernels; fp8: the e4m3 tensor-core GEMMs.
    const char* kernel = spec.quant.scheme.empty() ? "KplanExperts" : "KplanFp8Experts";
    EXPECT_EQ(r->plan.backend, "KPLAN") << spec.quant.scheme << "\n" << Explain(r);
    EXPECT_EQ(r->plan.experts_kernel, kernel);
    EXPECT_TRUE(r->plan.executable);
    EXPECT_EQ(r->kind, MoeRouteKind::kGpuFast);
    EXPECT_EQ(r->backend, "kplan");
    EXPECT_EQ(r->experts_kernel, kernel);
    EXPECT_EQ(r->plan.prepare_finalize, "MoEPrepareAndFinalizeNoDPEPModular");
    // No vLLM backend was ever tried.
    for (const MoeCandidate& c : r->plan.candidates) EXPECT_THAT(c.backend, HasSubstr("KPLAN"));
  }
}

// The fast kernels apply every activation of the CPU reference: none falls
// back to the CPU on a GPU server.
TEST(ChooseMoeRouteTest, EveryActivationTakesTheFastKernels) {
  for (const char* act : {"silu", "gelu", "gelu_tanh", "relu2", "swigluoai", "swiglustep",
                          "silu_no_mul", "relu2_no_mul"}) {
    ExpertsSpec spec = Spec();
    spec.activation = act;
    absl::StatusOr<MoeRoute> r = ChooseMoeRoute(spec, Input(), "auto", kFastGpu, Sm90(), kGpuRuns);
    ASSERT_TRUE(r.ok()) << act << ": " << r.status();
    EXPECT_EQ(r->kind, MoeRouteKind::kGpuFast) << act << "\n" << Explain(r);
  }
}

// int8 / int4 sets with 16-bit activations take kplan's int kernels (the
// dequant route; the decode kernels are the per-call alternative), ahead of
// the EMULATION member that vLLM's wna16 list puts first.
TEST(ChooseMoeRouteTest, AutoPicksKplanForIntSetsOnTheGpu) {
  for (ExpertsSpec spec : {IntGroup("int4_group", 128, false), IntGroup("int4_group", 32, true),
                           IntGroup("int8_group", 64, false)}) {
    absl::StatusOr<MoeRoute> r = ChooseMoeRoute(spec, Input(), "auto", kFastGpu, Sm90(), kGpuRuns);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->plan.scheme, "wna16");
    EXPECT_EQ(r->plan.backend, "KPLAN") << spec.quant.scheme << "\n" << Explain(r);
    EXPECT_EQ(r->plan.experts_kernel, "KplanDequantExperts");
    EXPECT_TRUE(r->plan.executable);
    EXPECT_EQ(r->kind, MoeRouteKind::kGpuFast);
    EXPECT_EQ(r->backend, "kplan");
    ASSERT_EQ(r->plan.candidates.size(), 1u) << Explain(r);
    EXPECT_TRUE(r->plan.candidates[0].accepted);
  }
  // The planning half keeps vLLM's order on the same platform: MARLIN.
  absl::StatusOr<MoePlan> planned =
      PlanMoeLayer(LayerOf(IntGroup("int4_group", 128, false)), "auto", {}, Sm90(), {});
  ASSERT_TRUE(planned.ok()) << planned.status();
  EXPECT_EQ(planned->backend, "MARLIN");
}

TEST(ChooseMoeRouteTest, AutoPicksEmulationForInt4AndFp32WithReasons) {
  // The int kernels do not take this set (kSlowGpu): the oracle's KPLAN runs
  // as the emulation, and says why.
  absl::StatusOr<MoeRoute> int4 = ChooseMoeRoute(IntGroup("int4_group", 128, false), Input(),
                                                 "auto", kSlowGpu, Sm90(), kGpuRuns);
  ASSERT_TRUE(int4.ok()) << int4.status();
  EXPECT_EQ(int4->plan.scheme, "wna16");
  EXPECT_EQ(int4->plan.backend, "KPLAN") << Explain(int4);
  EXPECT_EQ(int4->backend, "emulation");
  EXPECT_EQ(int4->experts_kernel, "KplanEmulationExperts");
  EXPECT_EQ(int4->kind, MoeRouteKind::kGpuEmulation);
  ASSERT_EQ(int4->plan.candidates.size(), 2u) << Explain(int4);
  EXPECT_FALSE(int4->plan.candidates[0].accepted);
  EXPECT_THAT(int4->plan.candidates[0].reason, HasSubstr("int4_group weights"));
  EXPECT_TRUE(int4->plan.candidates[1].accepted);
  // fp32 activations: KplanDequantExperts refuses them; vLLM's
  // WNA16EmulationExperts shares the EMULATION member but never runs here.
  absl::StatusOr<MoeRoute> int4_fp32 =
      ChooseMoeRoute(IntGroup("int4_group", 128, false), Input(kernels::DType::kFloat32), "auto",
                     kSlowGpu, Sm90(), kGpuRuns);
  ASSERT_TRUE(int4_fp32.ok()) << int4_fp32.status();
  EXPECT_EQ(int4_fp32->plan.backend, "EMULATION") << Explain(int4_fp32);
  EXPECT_EQ(int4_fp32->plan.experts_kernel, "KplanEmulationExperts");
  ASSERT_EQ(int4_fp32->plan.candidates.size(), 3u) << Explain(int4_fp32);
  EXPECT_EQ(int4_fp32->plan.candidates[0].experts_kernel, "KplanDequantExperts");
  EXPECT_FALSE(int4_fp32->plan.candidates[0].accepted);
  EXPECT_EQ(int4_fp32->plan.candidates[1].experts_kernel, "KplanQuantDecodeExperts");
  EXPECT_FALSE(int4_fp32->plan.candidates[1].accepted);
  EXPECT_TRUE(int4_fp32->plan.candidates[2].accepted);

  absl::StatusOr<MoeRoute> fp32 =
      ChooseMoeRoute(Spec(), Input(kernels::DType::kFloat32), "auto", kSlowGpu, Sm90(), kGpuRuns);
  ASSERT_TRUE(fp32.ok()) << fp32.status();
  EXPECT_EQ(fp32->plan.backend, "EMULATION") << Explain(fp32);
  EXPECT_EQ(fp32->kind, MoeRouteKind::kGpuEmulation);
  ASSERT_EQ(fp32->plan.candidates.size(), 2u) << Explain(fp32);
  const MoeCandidate& kplan = fp32->plan.candidates[0];
  EXPECT_EQ(kplan.backend, "KPLAN");
  EXPECT_EQ(kplan.experts_kernel, "KplanExperts");
  EXPECT_FALSE(kplan.accepted);
  EXPECT_EQ(kplan.reason, "kernel does not support torch.float32 input/output dtype");
  EXPECT_TRUE(fp32->plan.candidates[1].accepted);
}

TEST(ChooseMoeRouteTest, CpuServerRunsEmulation) {
  absl::StatusOr<MoeRoute> r = ChooseMoeRoute(Spec(), Input(), "auto", kHost, Cpu(), kCpuRuns);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->plan.backend, "EMULATION");
  EXPECT_EQ(r->plan.experts_kernel, "KplanEmulationExperts");
  EXPECT_EQ(r->kind, MoeRouteKind::kCpuReference);
  EXPECT_EQ(r->backend, "emulation");
  // The same oracle on the same CPU platform, planning (vLLM's tables): the CPU
  // platform bypass, unchanged by the library kplan now lists.
  absl::StatusOr<MoePlan> planned = PlanMoeLayer(LayerOf(Spec()), "auto", {}, Cpu(), {});
  ASSERT_TRUE(planned.ok());
  EXPECT_EQ(planned->backend, "CPU");
  // Explicit kplan on the CPU server: not among the backends it runs.
  absl::StatusOr<MoeRoute> kplan = ChooseMoeRoute(Spec(), Input(), "kplan", kHost, Cpu(), kCpuRuns);
  EXPECT_EQ(kplan.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(kplan.status().message(),
            "moe_backend 'kplan' cannot run on this server; it runs: emulation");
}

TEST(ChooseMoeRouteTest, ExplicitVllmBackendFailsNamingTheField) {
  absl::StatusOr<MoeRoute> r =
      ChooseMoeRoute(Spec(), Input(), "triton", kFastGpu, Sm90(), kGpuRuns);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(r.status().message(),
            "moe_backend 'triton' cannot run on this server; it runs: kplan, emulation");
  EXPECT_EQ(FieldOf(r.status()).value_or(""), "moe_backend");
}

TEST(ChooseMoeRouteTest, ExplicitBackendTheSetRulesOutKeepsVllmsText) {
  // Int8 (W8A8) has no kplan member: vLLM's map error, as FAILED_PRECONDITION.
  MoeLayerSpec l = LayerOf(Spec());
  l.weight_quant = "kInt8StaticChannelSym";
  l.activation_quant = "kInt8DynamicTokenSym";
  PlanOptions runs;
  runs.executable_backends = kGpuRuns;
  absl::StatusOr<MoePlan> int8 = PlanMoeLayer(l, "kplan", {}, Sm90(), {}, runs);
  EXPECT_EQ(int8.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(int8.status().message(),
              HasSubstr("moe_backend='kplan' is not supported for Int8 MoE. Expected one of"));
  EXPECT_EQ(FieldOf(int8.status()).value_or(""), "moe_backend");
  // WNA16's KPLAN takes 16-bit activations only.
  absl::StatusOr<MoeRoute> int4 =
      ChooseMoeRoute(IntGroup("int4_group", 128, false), Input(kernels::DType::kFloat32), "kplan",
                     kSlowGpu, Sm90(), kGpuRuns);
  EXPECT_EQ(int4.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(int4.status().message(),
            "WNA16 MoE backend 'KPLAN' does not support the deployment configuration since "
            "kernel does not support torch.float32 input/output dtype.");
  EXPECT_EQ(FieldOf(int4.status()).value_or(""), "moe_backend");
  // KplanExperts rejects fp32 activations: _return_or_raise's text.
  absl::StatusOr<MoeRoute> fp32 =
      ChooseMoeRoute(Spec(), Input(kernels::DType::kFloat32), "kplan", kSlowGpu, Sm90(), kGpuRuns);
  EXPECT_EQ(fp32.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(fp32.status().message(),
            "Unquantized MoE backend kplan does not support the deployment configuration since "
            "kernel does not support torch.float32 input/output dtype.");
  EXPECT_EQ(FieldOf(fp32.status()).value_or(""), "moe_backend");
}

TEST(ChooseMoeRouteTest, KplanTheFastKernelsDoNotTakeRunsEmulationAndSaysSo) {
  ExpertsSpec blocks = Fp8("fp8_block");
  blocks.quant.block_n = 64;
  absl::StatusOr<MoeRoute> r = ChooseMoeRoute(blocks, Input(), "auto", kSlowGpu, Sm90(), kGpuRuns);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->plan.backend, "KPLAN");  // what the oracle chose
  EXPECT_EQ(r->kind, MoeRouteKind::kGpuEmulation);
  EXPECT_EQ(r->backend, "emulation");
  EXPECT_EQ(r->experts_kernel, "KplanEmulationExperts");
  ASSERT_GE(r->plan.candidates.size(), 2u);
  const MoeCandidate& kplan = r->plan.candidates.front();
  EXPECT_FALSE(kplan.accepted);
  EXPECT_THAT(kplan.reason, HasSubstr("fp8_block 64x128"));
  EXPECT_THAT(kplan.reason, HasSubstr("GPU emulation route"));
  EXPECT_TRUE(r->plan.candidates.back().accepted);
  EXPECT_EQ(r->plan.candidates.back().experts_kernel, "KplanEmulationExperts");
  // Not resident on a GPU at all: the CPU reference.
  absl::StatusOr<MoeRoute> host = ChooseMoeRoute(Spec(), Input(), "auto", kHost, Sm90(), kGpuRuns);
  ASSERT_TRUE(host.ok());
  EXPECT_EQ(host->kind, MoeRouteKind::kCpuReference);
  EXPECT_EQ(host->backend, "emulation");
}

TEST(ChooseMoeRouteTest, ExplicitEmulationStaysOffTheFastPath) {
  absl::StatusOr<MoeRoute> fast =
      ChooseMoeRoute(Spec(), Input(), "emulation", kFastGpu, Sm90(), kGpuRuns);
  ASSERT_TRUE(fast.ok()) << fast.status();
  EXPECT_EQ(fast->plan.experts_kernel, "KplanEmulationExperts");
  EXPECT_EQ(fast->kind, MoeRouteKind::kCpuReference);
  absl::StatusOr<MoeRoute> slow = ChooseMoeRoute(IntGroup("int8_group", 128, false), Input(),
                                                 "emulation", kSlowGpu, Sm90(), kGpuRuns);
  ASSERT_TRUE(slow.ok()) << slow.status();
  EXPECT_EQ(slow->kind, MoeRouteKind::kGpuEmulation);
}

TEST(ChooseMoeRouteTest, KplanBatchedHasNoKernelsHere) {
  absl::StatusOr<MoeRoute> r =
      ChooseMoeRoute(Spec(), Input(), "kplan_batched", kFastGpu, Sm90(), kGpuRuns);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  // Even where a caller lists it, the route refuses the batched format.
  std::vector<std::string> with_batched = {"kplan", "kplan_batched", "emulation"};
  r = ChooseMoeRoute(Spec(), Input(), "kplan_batched", kFastGpu, Sm90(), with_batched);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(r.status().message(), HasSubstr("batched_experts activation format"));
  EXPECT_EQ(FieldOf(r.status()).value_or(""), "moe_backend");
}

TEST(ChooseMoeRouteTest, RequestErrorsComeFirst) {
  MoeRunInput in = Input();
  in.hidden_shape = {kTokens, kHidden + 1};
  absl::StatusOr<MoeRoute> r = ChooseMoeRoute(Spec(), in, "triton", kFastGpu, Sm90(), kGpuRuns);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(FieldOf(r.status()).value_or(""), "hidden_states.shape");
}

TEST(NormalizeMoeBackendTest, AsKernelConfigNormalisesIt) {
  EXPECT_EQ(NormalizeMoeBackend("").value(), "auto");
  EXPECT_EQ(NormalizeMoeBackend("Kplan").value(), "kplan");
  EXPECT_EQ(NormalizeMoeBackend("flashinfer-cutlass").value(), "flashinfer_cutlass");
  absl::StatusOr<std::string> bad = NormalizeMoeBackend("warp_drive");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("literal_error"));
  EXPECT_EQ(FieldOf(bad.status()).value_or(""), "moe_backend");
}

// --- what ran for one call --------------------------------------------------------------

TEST(GpuLayerExpertsKernelTest, NamesEachRouteOfTheLayer) {
  using R = kernels::cuda::MoeQuantRoute;
  const auto name = [](bool quantised, bool fast, R route, bool fp8_tc) {
    return std::string(GpuLayerExpertsKernel({quantised, fast, route, fp8_tc}));
  };
  EXPECT_EQ(name(false, true, R::kEmulation, false), "KplanExperts");
  EXPECT_EQ(name(false, false, R::kEmulation, false), "KplanEmulationExperts");
  EXPECT_EQ(name(true, false, R::kDecode, false), "KplanQuantDecodeExperts");
  EXPECT_EQ(name(true, false, R::kMatvec, true), "KplanQuantDecodeExperts");
  EXPECT_EQ(name(true, false, R::kDecode, true), "KplanQuantDecodeExperts");  // forced decode
  EXPECT_EQ(name(true, false, R::kDequant, false), "KplanDequantExperts");
  EXPECT_EQ(name(true, false, R::kEmulation, true), "KplanFp8Experts");
  EXPECT_EQ(name(true, false, R::kEmulation, false), "KplanEmulationExperts");
  // Every name is a kplan experts class of the oracle, executable here.
  for (R route : {R::kEmulation, R::kDecode, R::kDequant, R::kMatvec}) {
    for (int bits = 0; bits < 8; ++bits) {
      const std::string n = name(bits & 1, bits & 2, route, bits & 4);
      const ExpertsClass* e = FindExpertsClass(n);
      ASSERT_NE(e, nullptr) << n;
      EXPECT_TRUE(e->kplan_executable) << n;
    }
  }
}

// The decode sizes of moe_quant_route.h pick the decode kernels and larger
// batches the dequant route: the name follows the call's slots.
TEST(GpuLayerExpertsKernelTest, FollowsTheSlotsOfTheCall) {
  using kernels::cuda::MoeQuantRouteFor;
  using kernels::cuda::MoeQuantRouteMode;
  const auto int_set = [](int64_t tokens) {
    GpuLayerFacts f;
    f.quantised = true;
    f.quant_route = MoeQuantRouteFor({.matvec = true, .decode = true, .dequant = true}, tokens,
                                     /*top_k=*/2, kExperts, MoeQuantRouteMode::kAuto);
    return std::string(GpuLayerExpertsKernel(f));
  };
  EXPECT_EQ(int_set(1), "KplanQuantDecodeExperts");
  EXPECT_EQ(int_set(2), "KplanQuantDecodeExperts");
  EXPECT_EQ(int_set(512), "KplanDequantExperts");
}

MoeRoute Chosen(const ExpertsSpec& spec, const MoeResidency& residency) {
  absl::StatusOr<MoeRoute> r = ChooseMoeRoute(spec, Input(), "auto", residency, Sm90(), kGpuRuns);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r : MoeRoute{};
}

TEST(RouteThatRanTest, TheRoutesOwnKernelKeepsTheRoute) {
  const MoeRoute chosen = Chosen(IntGroup("int4_group", 128, false), kFastGpu);
  for (const char* ran : {"", "KplanDequantExperts"}) {
    const MoeRoute r = RouteThatRan(chosen, ran, kTokens);
    EXPECT_EQ(r.backend, "kplan");
    EXPECT_EQ(r.experts_kernel, "KplanDequantExperts");
    EXPECT_EQ(r.plan.candidates.size(), chosen.plan.candidates.size());
  }
}

TEST(RouteThatRanTest, ADecodeSizedCallNamesTheDecodeKernels) {
  const MoeRoute chosen = Chosen(IntGroup("int4_group", 128, false), kFastGpu);
  const MoeRoute r = RouteThatRan(chosen, "KplanQuantDecodeExperts", 1);
  EXPECT_EQ(r.backend, "kplan");
  EXPECT_EQ(r.experts_kernel, "KplanQuantDecodeExperts");
  EXPECT_EQ(r.plan.experts_kernel, "KplanDequantExperts");  // the oracle's, for the layer
  ASSERT_EQ(r.plan.candidates.size(), chosen.plan.candidates.size() + 1);
  int accepted = 0;
  for (const MoeCandidate& c : r.plan.candidates) accepted += c.accepted;
  EXPECT_EQ(accepted, 1);
  const MoeCandidate& layer = r.plan.candidates.front();
  EXPECT_EQ(layer.experts_kernel, "KplanDequantExperts");
  EXPECT_FALSE(layer.accepted);
  EXPECT_EQ(layer.reason,
            "accepted for the layer; this call's 1 token ran KplanQuantDecodeExperts on the GPU");
  EXPECT_EQ(r.plan.candidates.back().backend, "KPLAN");
  EXPECT_EQ(r.plan.candidates.back().experts_kernel, "KplanQuantDecodeExperts");
  EXPECT_TRUE(r.plan.candidates.back().accepted);
}

TEST(RouteThatRanTest, KernelsEitherWayOfTheEmulation) {
  // fp8 blocks of 64 x 128: no tensor-core GEMMs, so the route is the
  // emulation; at decode sizes the decode kernels take it after all.
  ExpertsSpec blocks = Fp8("fp8_block");
  blocks.quant.block_n = 64;
  const MoeRoute emulation = Chosen(blocks, kSlowGpu);
  ASSERT_EQ(emulation.backend, "emulation");
  const MoeRoute decode = RouteThatRan(emulation, "KplanQuantDecodeExperts", kTokens);
  EXPECT_EQ(decode.backend, "kplan");
  EXPECT_EQ(decode.experts_kernel, "KplanQuantDecodeExperts");
  EXPECT_THAT(decode.plan.candidates[decode.plan.candidates.size() - 2].reason,
              HasSubstr("this call's 2 tokens ran KplanQuantDecodeExperts"));
  // A kplan route whose call ran the dequantising GEMM reports the emulation.
  const MoeRoute fp8 = Chosen(Fp8("fp8_per_tensor"), kFastGpu);
  ASSERT_EQ(fp8.experts_kernel, "KplanFp8Experts");
  const MoeRoute gemm = RouteThatRan(fp8, "KplanEmulationExperts", kTokens);
  EXPECT_EQ(gemm.backend, "emulation");
  EXPECT_EQ(gemm.plan.candidates.back().backend, "EMULATION");
  EXPECT_TRUE(gemm.plan.candidates.back().accepted);
}

}  // namespace
}  // namespace kplan
