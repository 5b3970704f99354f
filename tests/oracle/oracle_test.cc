#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "base/status.h"
#include "resolve/oracle/moe_plan.h"
#include "resolve/oracle/oracle.h"
#include "resolve/oracle/routing_methods.h"

namespace kplan {
namespace {

using ::testing::HasSubstr;

Platform P(const std::string& spec) { return ParsePlatformSpec(spec).value(); }

MoeLayerSpec Layer(const std::string& w = "", const std::string& a = "") {
  MoeLayerSpec l;
  l.name = "layers.0.mlp";
  l.num_experts = 64;
  l.experts_per_token = 8;
  l.hidden_dim = 4096;
  l.intermediate_size = 2048;
  l.routing_method = "Renormalize";
  l.weight_quant = w;
  l.activation_quant = a;
  return l;
}

absl::StatusOr<MoePlan> Plan(const MoeLayerSpec& l, const std::string& platform,
                             const std::string& backend = "auto", ParallelConfig par = {},
                             EnvVars env = {}) {
  return PlanMoeLayer(l, backend, par, P(platform), env);
}

// --- §1.7: resolved "auto" outcomes ---------------------------------------------------

struct Cell {
  const char* what;
  MoeLayerSpec layer;
  const char* platform;
  const char* backend;  // expected enum member
  const char* kernel;   // expected experts class
  std::map<std::string, std::string> env = {};
};

MoeLayerSpec With(MoeLayerSpec l, void (*f)(MoeLayerSpec&)) {
  f(l);
  return l;
}

const char* kBlockW = "kFp8Static128BlockSym";
const char* kBlockA = "kFp8Dynamic128Sym";

std::vector<Cell> Cells() {
  MoeLayerSpec unq = Layer();
  MoeLayerSpec block = Layer(kBlockW, kBlockA);
  MoeLayerSpec tensor = Layer("kFp8StaticTensorSym", "kFp8StaticTensorSym");
  MoeLayerSpec chan = Layer("kFp8StaticChannelSym", "kFp8DynamicTokenSym");
  MoeLayerSpec nvfp4 = Layer("kNvfp4Static", "kNvfp4Dynamic");
  MoeLayerSpec mxfp4 = With(Layer("kMxfp4Static"), [](MoeLayerSpec& l) {
    l.activation = "swigluoai";
    l.hidden_dim = 2880;
    l.intermediate_size = 2880;
  });
  MoeLayerSpec mxfp8 = Layer("kMxfp8Static", "kMxfp8Dynamic");
  MoeLayerSpec int8 = Layer("kInt8StaticChannelSym", "kInt8DynamicTokenSym");
  MoeLayerSpec wna16 = Layer("kInt4Static32");
  auto routed = [](MoeLayerSpec l, const char* r) {
    l.routing_method = r;
    return l;
  };
  std::map<std::string, std::string> aiter = {{"VLLM_ROCM_USE_AITER", "1"}};
  return {
      // unquantized
      {"unq sm90", unq, "cuda:9.0", "TRITON", "TritonExperts"},
      {"unq sm100", unq, "cuda:10.0", "FLASHINFER_TRTLLM", "TrtLlmBf16ExpertsMonolithic"},
      {"unq sm103", unq, "cuda:10.3", "FLASHINFER_TRTLLM", "TrtLlmBf16ExpertsMonolithic"},
      {"unq sm100 Default", routed(unq, "Default"), "cuda:10.0", "FLASHINFER_CUTLASS",
       "FlashInferExperts"},
      {"unq sm100 TopK", routed(unq, "TopK"), "cuda:10.0", "FLASHINFER_CUTLASS",
       "FlashInferExperts"},
      {"unq sm120", unq, "cuda:12.0", "FLASHINFER_CUTLASS", "FlashInferExperts"},
      {"unq sm110 (no FI)", unq, "cuda:11.0", "TRITON", "TritonExperts"},
      {"unq rocm", unq, "rocm:gfx942", "TRITON", "TritonExperts"},
      {"unq rocm aiter", unq, "rocm:gfx942", "AITER", "AiterExperts", aiter},
      {"unq cpu", unq, "cpu", "CPU", ""},
      {"unq xpu", unq, "xpu", "XPU", "XPUExperts"},
      {"unq tpu", unq, "tpu", "TPU", ""},
      // fp8 block (DeepSeek)
      {"block sm90", block, "cuda:9.0", "TRITON", "TritonExperts"},
      {"block sm100", block, "cuda:10.0", "FLASHINFER_TRTLLM", "TrtLlmFp8ExpertsMonolithic"},
      {"block sm100 Default", routed(block, "Default"), "cuda:10.0", "DEEPGEMM",
       "TritonOrDeepGemmExperts"},
      {"block sm120", block, "cuda:12.0", "DEEPGEMM", "TritonOrDeepGemmExperts"},
      {"block sm120 no deep_gemm", block, "cuda:12.0+flashinfer", "TRITON", "TritonExperts"},
      {"block rocm", block, "rocm:gfx942", "TRITON", "TritonExperts"},
      {"block rocm aiter", block, "rocm:gfx942", "AITER", "AiterExperts", aiter},
      {"block cpu", block, "cpu", "CPU", "CPUExpertsFp8"},
      {"block xpu", block, "xpu", "XPU", "XPUExpertsBlockFp8"},
      // fp8 per-tensor (static activation scale)
      {"tensor sm90", tensor, "cuda:9.0", "FLASHINFER_CUTLASS", "FlashInferExperts"},
      {"tensor sm100", tensor, "cuda:10.0", "FLASHINFER_TRTLLM", "TrtLlmFp8ExpertsMonolithic"},
      {"tensor sm120", tensor, "cuda:12.0", "FLASHINFER_CUTLASS", "FlashInferExperts"},
      {"tensor rocm", tensor, "rocm:gfx942", "TRITON", "TritonExperts"},
      {"tensor rocm aiter", tensor, "rocm:gfx942", "AITER", "AiterExperts", aiter},
      {"tensor cpu", tensor, "cpu", "NONE", ""},
      // XPUExpertsFp8 takes (fp8 tensor, None | dynamic tensor) only (xpu_moe.py's
      // SUPPORTED_W_A); §1.7's "XPU" for static activations disagrees with it.
      {"tensor xpu", tensor, "xpu", "TRITON", "TritonExperts"},
      {"tensor dyn xpu", Layer("kFp8StaticTensorSym", "kFp8DynamicTensorSym"), "xpu", "XPU",
       "XPUExpertsFp8"},
      // fp8 per-channel weights, per-token activations
      {"chan sm90", chan, "cuda:9.0", "TRITON", "TritonExperts"},
      {"chan sm100", chan, "cuda:10.0", "TRITON", "TritonExperts"},
      {"chan sm120", chan, "cuda:12.0", "TRITON", "TritonExperts"},
      {"chan rocm", chan, "rocm:gfx942", "TRITON", "TritonExperts"},
      {"chan cpu", chan, "cpu", "NONE", ""},
      // nvfp4
      {"nvfp4 sm90", nvfp4, "cuda:9.0", "MARLIN", "MarlinExperts"},
      {"nvfp4 sm100", nvfp4, "cuda:10.0", "FLASHINFER_TRTLLM", "TrtLlmNvFp4ExpertsMonolithic"},
      {"nvfp4 sm120", nvfp4, "cuda:12.0", "FLASHINFER_CUTLASS", "FlashInferExperts"},
      {"nvfp4 sm120 no FI", nvfp4, "cuda:12.0+deep_gemm", "VLLM_CUTLASS", "CutlassExpertsFp4"},
      {"nvfp4 rocm", nvfp4, "rocm:gfx942", "EMULATION", "Nvfp4QuantizationEmulationTritonExperts"},
      // mxfp4 gpt-oss
      {"mxfp4 sm90", mxfp4, "cuda:9.0", "TRITON", "OAITritonMxfp4ExpertsMonolithic"},
      {"mxfp4 sm100", mxfp4, "cuda:10.0", "FLASHINFER_TRTLLM_MXFP4_BF16",
       "TrtLlmMxfp4ExpertsMonolithic"},
      {"mxfp4 sm120", mxfp4, "cuda:12.0", "MARLIN", "MarlinExperts"},
      {"mxfp4 rocm gfx942", mxfp4, "rocm:gfx942", "TRITON", "OAITritonMxfp4ExpertsMonolithic"},
      {"mxfp4 rocm gfx950 aiter", mxfp4, "rocm:gfx950", "AITER_MXFP4_BF16", "AiterExperts", aiter},
      {"mxfp4 rocm no triton_kernels", mxfp4, "rocm:gfx942+aiter", "EMULATION",
       "OCP_MXQuantizationEmulationTritonExperts"},
      {"mxfp4 cpu", mxfp4, "cpu", "CPU", "CPUExpertsMxfp4"},
      {"mxfp4 xpu", mxfp4, "xpu", "XPU", "XPUExpertsMXFp4"},
      // mxfp8
      {"mxfp8 sm90", mxfp8, "cuda:9.0", "MARLIN", "MarlinExperts"},
      {"mxfp8 sm100", mxfp8, "cuda:10.0", "FLASHINFER_TRTLLM", "TrtLlmFp8ExpertsMonolithic"},
      {"mxfp8 sm120", mxfp8, "cuda:12.0", "MARLIN", "MarlinExperts"},
      {"mxfp8 gfx950 flydsl", mxfp8, "rocm:gfx950+aiter,flydsl", "AITER_MXFP8",
       "AiterMxfp8Experts"},
      {"mxfp8 gfx950", mxfp8, "rocm:gfx950", "TRITON_MXFP8", "Mxfp8NativeTritonExperts"},
      {"mxfp8 gfx942", mxfp8, "rocm:gfx942", "EMULATION", "Mxfp8EmulationTritonExperts"},
      {"mxfp8 xpu", mxfp8, "xpu", "XPU", "XPUExpertsMxFp8"},
      // int8
      {"int8 sm90", int8, "cuda:9.0", "TRITON", "TritonExperts"},
      {"int8 sm100", int8, "cuda:10.0", "TRITON", "TritonExperts"},
      {"int8 sm120", int8, "cuda:12.0", "TRITON", "TritonExperts"},
      {"int8 cpu", int8, "cpu", "CPU", "CPUExpertsInt8"},
      // wna16
      {"wna16 sm90", wna16, "cuda:9.0", "MARLIN", "MarlinExperts"},
      {"wna16 sm100", wna16, "cuda:10.0", "FLASHINFER_TRTLLM", "TrtLlmMxint4ExpertsMonolithic"},
      {"wna16 sm100 Default", routed(wna16, "Default"), "cuda:10.0", "MARLIN", "MarlinExperts"},
      {"wna16 sm100 int4 (g-1)", Layer("kInt4Static"), "cuda:10.0", "MARLIN", "MarlinExperts"},
      {"wna16 sm120", wna16, "cuda:12.0", "MARLIN", "MarlinExperts"},
      {"wna16 rocm", wna16, "rocm:gfx942", "EMULATION", "WNA16EmulationExperts"},
      {"wna16 cpu", wna16, "cpu", "CPU", "CPUExpertsInt4"},
      {"wna16 xpu", wna16, "xpu", "XPU", "XPUExpertsWNA16"},
  };
}

TEST(ExpectedOutcomesTest, EveryCell) {
  for (const Cell& c : Cells()) {
    absl::StatusOr<MoePlan> p = Plan(c.layer, c.platform, "auto", {}, EnvVars(c.env));
    ASSERT_TRUE(p.ok()) << c.what << ": " << p.status();
    EXPECT_EQ(p->backend, c.backend) << c.what << "\n" << ExplainPlan(*p);
    EXPECT_EQ(p->experts_kernel, c.kernel) << c.what << "\n" << ExplainPlan(*p);
    EXPECT_FALSE(p->executable) << c.what;
  }
}

// kplan's family never changes a vLLM resolution, even where the platform has it.
TEST(ExpectedOutcomesTest, KplanLibraryDoesNotChangeVllmOutcomes) {
  for (const Cell& c : Cells()) {
    Platform p = P(c.platform);
    if (!p.is_cuda()) continue;
    p.libraries.insert("kplan");
    absl::StatusOr<MoePlan> plan = PlanMoeLayer(c.layer, "auto", {}, p, EnvVars(c.env));
    ASSERT_TRUE(plan.ok()) << c.what;
    EXPECT_EQ(plan->backend, c.backend) << c.what;
    EXPECT_EQ(plan->experts_kernel, c.kernel) << c.what;
  }
}

struct FailCell {
  const char* what;
  MoeLayerSpec layer;
  const char* platform;
  absl::StatusCode code;
  const char* message;
};

TEST(ExpectedOutcomesTest, Failures) {
  MoeLayerSpec nvfp4 = Layer("kNvfp4Static", "kNvfp4Dynamic");
  MoeLayerSpec int8 = Layer("kInt8StaticChannelSym", "kInt8DynamicTokenSym");
  MoeLayerSpec mxfp8 = Layer("kMxfp8Static", "kMxfp8Dynamic");
  MoeLayerSpec block = Layer(kBlockW, kBlockA);
  MoeLayerSpec lora_mxfp4 = Layer("kMxfp4Static");
  lora_mxfp4.activation = "swigluoai";
  lora_mxfp4.is_lora_enabled = true;
  MoeLayerSpec dsv4 = Layer("kMxfp4Static");
  dsv4.quant_scheme = "mxfp4_deepseek_v4";
  MoeLayerSpec w4a8 = Layer("kInt4W4A8StaticGroup128Sym", "kFp8DynamicTokenSym");
  w4a8.in_dtype = "float16";
  MoeLayerSpec w4a8_int8 = Layer("kInt4W4A8StaticChannelSym", "kInt8DynamicTokenSym");
  MoeLayerSpec w4a8_int8_gelu = w4a8_int8;
  w4a8_int8_gelu.activation = "gelu";
  const auto kFP = absl::StatusCode::kFailedPrecondition;
  FailCell cells[] = {
      {"nvfp4 cpu", nvfp4, "cpu", kFP,
       "No NvFp4 MoE backend supports the deployment configuration."},
      {"nvfp4 xpu", nvfp4, "xpu", kFP,
       "No NvFp4 MoE backend supports the deployment configuration."},
      {"int8 rocm", int8, "rocm:gfx942", kFP,
       "No Int8 MoE backend supports the deployment configuration."},
      {"mxfp8 cpu", mxfp8, "cpu", kFP, "No MXFP8 MoE backends available."},
      {"fp8 block sm70", block, "cuda:7.0", kFP,
       "No FP8 MoE backend supports the deployment configuration."},
      {"mxfp4 cuda lora", lora_mxfp4, "cuda:9.0", kFP,
       "No MXFP4 MoE backend supports the deployment configuration. weight_key=kMxfp4Static, "
       "activation_key=None. Native backends require specific hardware. Set "
       "`VLLM_LOGGING_LEVEL=DEBUG` to see detailed unsupported reasons. "},
      {"dsv4 cpu", dsv4, "cpu", kFP, "No MXFP4 MoE backend supports the deployment configuration."},
      {"w4a8 fp16", w4a8, "cuda:9.0", kFP,
       "W4A8 MoE backend CUTLASS does not support the deployment configuration: kernel does not "
       "support torch.float16 input/output dtype."},
      {"w4a8_int8 cuda", w4a8_int8, "cuda:9.0", kFP,
       "W4A8 Int8 MoE is only supported on CPU platforms"},
      {"w4a8_int8 cpu gelu", w4a8_int8_gelu, "cpu", kFP,
       "No W4A8 Int8 MoE backend supports the deployment configuration."},
  };
  for (const FailCell& c : cells) {
    absl::Status s = Plan(c.layer, c.platform).status();
    EXPECT_EQ(s.code(), c.code) << c.what << ": " << s;
    EXPECT_EQ(s.message(), c.message) << c.what;
  }
  // VLLM_ROCM_USE_AITER=1 forces AITER, whose experts need what
  // @if_aiter_supported checks: the aiter package and a gfx9 device.
  EnvVars aiter({{"VLLM_ROCM_USE_AITER", "1"}});
  ASSERT_EQ(Plan(Layer(), "rocm:gfx942", "auto", {}, aiter)->backend, "AITER");
  for (const char* platform : {"rocm:gfx942+triton_kernels", "rocm:gfx1100"}) {
    absl::Status s = Plan(Layer(), platform, "auto", {}, aiter).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << platform;
    EXPECT_THAT(std::string(s.message()),
                HasSubstr("ROCm AITER does not support the deployment configuration since kernel "
                          "does not support current device rocm"))
        << platform;
  }
}

TEST(ExpectedOutcomesTest, OtherSchemesSucceed) {
  MoeLayerSpec mxfp4 = Layer("kMxfp4Static");
  mxfp4.activation = "swigluoai";
  mxfp4.is_lora_enabled = true;
  // vLLM returns (NONE, None) on out-of-tree platforms.
  MoePlan oot = Plan(mxfp4, "oot").value();
  EXPECT_EQ(oot.backend, "NONE");
  EXPECT_EQ(oot.experts_kernel, "");

  MoeLayerSpec w4a8_int8 = Layer("kInt4W4A8StaticChannelSym", "kInt8DynamicTokenSym");
  MoePlan cpu = Plan(w4a8_int8, "cpu").value();
  EXPECT_EQ(cpu.scheme, "w4a8_int8");
  EXPECT_EQ(cpu.backend, "CPU_INT4");
  EXPECT_EQ(cpu.experts_kernel, "CPUExpertsInt4");  // experts/cpu_int4_moe.py, monolithic
  EXPECT_EQ(cpu.log_line,
            "Using CPU_INT4 W4A8 Int8 MoE backend out of potential backends: ['CPU_INT4'].");
  // mxfp4.py and mxfp8.py quote the value in their log lines.
  MoeLayerSpec gpt_oss = Layer("kMxfp4Static");
  gpt_oss.activation = "swigluoai";
  EXPECT_THAT(Plan(gpt_oss, "cuda:10.0")->log_line,
              ::testing::StartsWith("Using 'FLASHINFER_TRTLLM_MXFP4_BF16' Mxfp4 MoE backend out "
                                    "of potential backends: ['FLASHINFER_TRTLLM_MXFP4_BF16', "));
  EXPECT_THAT(Plan(Layer("kMxfp8Static", "kMxfp8Dynamic"), "cuda:10.0")->log_line,
              ::testing::StartsWith("Using 'FLASHINFER_TRTLLM' Mxfp8 MoE backend out of "
                                    "potential backends: ["));
  EXPECT_TRUE(cpu.monolithic);

  MoeLayerSpec w4a8 = Layer("kInt4W4A8StaticGroup128Sym", "kFp8DynamicTokenSym");
  EXPECT_EQ(Plan(w4a8, "cuda:9.0")->experts_kernel, "CutlassExpertsW4A8Fp8");
  // select_w4a8_moe_backend() never reads moe_backend; it logs without a list.
  MoePlan w4a8_triton = Plan(w4a8, "cuda:9.0", "triton").value();
  EXPECT_EQ(w4a8_triton.backend, "CUTLASS");
  EXPECT_EQ(w4a8_triton.log_line, "Using CUTLASS W4A8 MoE backend.");
  // int_wna16.py: "Using 'V' WNA16 MoE backend."
  EXPECT_EQ(Plan(Layer("kInt4Static32"), "cuda:9.0")->log_line,
            "Using 'MARLIN' WNA16 MoE backend.");

  MoeLayerSpec dsv4 = Layer("kMxfp4Static");
  dsv4.quant_scheme = "mxfp4_deepseek_v4";
  dsv4.routing_method = "DeepseekV4";
  MoePlan b200 = Plan(dsv4, "cuda:10.0").value();
  EXPECT_EQ(b200.backend, "FLASHINFER_TRTLLM_MXFP4_MXFP8");
  EXPECT_EQ(b200.experts_kernel, "TrtLlmMxfp4ExpertsModular");  // monolithic rejects DeepseekV4
  EXPECT_EQ(b200.activation_key, "kMxfp8Dynamic");
  EXPECT_EQ(b200.candidates[0].reason, "kernel does not support routing method 100");
  MoePlan rocm = Plan(dsv4, "rocm:gfx942").value();
  EXPECT_EQ(rocm.backend, "TRITON_UNFUSED");
}

// --- plan details ----------------------------------------------------------------------

TEST(PlanTest, FieldsAndLogLine) {
  MoePlan p = Plan(Layer(), "cuda:9.0").value();
  EXPECT_EQ(p.layer, "layers.0.mlp");
  EXPECT_EQ(p.scheme, "unquantized");
  EXPECT_EQ(p.backend_value, "TRITON");
  EXPECT_FALSE(p.monolithic);
  EXPECT_EQ(p.activation_format, "standard");
  EXPECT_EQ(p.prepare_finalize, "MoEPrepareAndFinalizeNoDPEPModular");
  EXPECT_EQ(p.topk_indices_dtype, "");
  EXPECT_FALSE(p.output_is_reduced);
  EXPECT_EQ(p.hidden_dim, 4096);
  EXPECT_EQ(p.intermediate_size_per_partition, 2048);
  EXPECT_EQ(p.weight_key, "None");
  EXPECT_EQ(p.activation_key, "None");
  EXPECT_EQ(p.routing_method, "Renormalize");
  EXPECT_EQ(p.log_line,
            "Using TRITON Unquantized MoE backend out of potential backends: ['TRITON', "
            "'BATCHED_TRITON', 'FlashInfer TRTLLM', 'FlashInfer CUTLASS'].");
  ASSERT_EQ(p.candidates.size(), 1u);
  EXPECT_TRUE(p.candidates[0].accepted);

  MoePlan b = Plan(Layer(), "cuda:10.0").value();
  EXPECT_TRUE(b.monolithic);
  EXPECT_EQ(b.prepare_finalize, "MoEPrepareAndFinalizeNoDPEPMonolithic");
  EXPECT_EQ(b.backend_value, "FlashInfer TRTLLM");
}

TEST(PlanTest, RejectionReasonsInOrder) {
  MoeLayerSpec l = Layer();
  l.routing_method = "Default";
  MoePlan p = Plan(l, "cuda:10.0").value();
  ASSERT_GE(p.candidates.size(), 3u);
  EXPECT_EQ(p.candidates[0], (MoeCandidate{"FLASHINFER_TRTLLM", "TrtLlmBf16ExpertsMonolithic",
                                           false, "kernel does not support routing method 0"}));
  EXPECT_EQ(p.candidates[1].experts_kernel, "TrtLlmBf16ExpertsModular");
  EXPECT_EQ(p.candidates[1].reason,
            "kernel does not support parallel config FusedMoEParallelConfig(tp_size=1, "
            "pcp_size=1, dp_size=1, ep_size=1, tp_rank=0, pcp_rank=0, dp_rank=0, ep_rank=0, "
            "sp_size=1, use_ep=False, all2all_backend='allgather_reducescatter', "
            "enable_eplb=False)");
  EXPECT_TRUE(p.candidates[2].accepted);

  // AITER's suffix when AITER MoE is off; device name is vLLM's device_name.
  MoePlan f = Plan(Layer(kBlockW, kBlockA), "cuda:10.0").value();
  EXPECT_EQ(f.candidates[0].reason,
            "kernel does not support current device cuda. AITER MoE is not enabled — set "
            "VLLM_ROCM_USE_AITER=1 and VLLM_ROCM_USE_AITER_MOE=1 to enable it");

  MoeLayerSpec gelu = Layer();
  gelu.activation = "gelu";
  MoePlan g = Plan(gelu, "cuda:10.0").value();
  EXPECT_EQ(g.candidates[0].reason, "kernel does not support MoEActivation.GELU activation");

  MoeLayerSpec nm = Layer(kBlockW, kBlockA);
  nm.activation = "relu2_no_mul";
  MoePlan n = Plan(nm, "cuda:12.0").value();
  bool saw = false;
  for (const MoeCandidate& c : n.candidates) {
    saw |= c.reason == "kernel does not support no act_and_mul MLP layer";
  }
  EXPECT_TRUE(saw) << ExplainPlan(n);

  MoePlan q = Plan(Layer(kBlockW, kBlockA), "cuda:12.0").value();
  EXPECT_EQ(q.candidates[3].reason,
            "kernel does not support quantization scheme "
            "QuantKey(f8e4m3fn,scale(f32,static,GroupShape(row=128, col=128)),symmetric)x"
            "QuantKey(f8e4m3fn,scale(f32,dynamic,GroupShape(row=1, col=128)),symmetric)");

  MoeLayerSpec logits = Layer(kBlockW, kBlockA);
  logits.router_logits_dtype = "float16";
  MoePlan lg = Plan(logits, "cuda:10.0").value();
  EXPECT_EQ(lg.candidates[1].reason, "kernel does not support router logits dtype torch.float16");

  Platform hpc = P("cuda:9.0+hpc");
  MoeLayerSpec shape = Layer("kFp8StaticTensorSym", "kFp8StaticTensorSym");
  shape.hidden_dim = 2880;
  absl::Status hs = PlanMoeLayer(shape, "hpc", {}, hpc, {}).status();
  EXPECT_EQ(hs.message(),
            "FP8 MoE backend HPC does not support the deployment configuration since kernel does "
            "not support 2880 hidden dim is not supported.");
}

TEST(PlanTest, LoraOverride) {
  MoeLayerSpec l = Layer();
  l.is_lora_enabled = true;
  // LoRA beats an explicit request.
  MoePlan p = Plan(l, "cuda:9.0", "flashinfer_cutlass").value();
  EXPECT_EQ(p.backend, "TRITON");
  EXPECT_EQ(p.experts_kernel, "TritonExperts");
  MoePlan b = Plan(l, "cuda:10.0").value();
  EXPECT_EQ(b.backend, "FLASHINFER_TRTLLM");
  EXPECT_EQ(b.experts_kernel, "TrtLlmBf16LoRAExperts");
  l.intermediate_size = 2000;
  EXPECT_EQ(Plan(l, "cuda:10.0")->backend, "TRITON");
  // Quantized schemes: LoRA is an ordinary check (TritonExperts supports it).
  MoeLayerSpec f = Layer(kBlockW, kBlockA);
  f.is_lora_enabled = true;
  MoePlan fp = Plan(f, "cuda:10.0").value();
  EXPECT_EQ(fp.backend, "TRITON");
  EXPECT_EQ(fp.candidates[1].reason, "kernel does not support LoRA");
}

TEST(PlanTest, SwigluLimit) {
  MoeLayerSpec l = Layer("kNvfp4Static", "kNvfp4Dynamic");
  l.swiglu_limit = 7.0f;
  MoePlan b = Plan(l, "cuda:10.0").value();
  EXPECT_EQ(b.backend, "FLASHINFER_TRTLLM");
  EXPECT_EQ(b.log_line,
            "Using 'FLASHINFER_TRTLLM' NvFp4 MoE backend out of potential backends: "
            "['FLASHINFER_TRTLLM', 'FLASHINFER_CUTLASS', 'MARLIN'].");
  // An explicit request's log names the same list (_make_log_backend).
  EXPECT_EQ(Plan(l, "cuda:10.0", "marlin")->log_line,
            "Using 'MARLIN' NvFp4 MoE backend out of potential backends: "
            "['FLASHINFER_TRTLLM', 'FLASHINFER_CUTLASS', 'MARLIN'].");
  EXPECT_EQ(Plan(l, "cuda:9.0")->backend, "MARLIN");
  // Without the clamp set, ROCm resolves to EMULATION; with it nothing applies the clamp.
  EXPECT_EQ(Plan(l, "rocm:gfx942").status().code(), absl::StatusCode::kFailedPrecondition);
  absl::Status s = Plan(l, "cuda:10.0", "flashinfer_cutedsl").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(FieldOf(s).value(), "moe_backend");
  EXPECT_EQ(s.message(),
            "Model sets swiglu_limit=7.0, but the explicitly requested "
            "moe_backend='flashinfer_cutedsl' does not apply the SwiGLU clamp. Use "
            "'flashinfer_trtllm' or 'flashinfer_cutlass' instead.");
  EXPECT_EQ(Plan(l, "cuda:10.0", "marlin")->backend, "MARLIN");
}

ParallelConfig DpEp(const char* a2a, int dp = 2) {
  ParallelConfig p;
  p.dp_size = dp;
  p.enable_expert_parallel = true;
  p.all2all_backend = a2a;
  return p;
}

TEST(PlanTest, BatchedFormatSubstitution) {
  ParallelConfig ll = DpEp("deepep_low_latency");
  MoePlan t = Plan(Layer(), "cuda:9.0", "triton", ll).value();
  EXPECT_EQ(t.backend, "BATCHED_TRITON");
  EXPECT_EQ(t.experts_kernel, "BatchedTritonExperts");
  EXPECT_EQ(t.activation_format, "batched_experts");
  EXPECT_EQ(t.prepare_finalize, "DeepEPLLPrepareAndFinalize");
  EXPECT_EQ(t.topk_indices_dtype, "int64");
  EXPECT_TRUE(t.output_is_reduced);

  MoePlan d = Plan(Layer(kBlockW, kBlockA), "cuda:9.0", "deep_gemm", ll).value();
  EXPECT_EQ(d.backend, "BATCHED_DEEPGEMM");
  EXPECT_EQ(d.experts_kernel, "BatchedDeepGemmExperts");

  MoeLayerSpec chan = Layer("kFp8StaticChannelSym", "kFp8DynamicTokenSym");
  chan.allow_vllm_cutlass = true;
  EXPECT_EQ(Plan(chan, "cuda:9.0", "cutlass", ll)->backend, "BATCHED_VLLM_CUTLASS");
  EXPECT_EQ(
      Plan(Layer("kNvfp4Static", "kNvfp4Dynamic"), "cuda:10.0", "flashinfer_cutedsl", ll)->backend,
      "FLASHINFER_CUTEDSL_BATCHED");
  EXPECT_EQ(Plan(Layer("kInt4Static32"), "cuda:9.0", "marlin", ll)->backend, "BATCHED_MARLIN");

  // auto: the standard classes fail the format check.
  MoePlan a = Plan(Layer(), "cuda:9.0", "auto", ll).value();
  EXPECT_EQ(a.backend, "BATCHED_TRITON");
  EXPECT_EQ(a.candidates[0].reason,
            "kernel does not support ('batched_experts',) activation format");

  // EP without DP: no all2all kernels, standard format.
  ParallelConfig tp_ep;
  tp_ep.tp_size = 2;
  tp_ep.enable_expert_parallel = true;
  tp_ep.all2all_backend = "deepep_low_latency";
  EXPECT_EQ(Plan(Layer(), "cuda:9.0", "triton", tp_ep)->backend, "TRITON");
}

TEST(PlanTest, HiddenSizeRoundUps) {
  MoeLayerSpec l = Layer();
  l.hidden_dim = 2880;
  MoePlan ht = Plan(l, "cuda:9.0", "auto", DpEp("deepep_high_throughput")).value();
  EXPECT_EQ(ht.hidden_dim, 3072);
  EXPECT_EQ(ht.prepare_finalize, "DeepEPHTPrepareAndFinalize");
  EXPECT_EQ(Plan(l, "cuda:9.0", "auto", DpEp("deepep_low_latency"))->hidden_dim, 3072);
  EXPECT_EQ(Plan(l, "cuda:9.0", "auto", DpEp("nixl_ep"))->hidden_dim, 3072);
  EXPECT_EQ(Plan(l, "cuda:9.0", "auto", DpEp("deepep_v2"))->hidden_dim, 3072);
  l.in_dtype = "float32";
  EXPECT_EQ(Plan(l, "cuda:9.0", "auto", DpEp("deepep_high_throughput"))->hidden_dim, 2944);
  l.hidden_dim = 9000;
  absl::Status s = Plan(l, "cuda:9.0", "auto", DpEp("deepep_low_latency")).status();
  EXPECT_EQ(s.message(), "Hidden Size 9000 is greater than the maximum supported hidden size 8192");
  EXPECT_EQ(FieldOf(s).value(), "hidden_dim");

  // MXFP4 round-ups per backend.
  MoeLayerSpec m = Layer("kMxfp4Static");
  m.activation = "swigluoai";
  m.hidden_dim = 2880;
  m.intermediate_size = 2880;
  MoePlan b = Plan(m, "cuda:10.0").value();
  EXPECT_EQ(b.hidden_dim, 3072);
  EXPECT_EQ(b.intermediate_size_per_partition, 3072);
  MoePlan h = Plan(m, "cuda:9.0").value();
  EXPECT_EQ(h.hidden_dim, 2880);
  EXPECT_EQ(h.intermediate_size_per_partition, 2880);
  MoePlan r = Plan(m, "cuda:12.0").value();  // MARLIN
  EXPECT_EQ(r.hidden_dim, 3072);
  EXPECT_EQ(r.intermediate_size_per_partition, 2944);
  MoePlan c = Plan(m, "cpu").value();
  EXPECT_EQ(c.hidden_dim, 2880);
  MoePlan g = Plan(m, "rocm:gfx942").value();
  EXPECT_EQ(g.hidden_dim, 3072);
}

TEST(PlanTest, PrepareFinalizeTable) {
  struct Case {
    const char* a2a;
    const char* pf;
    const char* dtype;
    bool reduced;
  } cases[] = {
      {"allgather_reducescatter", "MoEPrepareAndFinalizeNaiveDPEPModular", "", false},
      {"deepep_v2", "DeepEPV2PrepareAndFinalize", "int64", true},
      {"flashinfer_all2allv", "FlashInferNVLinkTwoSidedPrepareAndFinalize", "", true},
      {"flashinfer_nvlink_one_sided", "FlashInferNVLinkOneSidedPrepareAndFinalize", "int32", true},
      {"nixl_ep", "NixlEPPrepareAndFinalize", "int64", true},
      {"kplan_all2allv", "KplanAll2AllVPrepareAndFinalize", "int32", true},
  };
  for (const Case& c : cases) {
    MoePlan p = Plan(Layer(), "cuda:9.0", "auto", DpEp(c.a2a)).value();
    EXPECT_EQ(p.prepare_finalize, c.pf) << c.a2a;
    EXPECT_EQ(p.topk_indices_dtype, c.dtype) << c.a2a;
    EXPECT_EQ(p.output_is_reduced, c.reduced) << c.a2a;
  }
  // DP without EP: naive DP/EP dispatch.
  ParallelConfig dp;
  dp.dp_size = 2;
  EXPECT_EQ(Plan(Layer(), "cuda:9.0", "auto", dp)->prepare_finalize,
            "MoEPrepareAndFinalizeNaiveDPEPModular");
  // Mori on ROCm with AITER.
  MoePlan mori = Plan(Layer(), "rocm:gfx942", "auto", DpEp("mori_low_latency"),
                      EnvVars{{"VLLM_ROCM_USE_AITER", "1"}})
                     .value();
  EXPECT_EQ(mori.prepare_finalize, "MoriPrepareAndFinalize");
  EXPECT_EQ(mori.topk_indices_dtype, "int32");
  // One-sided NVLink refuses fp8 activations.
  absl::Status s =
      Plan(Layer(kBlockW, kBlockA), "cuda:9.0", "auto", DpEp("flashinfer_nvlink_one_sided"))
          .status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("flashinfer_nvlink_one_sided dispatch supports nvfp4, mxfp8, and bf16"));
}

TEST(PlanTest, DpEpModifiers) {
  // DP>1 without EP demotes FlashInfer CUTLASS (unquantized, SM100, Default routing).
  MoeLayerSpec l = Layer();
  l.routing_method = "Default";
  ParallelConfig dp;
  dp.dp_size = 2;
  MoePlan p = Plan(l, "cuda:10.0", "auto", dp).value();
  EXPECT_EQ(p.backend, "TRITON");
  EXPECT_THAT(p.log_line, HasSubstr("['FlashInfer TRTLLM', 'TRITON', 'BATCHED_TRITON', "
                                    "'FlashInfer CUTLASS']"));
  // swigluoai moves both FlashInfer backends back.
  MoeLayerSpec oai = Layer();
  oai.activation = "swigluoai";
  EXPECT_EQ(Plan(oai, "cuda:10.0")->backend, "TRITON");
  // EPLB disables the TRT-LLM monolithic kernels.
  ParallelConfig eplb;
  eplb.tp_size = 2;
  eplb.enable_expert_parallel = true;
  eplb.enable_eplb = true;
  MoePlan e = Plan(Layer(), "cuda:10.0", "auto", eplb).value();
  EXPECT_EQ(e.backend, "FLASHINFER_CUTLASS");
  EXPECT_THAT(e.candidates[0].reason, HasSubstr("enable_eplb=True)"));
  MoeLayerSpec odd = Layer();
  odd.num_experts = 63;
  EXPECT_EQ(Plan(odd, "cuda:10.0", "auto", eplb).status().message(),
            "EPLB currently only supports even distribution of experts across ranks. Got 63 "
            "experts and 2 EP ranks.");
  // fp8 block on exact SM90 with EP: FlashInfer CUTLASS first.
  ParallelConfig ep;
  ep.tp_size = 2;
  ep.enable_expert_parallel = true;
  EXPECT_EQ(Plan(Layer(kBlockW, kBlockA), "cuda:9.0", "auto", ep)->backend, "FLASHINFER_CUTLASS");
  // Blackwell + DeepEP v2 + block fp8: TRT-LLM first (and rejected for A2A, monolithic).
  MoePlan v2 = Plan(Layer(kBlockW, kBlockA), "cuda:10.0", "auto", DpEp("deepep_v2")).value();
  EXPECT_EQ(v2.candidates[0].backend, "FLASHINFER_TRTLLM");
}

TEST(PlanTest, EnvOverrides) {
  MoeLayerSpec block = Layer(kBlockW, kBlockA);
  block.routing_method = "Default";
  // absent: DEEPGEMM on SM100; set to 0: removed.
  EXPECT_EQ(Plan(block, "cuda:10.0")->backend, "DEEPGEMM");
  EXPECT_EQ(Plan(block, "cuda:10.0", "auto", {}, EnvVars{{"VLLM_USE_DEEP_GEMM", "0"}})->backend,
            "TRITON");
  EXPECT_EQ(Plan(block, "cuda:10.0", "auto", {}, EnvVars{{"VLLM_MOE_USE_DEEP_GEMM", "0"}})->backend,
            "TRITON");
  // set to 1: forced (on SM90, where auto would pick TRITON).
  MoePlan f =
      Plan(Layer(kBlockW, kBlockA), "cuda:9.0", "auto", {}, EnvVars{{"VLLM_USE_DEEP_GEMM", "1"}})
          .value();
  EXPECT_EQ(f.backend, "DEEPGEMM");
  EXPECT_EQ(Plan(Layer(kBlockW, kBlockA), "cuda:9.0")->backend, "TRITON");
  // forced Marlin.
  EXPECT_EQ(
      Plan(block, "cuda:10.0", "auto", {}, EnvVars{{"VLLM_TEST_FORCE_FP8_MARLIN", "1"}})->backend,
      "MARLIN");
  EXPECT_EQ(
      Plan(block, "cuda:10.0", "auto", {}, EnvVars{{"VLLM_TEST_FORCE_FP8_MARLIN", "0"}})->backend,
      "DEEPGEMM");
  EXPECT_EQ(Plan(Layer("kNvfp4Static", "kNvfp4Dynamic"), "cuda:10.0", "auto", {},
                 EnvVars{{"VLLM_TEST_FORCE_FP8_MARLIN", "true"}})
                ->backend,
            "MARLIN");
  // AITER: set-to-0 drops AITER from the candidates; =1 on CUDA forces it and fails.
  MoePlan drop =
      Plan(Layer(), "rocm:gfx942", "auto", {}, EnvVars{{"VLLM_ROCM_USE_AITER", "0"}}).value();
  EXPECT_EQ(drop.candidates.front().backend, "TRITON");
  MoePlan kept = Plan(Layer(), "rocm:gfx942").value();
  EXPECT_EQ(kept.candidates.front().backend, "AITER");
  EXPECT_EQ(Plan(Layer(), "rocm:gfx942", "auto", {},
                 EnvVars{{"VLLM_ROCM_USE_AITER", "1"}, {"VLLM_ROCM_USE_AITER_MOE", "0"}})
                ->backend,
            "TRITON");
  absl::Status s =
      Plan(Layer(), "cuda:9.0", "auto", {}, EnvVars{{"VLLM_ROCM_USE_AITER", "1"}}).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(),
            "Unquantized MoE backend ROCm AITER does not support the deployment configuration "
            "since kernel does not support current device cuda. AITER MoE is not enabled — set "
            "VLLM_ROCM_USE_AITER=1 and VLLM_ROCM_USE_AITER_MOE=1 to enable it.");
  // VLLM_BATCH_INVARIANT: only TritonExperts.
  MoePlan bi =
      Plan(Layer(), "cuda:10.0", "auto", {}, EnvVars{{"VLLM_BATCH_INVARIANT", "1"}}).value();
  EXPECT_EQ(bi.backend, "TRITON");
  EXPECT_EQ(bi.candidates[0].reason, "kernel does not support batch invariance");
  EXPECT_EQ(Plan(Layer(), "cuda:10.0", "auto", {}, EnvVars{{"VLLM_BATCH_INVARIANT", "0"}})->backend,
            "FLASHINFER_TRTLLM");
}

// --- §1.8: user strings per scheme ---------------------------------------------------------

TEST(UserStringTest, MappingTable) {
  // "" = the scheme's "is not supported" ValueError.
  struct Row {
    const char* user;
    const char* unq;
    const char* fp8;
    const char* mxfp8;
    const char* nvfp4;
    const char* mxfp4;  // first candidate
    const char* int8;
    const char* wna16;
  } rows[] = {
      {"triton", "TRITON", "TRITON", "TRITON_MXFP8", "", "TRITON", "TRITON", ""},
      {"batched_triton", "BATCHED_TRITON", "", "", "", "", "", ""},
      {"deep_gemm", "", "DEEPGEMM", "DEEPGEMM", "", "DEEPGEMM_MXFP4", "", ""},
      {"deep_gemm_mega_moe", "", "", "", "", "", "", ""},
      {"cutlass", "", "VLLM_CUTLASS", "", "VLLM_CUTLASS", "", "", ""},
      {"flashinfer_trtllm", "FLASHINFER_TRTLLM", "FLASHINFER_TRTLLM", "FLASHINFER_TRTLLM",
       "FLASHINFER_TRTLLM", "FLASHINFER_TRTLLM_MXFP4_BF16", "", "FLASHINFER_TRTLLM"},
      {"flashinfer_cutlass", "FLASHINFER_CUTLASS", "FLASHINFER_CUTLASS", "", "FLASHINFER_CUTLASS",
       "FLASHINFER_CUTLASS_MXFP4_BF16", "", ""},
      {"flashinfer_cutedsl", "", "", "", "FLASHINFER_CUTEDSL", "", "", ""},
      {"flashinfer_b12x", "", "", "", "FLASHINFER_B12X", "", "", ""},
      {"marlin", "", "MARLIN", "MARLIN", "MARLIN", "MARLIN", "", "MARLIN"},
      {"humming", "", "HUMMING", "HUMMING", "HUMMING", "HUMMING", "HUMMING", "HUMMING"},
      {"triton_unfused", "", "", "", "", "TRITON_UNFUSED", "", ""},
      {"aiter", "AITER", "AITER", "AITER_MXFP8", "", "AITER_MXFP4_BF16", "", ""},
      {"flydsl", "", "", "", "", "", "", ""},
      {"hpc", "", "HPC", "", "", "", "", ""},
      {"emulation", "EMULATION", "EMULATION", "", "EMULATION", "EMULATION", "EMULATION",
       "EMULATION"},
      {"kplan", "KPLAN", "KPLAN", "", "", "", "", "KPLAN"},
      {"kplan_batched", "KPLAN_BATCHED", "KPLAN_BATCHED", "", "", "", "", ""},
      {"kplan_ep", "KPLAN_EP", "KPLAN_EP", "", "", "", "", ""},
  };
  for (const Row& r : rows) {
    const std::pair<const char*, const char*> per[] = {
        {"unquantized", r.unq}, {"fp8", r.fp8},   {"mxfp8", r.mxfp8}, {"nvfp4", r.nvfp4},
        {"mxfp4", r.mxfp4},     {"int8", r.int8}, {"wna16", r.wna16}};
    for (const auto& [scheme, want] : per) {
      const MoEKernelOracle* o = OracleFor(scheme);
      absl::StatusOr<int> b = o->MapBackend(r.user);
      if (*want == '\0') {
        EXPECT_FALSE(b.ok()) << scheme << " " << r.user;
        if (!b.ok()) {
          EXPECT_EQ(FieldOf(b.status()).value(), "moe_backend");
          EXPECT_THAT(std::string(b.status().message()),
                      HasSubstr(absl::StrCat("moe_backend='", r.user, "' is not supported for ")));
        }
      } else {
        ASSERT_TRUE(b.ok()) << scheme << " " << r.user << ": " << b.status();
        EXPECT_EQ(o->def(*b).name, want) << scheme << " " << r.user;
      }
    }
  }
}

TEST(UserStringTest, ErrorTextsListVllmKeysInDictOrder) {
  struct Case {
    MoeLayerSpec layer;
    const char* user;
    const char* message;
  } cases[] = {
      {Layer(), "deep_gemm",
       "moe_backend='deep_gemm' is not supported for unquantized MoE. Expected one of ['triton', "
       "'batched_triton', 'flashinfer_trtllm', 'flashinfer_cutlass', 'aiter']."},
      {Layer(kBlockW, kBlockA), "flashinfer_cutedsl",
       "moe_backend='flashinfer_cutedsl' is not supported for FP8 MoE. Expected one of ['triton', "
       "'deep_gemm', 'cutlass', 'flashinfer_trtllm', 'flashinfer_cutlass', 'marlin', 'humming', "
       "'aiter', 'hpc']."},
      {Layer("kMxfp8Static", "kMxfp8Dynamic"), "cutlass",
       "moe_backend='cutlass' is not supported for MXFP8 MoE. Expected one of "
       "['flashinfer_trtllm', 'deep_gemm', 'marlin', 'xpu', 'aiter', 'triton', 'humming']."},
      {Layer("kInt8StaticChannelSym", "kInt8DynamicTokenSym"), "marlin",
       "moe_backend='marlin' is not supported for Int8 MoE. Expected one of ['triton', "
       "'humming']."},
      {Layer("kNvfp4Static", "kNvfp4Dynamic"), "triton",
       "moe_backend='triton' is not supported for NvFP4 MoE. Expected one of ['cutlass', "
       "'flashinfer_trtllm', 'flashinfer_cutlass', 'flashinfer_cutedsl', 'flashinfer_b12x', "
       "'marlin', 'humming', 'emulation']."},
      {Layer("kInt4Static32"), "triton",
       "moe_backend='triton' is not supported for WNA16 MoE. Expected one of ['marlin', "
       "'humming', 'flashinfer_trtllm', 'emulation']."},
      {Layer(kBlockW, kBlockA), "cutlass",
       "vLLM CUTLASS FP8 MoE backend is disabled for this configuration."},
      {Layer(kBlockW, kBlockA), "flashinfer_trtllm",
       "FP8 MoE backend FLASHINFER_TRTLLM does not support the deployment configuration since "
       "kernel does not support current device cuda."},
      {Layer(), "flashinfer_trtllm",
       "Unquantized MoE backend FlashInfer TRTLLM does not support the deployment configuration "
       "since kernel does not support current device cuda."},
      // nvfp4.py and int_wna16.py quote the backend's value.
      {Layer("kNvfp4Static", "kNvfp4Dynamic"), "flashinfer_trtllm",
       "NvFp4 MoE backend 'FLASHINFER_TRTLLM' does not support the deployment configuration "
       "since kernel does not support current device cuda."},
      {Layer("kInt4Static32"), "flashinfer_trtllm",
       "WNA16 MoE backend 'FLASHINFER_TRTLLM' does not support the deployment configuration "
       "since kernel does not support current device cuda."},
      {Layer("kMxfp8Static", "kMxfp8Dynamic"), "deep_gemm",
       "No supported MXFP8 expert class for DEEPGEMM: kernel does not support quantization scheme "
       "QuantKey(f8e4m3fn,scale(u8,static,GroupShape(row=1, col=32)),symmetric)x"
       "QuantKey(f8e4m3fn,scale(u8,dynamic,GroupShape(row=1, col=32)),symmetric)"},
  };
  for (const Case& c : cases) {
    absl::Status s = Plan(c.layer, "cuda:9.0", c.user).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.user;
    EXPECT_EQ(s.message(), c.message);
    EXPECT_EQ(FieldOf(s).value_or(""), "moe_backend") << c.user;
  }
}

TEST(UserStringTest, ExplicitRequestsNeverFallBack) {
  MoePlan p = Plan(Layer(), "cuda:9.0", "flashinfer_cutlass").value();
  EXPECT_EQ(p.backend, "FLASHINFER_CUTLASS");
  // humming on an unquantized layer means auto.
  EXPECT_EQ(Plan(Layer(), "cuda:10.0", "humming")->backend, "FLASHINFER_TRTLLM");
  // batched_triton selects the batched format itself.
  MoePlan bt = Plan(Layer(), "cuda:9.0", "batched_triton").value();
  EXPECT_EQ(bt.experts_kernel, "BatchedTritonExperts");
  EXPECT_EQ(bt.prepare_finalize, "BatchedPrepareAndFinalize");
  // MXFP4 activation filter.
  MoeLayerSpec m = Layer("kMxfp4Static", "kMxfp8Dynamic");
  m.activation = "swigluoai";
  MoePlan t = Plan(m, "cuda:10.0", "flashinfer_trtllm").value();
  EXPECT_EQ(t.backend, "FLASHINFER_TRTLLM_MXFP4_MXFP8");
  absl::Status s = Plan(m, "cuda:10.0", "triton").status();
  EXPECT_EQ(s.message(),
            "moe_backend='triton' does not support activation=kMxfp8Dynamic; supported variants: "
            "['TRITON']");
  MoeLayerSpec bf16 = Layer("kMxfp4Static");
  bf16.activation = "swigluoai";
  EXPECT_EQ(Plan(bf16, "cuda:10.0", "flashinfer_trtllm")->backend, "FLASHINFER_TRTLLM_MXFP4_BF16");
  EXPECT_EQ(Plan(bf16, "cuda:9.0", "marlin", DpEp("deepep_low_latency"))->backend,
            "BATCHED_MARLIN");
}

// --- kplan's family ----------------------------------------------------------------------

TEST(KplanTest, EligibleOnlyWithLibrary) {
  MoePlan p = Plan(Layer(), "cuda:9.0+flashinfer,kplan", "kplan").value();
  EXPECT_EQ(p.backend, "KPLAN");
  EXPECT_EQ(p.experts_kernel, "KplanExperts");
  EXPECT_TRUE(p.executable);
  EXPECT_EQ(Plan(Layer(), "cuda:9.0+flashinfer,kplan", "kplan_batched")->experts_kernel,
            "KplanBatchedExperts");
  // Without library `kplan` the name is outside vLLM's map: vLLM's own text.
  absl::Status s = Plan(Layer(), "cuda:9.0", "kplan").status();
  EXPECT_EQ(s.message(),
            "moe_backend='kplan' is not supported for unquantized MoE. Expected one of ['triton', "
            "'batched_triton', 'flashinfer_trtllm', 'flashinfer_cutlass', 'aiter'].");
  // SM80 is below the kplan CUDA family's floor.
  EXPECT_FALSE(Plan(Layer(), "cuda:8.0+kplan", "kplan").ok());
  // fp8 block explicitly.
  MoePlan f = Plan(Layer(kBlockW, kBlockA), "cuda:9.0+kplan", "kplan").value();
  EXPECT_EQ(f.backend, "KPLAN");
  EXPECT_TRUE(f.executable);
}

// A platform that does not list `kplan` knows only vLLM's map: each of
// kplan's names (and emulation where vLLM's map lacks it) is vLLM's "not
// supported ... Expected one of [...]" ValueError, INVALID_ARGUMENT on
// moe_backend, exactly as for any other name outside the scheme's dict.
TEST(KplanTest, FamilyOutsideVllmMapWithoutLibrary) {
  const std::string unq =
      "is not supported for unquantized MoE. Expected one of ['triton', 'batched_triton', "
      "'flashinfer_trtllm', 'flashinfer_cutlass', 'aiter'].";
  const std::string fp8 =
      "is not supported for FP8 MoE. Expected one of ['triton', 'deep_gemm', 'cutlass', "
      "'flashinfer_trtllm', 'flashinfer_cutlass', 'marlin', 'humming', 'aiter', 'hpc'].";
  const std::string int8 = "is not supported for Int8 MoE. Expected one of ['triton', 'humming'].";
  struct Case {
    MoeLayerSpec layer;
    const char* platform;
    const char* user;
    std::string tail;
  } cases[] = {
      {Layer(), "cuda:9.0", "kplan", unq},
      {Layer(), "cuda:10.0+flashinfer", "kplan_batched", unq},
      {Layer(), "cuda:9.0", "kplan_ep", unq},
      {Layer(), "rocm:gfx942", "emulation", unq},
      {Layer(kBlockW, kBlockA), "cuda:9.0", "kplan", fp8},
      {Layer(kBlockW, kBlockA), "cuda:12.0", "kplan_batched", fp8},
      {Layer(kBlockW, kBlockA), "cuda:9.0", "kplan_ep", fp8},
      {Layer("kFp8StaticTensorSym", "kFp8StaticTensorSym"), "cpu", "emulation", fp8},
      {Layer("kInt8StaticChannelSym", "kInt8DynamicTokenSym"), "cuda:9.0", "emulation", int8},
      {Layer("kInt8StaticChannelSym", "kInt8DynamicTokenSym"), "cuda:9.0", "kplan",
       "is not supported for Int8 MoE. Expected one of ['triton', 'humming']."},
  };
  for (const Case& c : cases) {
    absl::Status s = Plan(c.layer, c.platform, c.user).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.user << " " << c.platform;
    EXPECT_EQ(s.message(), absl::StrCat("moe_backend='", c.user, "' ", c.tail));
    EXPECT_EQ(FieldOf(s).value_or(""), "moe_backend") << c.user;
  }
  // emulation where vLLM's own map has it keeps vLLM's meaning, library or not.
  MoePlan nv = Plan(Layer("kNvfp4Static", "kNvfp4Dynamic"), "cuda:9.0", "emulation").value();
  EXPECT_EQ(nv.backend, "EMULATION");
  EXPECT_EQ(nv.experts_kernel, "Nvfp4QuantizationEmulationTritonExperts");
  EXPECT_EQ(Plan(Layer("kInt4Static32"), "cuda:9.0", "emulation")->experts_kernel,
            "WNA16EmulationExperts");
}

// Where the platform lists `kplan` the family is accepted as before.
TEST(KplanTest, FamilyAcceptedWithLibrary) {
  EXPECT_EQ(Plan(Layer(), "cuda:9.0+kplan", "kplan")->experts_kernel, "KplanExperts");
  EXPECT_EQ(Plan(Layer(), "cuda:9.0+kplan", "kplan_batched")->experts_kernel,
            "KplanBatchedExperts");
  EXPECT_EQ(Plan(Layer(), "cuda:9.0+kplan", "kplan_ep", DpEp("passthrough"))->experts_kernel,
            "KplanEpExperts");
  EXPECT_EQ(Plan(Layer(), "rocm:gfx942+kplan", "emulation")->experts_kernel,
            "KplanEmulationExperts");
  MoeLayerSpec tensor = Layer("kFp8StaticTensorSym", "kFp8StaticTensorSym");
  EXPECT_EQ(Plan(tensor, "cpu+kplan", "emulation")->experts_kernel, "KplanEmulationExperts");
  EXPECT_EQ(Plan(Layer(kBlockW, kBlockA), "cuda:9.0+kplan", "kplan_batched")->experts_kernel,
            "KplanBatchedExperts");
  EXPECT_EQ(
      Plan(Layer("kInt8StaticChannelSym", "kInt8DynamicTokenSym"), "cuda:9.0+kplan", "emulation")
          ->experts_kernel,
      "KplanEmulationExperts");
  // Accepted by the map, a kplan class can still reject the layer: that is
  // the "does not support the deployment configuration" text, not the map's.
  absl::Status s = Plan(Layer(), "cuda:8.0+kplan", "kplan").status();
  EXPECT_EQ(s.message(),
            "Unquantized MoE backend kplan does not support the deployment configuration since "
            "kernel does not support current device cuda.");
}

TEST(KplanTest, EmulationAndEp) {
  // fp8 per-tensor on a CPU server: vLLM gives NONE; kplan's emulation takes it.
  MoeLayerSpec t = Layer("kFp8StaticTensorSym", "kFp8StaticTensorSym");
  EXPECT_EQ(Plan(t, "cpu")->backend, "NONE");
  MoePlan e = Plan(t, "cpu+kplan").value();
  EXPECT_EQ(e.backend, "EMULATION");
  EXPECT_EQ(e.experts_kernel, "KplanEmulationExperts");
  EXPECT_TRUE(e.executable);
  EXPECT_EQ(Plan(Layer("kInt8StaticChannelSym"), "rocm:gfx942+kplan")->backend, "EMULATION");
  EXPECT_EQ(Plan(Layer(), "cuda:9.0+kplan", "emulation")->experts_kernel, "KplanEmulationExperts");
  // kplan_ep runs behind the passthrough binding only.
  ParallelConfig pt = DpEp("passthrough");
  MoePlan ep = Plan(Layer(), "cuda:9.0+kplan", "kplan_ep", pt).value();
  EXPECT_EQ(ep.experts_kernel, "KplanEpExperts");
  EXPECT_EQ(ep.prepare_finalize, "KplanEpPrepareAndFinalize");
  EXPECT_EQ(ep.topk_indices_dtype, "int32");
  EXPECT_TRUE(ep.output_is_reduced);
  EXPECT_FALSE(Plan(Layer(), "cuda:9.0+kplan", "kplan_ep").ok());
  EXPECT_THAT(KplanMoeBackends(),
              ::testing::ElementsAre("kplan", "kplan_batched", "kplan_ep", "emulation"));
}

// --- layer field errors --------------------------------------------------------------------

TEST(LayerErrorsTest, FieldPaths) {
  struct Case {
    void (*mutate)(MoeLayerSpec&);
    const char* field;
  } cases[] = {
      {[](MoeLayerSpec& l) { l.num_experts = 0; }, "num_experts"},
      {[](MoeLayerSpec& l) { l.experts_per_token = 65; }, "experts_per_token"},
      {[](MoeLayerSpec& l) { l.hidden_dim = 0; }, "hidden_dim"},
      {[](MoeLayerSpec& l) { l.activation = "swish"; }, "activation"},
      {[](MoeLayerSpec& l) { l.routing_method = "renormalize"; }, "routing_method"},
      {[](MoeLayerSpec& l) { l.weight_quant = "kFp9"; }, "weight_quant"},
      {[](MoeLayerSpec& l) { l.activation_quant = "kFp8Dynamic128Sym"; }, "activation_quant"},
      {[](MoeLayerSpec& l) { l.quant_scheme = "fp6"; }, "quant_scheme"},
      {[](MoeLayerSpec& l) { l.in_dtype = "int8"; }, "in_dtype"},
      {[](MoeLayerSpec& l) { l.weight_bits = 3; }, "weight_bits"},
      {[](MoeLayerSpec& l) { l.num_expert_group = 8; }, "topk_group"},
  };
  for (const Case& c : cases) {
    MoeLayerSpec l = Layer();
    c.mutate(l);
    absl::Status s = Plan(l, "cuda:9.0").status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.field;
    EXPECT_EQ(FieldOf(s).value_or(""), c.field) << s;
  }
  MoeLayerSpec l = Layer();
  l.activation = "swish";
  EXPECT_THAT(std::string(Plan(l, "cuda:9.0").status().message()),
              HasSubstr("Unknown MoE activation: 'swish'"));
  MoeLayerSpec derived = Layer();
  derived.routing_method = "";
  derived.scoring_func = "sigmoid";
  derived.renormalize = true;
  derived.has_e_score_correction_bias = true;
  derived.num_expert_group = 8;
  derived.topk_group = 4;
  EXPECT_EQ(Plan(derived, "cuda:9.0")->routing_method, "DeepSeekV3");
}

// --- the routing-method table -------------------------------------------------------------

TEST(RoutingMethodsTest, OneRowPerMemberAndHowItRoutes) {
  ASSERT_EQ(RoutingMethods().size(), 13u);
  for (const RoutingMethodInfo& m : RoutingMethods()) {
    EXPECT_EQ(RoutingMethodOf(m.type).name, m.name);
    EXPECT_EQ(FindRoutingMethod(m.name), &m);
    EXPECT_EQ(RoutingMethodName(m.type), m.name);
  }
  EXPECT_EQ(FindRoutingMethod("renormalize"), nullptr);  // member names are case-sensitive
  // Each routed row derives back to itself through get_routing_method_type()
  // (DeepSeekV3 needs the bias and groups; Llama4 and Renormalize have their own routers).
  for (const char* name :
       {"Default", "RenormalizeNaive", "Sigmoid", "SigmoidRenorm", "DeepseekV4"}) {
    const RoutingMethodInfo& m = *FindRoutingMethod(name);
    EXPECT_EQ(GetRoutingMethodType(m.scoring, 8, m.renormalize, 0, false), m.type) << name;
  }
  const RoutingMethodInfo& ds = *FindRoutingMethod("DeepSeekV3");
  EXPECT_EQ(GetRoutingMethodType(ds.scoring, 8, ds.renormalize, 8, true), ds.type);
  EXPECT_TRUE(ds.grouped);
  EXPECT_EQ(ds.router, RouterKind::kGroupedTopK);
  EXPECT_EQ(FindRoutingMethod("Renormalize")->router, RouterKind::kTopKThenSoftmax);
  EXPECT_EQ(FindRoutingMethod("Llama4")->router, RouterKind::kLlama4);
  for (const char* name : {"TopK", "MiniMax2", "Unspecified", "Custom", "Simulated"}) {
    EXPECT_EQ(FindRoutingMethod(name)->router, RouterKind::kNone) << name;
  }
}

// --- renderings ------------------------------------------------------------------------------

TEST(RenderTest, ExplainAndCompare) {
  MoeLayerSpec l = Layer(kBlockW, kBlockA);
  MoePlan h = Plan(l, "cuda:12.0").value();
  MoePlan b = Plan(l, "cuda:10.0").value();
  std::string ex = ExplainPlan(b);
  EXPECT_THAT(ex, HasSubstr("experts kernel"));
  EXPECT_THAT(ex, HasSubstr("rejected  kernel does not support current device cuda"));
  EXPECT_THAT(ex, HasSubstr("chosen: FLASHINFER_TRTLLM -> TrtLlmFp8ExpertsMonolithic"));
  std::string cmp = ComparePlans(h, "RTX6000", b, "B200");
  EXPECT_THAT(cmp, HasSubstr("* backend"));
  EXPECT_THAT(cmp, HasSubstr("RTX6000 rejected FLASHINFER_TRTLLM -> TrtLlmFp8ExpertsMonolithic: "
                             "kernel does not support current device cuda"));
  EXPECT_THAT(cmp, HasSubstr("B200 chose FLASHINFER_TRTLLM -> TrtLlmFp8ExpertsMonolithic before "
                             "trying DEEPGEMM"));
  EXPECT_THAT(ComparePlans(h, "a", h, "b"), HasSubstr("no differences"));
}

}  // namespace
}  // namespace kplan
