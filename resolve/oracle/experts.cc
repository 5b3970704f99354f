#include "resolve/oracle/experts.h"

#include <array>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace kplan {
namespace {

using A = MoEActivation;
using Q = QuantKey;
using R = RoutingMethodType;
using PC = FusedMoEParallelConfig;
using Ctx = SelectionContext;

// --- activation sets ----------------------------------------------------------
constexpr ActivationSet kNoMul4 =
    Act(A::kSiluNoMul) | Act(A::kGeluNoMul) | Act(A::kGeluTanhNoMul) | Act(A::kRelu2NoMul);
// TritonExperts / MarlinExperts: the ten activations fused_moe's triton path applies.
constexpr ActivationSet kTritonActs = Act(A::kSilu) | Act(A::kGelu) | Act(A::kGeluTanh) |
                                      Act(A::kSwigluoai) | Act(A::kSwigluoaiUninterleave) |
                                      Act(A::kSwiglustep) | kNoMul4;
constexpr ActivationSet kBatchedTritonActs =
    kTritonActs & ~(Act(A::kSwigluoaiUninterleave) | Act(A::kSwiglustep));
constexpr ActivationSet kDeepGemmActs =
    Act(A::kSilu) | Act(A::kSwiglustep) | Act(A::kSwigluoaiUninterleave);
constexpr ActivationSet kXpuActs =
    Act(A::kSilu) | Act(A::kGelu) | Act(A::kGeluTanh) | Act(A::kSwigluoai) | Act(A::kRelu2NoMul);
constexpr ActivationSet kCutlassFp8Acts =
    Act(A::kSilu) | Act(A::kGelu) | Act(A::kGeluTanh) | Act(A::kSwigluoai);
constexpr ActivationSet kAllActs = (1u << kNumMoEActivations) - 1;

// --- device predicates ----------------------------------------------------------
bool CudaAlike(const Ctx& c) { return c.platform.is_cuda_alike(); }
bool TritonDevice(const Ctx& c) { return c.platform.is_cuda_alike() || c.platform.is_xpu(); }
bool Cuda(const Ctx& c) { return c.platform.is_cuda(); }
bool Flashinfer(const Ctx& c) { return c.platform.HasLibrary("flashinfer"); }
bool CudaFam100Fi(const Ctx& c) {
  return Cuda(c) && c.platform.IsDeviceCapabilityFamily(100) && Flashinfer(c);
}
bool CudaFam120Fi(const Ctx& c) {
  return Cuda(c) && c.platform.IsDeviceCapabilityFamily(120) && Flashinfer(c);
}
// FlashInfer CUTLASS MoE: SM90 exactly, SM100 family, SM120 family (SM110 excluded).
bool FiCutlassDevice(const Ctx& c) {
  const Platform& p = c.platform;
  return Cuda(c) && Flashinfer(c) &&
         (p.IsDeviceCapability(90) || p.IsDeviceCapabilityFamily(100) ||
          p.IsDeviceCapabilityFamily(120));
}
// cutlass_group_gemm_supported(): vLLM's grouped CUTLASS fp8 GEMM (SM90+).
bool CutlassGroupGemm(const Ctx& c) { return Cuda(c) && c.platform.HasDeviceCapability(90); }
bool MarlinDevice(const Ctx& c) { return Cuda(c) && c.platform.HasDeviceCapability(75); }
bool AiterDevice(const Ctx& c) { return RocmAiterMoeEnabled(c.platform, c.env); }
// triton_kernels' OAI MXFP4 kernels: CUDA 9.0 <= cc < 11.0, ROCm gfx9/gfx1x.
bool OaiTritonDevice(const Ctx& c) {
  const Platform& p = c.platform;
  bool dev = (Cuda(c) && p.HasDeviceCapability(90) && !p.HasDeviceCapability(110)) || p.on_gfx9() ||
             p.on_gfx1x();
  return dev && p.HasLibrary("triton_kernels");
}
bool HummingDevice(const Ctx& c) {
  return Cuda(c) && c.platform.HasDeviceCapability(80) && c.platform.HasLibrary("humming");
}
bool HpcDevice(const Ctx& c) {
  const Platform& p = c.platform;
  return Cuda(c) && p.HasLibrary("hpc") &&
         (p.IsDeviceCapability(90) || p.IsDeviceCapabilityFamily(100));
}
bool Xpu(const Ctx& c) { return c.platform.is_xpu(); }
bool Cpu(const Ctx& c) { return c.platform.is_cpu(); }
bool DeepGemmFp4Device(const Ctx& c) {
  return IsDeepGemmSupported(c) &&
         (c.platform.IsDeviceCapabilityFamily(100) || c.platform.IsDeviceCapabilityFamily(120));
}
// FallbackExperts(DeepGemmExperts, TritonExperts) / (CutlassExpertsFp8,
// TritonExperts): both classes' device checks AND-combined.
bool TritonOrDeepGemmDevice(const Ctx& c) { return IsDeepGemmSupported(c) && TritonDevice(c); }
bool TritonOrCutlassDevice(const Ctx& c) { return CutlassGroupGemm(c) && TritonDevice(c); }
// vLLM CUTLASS NVFP4: SM100, SM110 and SM120 families.
bool CutlassFp4Device(const Ctx& c) {
  const Platform& p = c.platform;
  return Cuda(c) && (p.IsDeviceCapabilityFamily(100) || p.IsDeviceCapabilityFamily(110) ||
                     p.IsDeviceCapabilityFamily(120));
}
// AITER/FlyDSL MXFP8: gfx950 with flydsl.
bool AiterMxfp8Device(const Ctx& c) {
  return c.platform.is_rocm() && c.platform.gcn_arch_name == "gfx950" &&
         c.platform.HasLibrary("flydsl");
}
// supports_mx() (gfx950): native MXFP8 Triton.
bool Mxfp8NativeDevice(const Ctx& c) { return RocmSupportsMx(c.platform); }
// kplan's own CUDA kernels: the platform lists library `kplan` and is SM90+.
bool KplanCudaDevice(const Ctx& c) {
  return Cuda(c) && c.platform.HasDeviceCapability(90) && c.platform.HasLibrary("kplan");
}
// kplan's emulation (dequantise, plain GEMMs; CPU reference or GPU): wherever
// the kplan server runs, which is what library `kplan` on a platform means.
bool KplanAnywhere(const Ctx& c) { return c.platform.HasLibrary("kplan"); }

// --- quant scheme predicates --------------------------------------------------------
bool Unquantized(Q w, Q a) { return w == Q::kNone && a == Q::kNone; }
bool Block128(Q w, Q a) { return w == Q::kFp8Static128BlockSym && a == Q::kFp8Dynamic128Sym; }
bool ChanToken(Q w, Q a) { return w == Q::kFp8StaticChannelSym && a == Q::kFp8DynamicTokenSym; }
bool TensorToken(Q w, Q a) { return w == Q::kFp8StaticTensorSym && a == Q::kFp8DynamicTokenSym; }
bool TensorStatic(Q w, Q a) { return w == Q::kFp8StaticTensorSym && a == Q::kFp8StaticTensorSym; }
bool TensorDynamic(Q w, Q a) { return w == Q::kFp8StaticTensorSym && a == Q::kFp8DynamicTensorSym; }
bool Mxfp8(Q w, Q a) { return w == Q::kMxfp8Static && a == Q::kMxfp8Dynamic; }
bool Nvfp4(Q w, Q a) { return w == Q::kNvfp4Static && a == Q::kNvfp4Dynamic; }
bool Int8W8A8(Q w, Q a) { return w == Q::kInt8StaticChannelSym && a == Q::kInt8DynamicTokenSym; }
bool Fp8Set(Q w, Q a) {
  return Block128(w, a) || ChanToken(w, a) || TensorToken(w, a) || TensorStatic(w, a) ||
         TensorDynamic(w, a);
}
bool IsWna16Weight(Q w) {
  return w == Q::kInt4Static || w == Q::kInt4Static32 || w == Q::kInt4StaticAsym ||
         w == Q::kInt4Static32Asym || w == Q::kInt8Static;
}
bool IsW4A8Weight(Q w) {
  return w == Q::kInt4W4A8StaticGroup128Sym || w == Q::kInt4W4A8StaticGroup64Sym ||
         w == Q::kInt4W4A8StaticGroup32Sym || w == Q::kInt4W4A8StaticChannelSym;
}

bool TritonQuant(const Ctx& c, Q w, Q a) {
  if (Unquantized(w, a)) return true;
  if (Int8W8A8(w, a)) return c.platform.is_cuda() && c.platform.HasDeviceCapability(75);
  return SupportsFp8(c.platform) && Fp8Set(w, a);
}
bool BatchedTritonQuant(const Ctx& c, Q w, Q a) {
  if (Unquantized(w, a)) return true;
  bool fp8 = c.platform.on_gfx9() || (c.platform.is_cuda() && c.platform.HasDeviceCapability(89));
  return fp8 && Fp8Set(w, a);
}
bool UnquantOnly(const Ctx&, Q w, Q a) { return Unquantized(w, a); }
bool FiCutlassQuant(const Ctx& c, Q w, Q a) {
  const Platform& p = c.platform;
  if (Unquantized(w, a)) return true;
  if (TensorStatic(w, a)) return p.HasDeviceCapability(90);
  if ((w == Q::kMxfp4Static && a == Q::kNone) || Block128(w, a)) return p.IsDeviceCapability(90);
  if ((w == Q::kMxfp4Static && a == Q::kMxfp8Dynamic) || Nvfp4(w, a)) {
    return p.HasDeviceCapability(100);
  }
  return false;
}
bool TrtLlmFp8MonoQuant(const Ctx&, Q w, Q a) {
  return Block128(w, a) || TensorStatic(w, a) || Mxfp8(w, a);
}
bool TrtLlmFp8ModularQuant(const Ctx&, Q w, Q a) { return Block128(w, a) || Mxfp8(w, a); }
bool DeepGemmQuant(const Ctx& c, Q w, Q a) {
  return Block128(w, a) || (Mxfp8(w, a) && c.platform.IsDeviceCapabilityFamily(100));
}
bool Block128Quant(const Ctx&, Q w, Q a) { return Block128(w, a); }
bool DeepGemmFp4Quant(const Ctx&, Q w, Q a) {
  return w == Q::kMxfp4Static && a == Q::kFp8Dynamic128Sym;
}
bool CutlassFp8Quant(const Ctx&, Q w, Q a) {
  return ChanToken(w, a) || TensorDynamic(w, a) || TensorStatic(w, a);
}
bool Nvfp4Quant(const Ctx&, Q w, Q a) { return Nvfp4(w, a); }
bool B12xQuant(const Ctx&, Q w, Q a) {
  return Nvfp4(w, a) || (w == Q::kNvfp4Static && a == Q::kNone);
}
// Marlin dequantises weights in the kernel: only the weight key matters.
bool MarlinQuant(const Ctx&, Q w, Q) {
  switch (w) {
    case Q::kFp8Static128BlockSym:
    case Q::kFp8StaticChannelSym:
    case Q::kFp8StaticTensorSym:
    case Q::kMxfp4Static:
    case Q::kMxfp8Static:
    case Q::kNvfp4Static:
    case Q::kInt4Static:
    case Q::kInt8Static:
    case Q::kInt4Static32:
    case Q::kInt4StaticAsym:
    case Q::kInt4Static32Asym:
      return true;
    default:
      return false;
  }
}
bool HummingQuant(const Ctx& c, Q w, Q a) {
  return w != Q::kNone && (MarlinQuant(c, w, a) || Int8W8A8(w, a));
}
bool AiterQuant(const Ctx& c, Q w, Q a) {
  if (Unquantized(w, a) || Block128(w, a) || TensorStatic(w, a) || TensorDynamic(w, a) ||
      ChanToken(w, a)) {
    return true;
  }
  if (w == Q::kMxfp4Static && (a == Q::kNone || a == Q::kMxfp4Dynamic)) {
    return c.platform.gcn_arch_name == "gfx950";
  }
  return false;
}
bool AiterMxfp8Quant(const Ctx&, Q w, Q a) { return Mxfp8(w, a); }
bool TrtLlmMxfp4Quant(const Ctx&, Q w, Q a) {
  return w == Q::kMxfp4Static && (a == Q::kNone || a == Q::kMxfp8Dynamic);
}
bool Mxfp4W4A16(const Ctx&, Q w, Q a) { return w == Q::kMxfp4Static && a == Q::kNone; }
// XPUExpertsFp8's SUPPORTED_W_A: fp8 per-tensor weights, activations
// unquantised or dynamic per-tensor (no static activation scale).
bool XpuFp8Quant(const Ctx&, Q w, Q a) {
  return w == Q::kFp8StaticTensorSym && (a == Q::kNone || a == Q::kFp8DynamicTensorSym);
}
bool XpuQuant(const Ctx& c, Q w, Q a) { return Unquantized(w, a) || XpuFp8Quant(c, w, a); }
bool XpuBlockFp8Quant(const Ctx&, Q w, Q a) {
  return w == Q::kFp8Static128BlockSym && (a == Q::kFp8Dynamic128Sym || a == Q::kNone);
}
bool XpuMxfp8Quant(const Ctx&, Q w, Q a) { return Mxfp8(w, a); }
bool XpuWna16Quant(const Ctx&, Q w, Q a) { return IsWna16Weight(w) && a == Q::kNone; }
bool Int4G32Only(const Ctx&, Q w, Q a) { return w == Q::kInt4Static32 && a == Q::kNone; }
bool Wna16Quant(const Ctx&, Q w, Q a) { return IsWna16Weight(w) && a == Q::kNone; }
bool Int8Quant(const Ctx&, Q w, Q a) { return Int8W8A8(w, a); }
bool Mxfp4Any(const Ctx&, Q w, Q) { return w == Q::kMxfp4Static; }
bool Mxfp8Any(const Ctx&, Q w, Q a) { return Mxfp8(w, a); }
bool Nvfp4Any(const Ctx&, Q w, Q) { return w == Q::kNvfp4Static; }
bool W4A8Fp8Quant(const Ctx&, Q w, Q a) { return IsW4A8Weight(w) && a == Q::kFp8DynamicTokenSym; }
bool W4A8Int8Quant(const Ctx&, Q w, Q a) {
  return IsW4A8Weight(w) && (a == Q::kInt8DynamicTokenSym || a == Q::kNone);
}
bool HpcQuant(const Ctx&, Q w, Q a) { return TensorStatic(w, a) || Block128(w, a); }
// kplan's e4m3 tensor-core GEMMs (GpuExperts::Fp8OnTensorCores): per-tensor
// and per-channel weights with activations quantised per token or per tensor
// (static or dynamic), 128 x 128 blocks with 1 x 128 activation groups.
bool KplanFp8Quant(const Ctx&, Q w, Q a) {
  const bool tensor_or_channel = w == Q::kFp8StaticTensorSym || w == Q::kFp8StaticChannelSym;
  const bool token_or_tensor =
      a == Q::kFp8DynamicTokenSym || a == Q::kFp8StaticTensorSym || a == Q::kFp8DynamicTensorSym;
  return Block128(w, a) || (tensor_or_channel && token_or_tensor);
}
bool KplanUnquantized(const Ctx&, Q w, Q a) { return Unquantized(w, a); }
bool KplanQuant(const Ctx& c, Q w, Q a) { return Unquantized(w, a) || KplanFp8Quant(c, w, a); }
// kplan's int8 / int4 group-scaled weights (weight-only, 16-bit activations).
bool KplanIntQuant(const Ctx& c, Q w, Q a) { return Wna16Quant(c, w, a); }
// The quantised decode kernels (kernels/cuda/moe/moe_quant_decode.cu): fp8 and int weights.
bool KplanDecodeQuant(const Ctx& c, Q w, Q a) {
  return KplanFp8Quant(c, w, a) || KplanIntQuant(c, w, a);
}
bool AnyQuant(const Ctx&, Q, Q) { return true; }

// --- parallel predicates ------------------------------------------------------------
bool NotFiNvl(const PC& p) {
  return !p.use_fi_nvl_two_sided_kernels() && !p.use_fi_nvl_one_sided_kernels();
}
bool NoA2aOrAgRsNoEplb(const PC& p) {
  return (!p.use_all2all_kernels() || p.use_ag_rs_all2all_kernels()) && !p.enable_eplb;
}
bool TrtLlmBf16ModularParallel(const PC& p) {
  return p.use_all2all_kernels() && !p.use_ag_rs_all2all_kernels() && !p.use_deepep_ht_kernels() &&
         !p.enable_eplb;
}
bool TrtLlmFp8MonoParallel(const PC& p) {
  return NoA2aOrAgRsNoEplb(p) && !p.is_sequence_parallel();
}
bool TrtLlmFp8ModularParallel(const PC& p) {
  return p.use_all2all_kernels() && !p.use_ag_rs_all2all_kernels() && !p.use_deepep_v2_kernels() &&
         NotFiNvl(p) && !p.enable_eplb;
}
bool CutlassFp8Parallel(const PC& p) { return NotFiNvl(p) && !p.use_deepep_ht_kernels(); }
bool EpSizeOne(const PC& p) { return p.ep_size == 1; }
bool NoEp(const PC& p) { return !p.use_ep; }
bool NoA2aNoEplb(const PC& p) { return !p.use_all2all_kernels() && !p.enable_eplb; }
bool NoA2aNoEplbDp1(const PC& p) { return NoA2aNoEplb(p) && p.dp_size <= 1; }
bool NoPassthrough(const PC& p) { return NotFiNvl(p) && !p.use_passthrough_kernels(); }
bool Passthrough(const PC& p) { return p.use_passthrough_kernels(); }

// --- routing / logits predicates (monolithic classes) -------------------------------
bool In(R r, std::initializer_list<R> set) {
  for (R x : set) {
    if (x == r) return true;
  }
  return false;
}
bool TrtLlmBf16Routing(R r, Q, Q) {
  return In(r, {R::kDeepSeekV3, R::kLlama4, R::kRenormalize, R::kRenormalizeNaive,
                R::kSigmoidRenorm, R::kSigmoid});
}
bool TrtLlmFp8Routing(R r, Q w, Q) {
  if (In(r, {R::kDeepSeekV3, R::kRenormalize, R::kRenormalizeNaive, R::kSigmoidRenorm, R::kSigmoid,
             R::kMiniMax2, R::kSimulated})) {
    return true;
  }
  // per-tensor weights also run Llama4's top-1 sigmoid routing.
  return w == Q::kFp8StaticTensorSym && r == R::kLlama4;
}
bool TrtLlmNvfp4Routing(R r, Q, Q) {
  return In(r, {R::kDeepSeekV3, R::kRenormalize, R::kRenormalizeNaive, R::kLlama4,
                R::kSigmoidRenorm, R::kSigmoid, R::kMiniMax2, R::kSimulated});
}
bool RenormalizeOnly(R r, Q, Q) { return In(r, {R::kRenormalize, R::kRenormalizeNaive}); }
bool TrtLlmMxint4Routing(R r, Q, Q) {
  return In(r, {R::kRenormalize, R::kRenormalizeNaive, R::kDeepSeekV3, R::kLlama4, R::kSimulated});
}
bool CpuFp8Routing(R r, Q, Q) {
  return In(r, {R::kDefault, R::kRenormalize, R::kRenormalizeNaive, R::kDeepSeekV3, R::kTopK,
                R::kSigmoid, R::kSigmoidRenorm, R::kLlama4});
}
bool Bf16OrFp32Logits(absl::string_view d, R) { return d == "bfloat16" || d == "float32"; }
// float32 router logits only for the routings whose kernels read fp32.
bool Mxint4Logits(absl::string_view d, R r) {
  return d != "float32" || In(r, {R::kDeepSeekV3, R::kSimulated});
}

bool Hidden128(int h) { return h % 128 == 0; }

std::string W4A8Precheck(const Ctx& c) {
  if (c.moe.in_dtype != "bfloat16") {
    return absl::StrCat("kernel does not support torch.", c.moe.in_dtype, " input/output dtype");
  }
  return "";
}
// kplan's CUDA kernels: 16-bit activations only (fp32 runs the emulation).
std::string KplanPrecheck(const Ctx& c) {
  if (c.moe.in_dtype != "bfloat16" && c.moe.in_dtype != "float16") {
    return absl::StrCat("kernel does not support torch.", c.moe.in_dtype, " input/output dtype");
  }
  return "";
}
std::string AiterSuffix(const Ctx& c) {
  if (RocmAiterMoeEnabled(c.platform, c.env)) return "";
  return ". AITER MoE is not enabled — set VLLM_ROCM_USE_AITER=1 and VLLM_ROCM_USE_AITER_MOE=1 "
         "to enable it";
}

constexpr ActivationFormat kBatched = ActivationFormat::kBatchedExperts;

// The capability matrix (§1.6), one row per experts class. Each row names its
// columns; a column left out keeps ExpertsClass's default (gated only,
// any parallel config / routing / logits dtype / hidden dim, standard
// format, modular, no LoRA, not batch-invariant, not kplan's).
const ExpertsClass kExperts[] = {
    // fused_moe/fused_moe.py TritonExperts: the general fallback (LoRA and batch-invariant).
    {.name = "TritonExperts",
     .device = TritonDevice,
     .no_act_and_mul = true,
     .activations = kTritonActs,
     .quant = TritonQuant,
     .parallel = NotFiNvl,
     .lora = true,
     .batch_invariant = true},
    // fused_batched_moe.py BatchedTritonExperts.
    {.name = "BatchedTritonExperts",
     .device = CudaAlike,
     .no_act_and_mul = true,
     .activations = kBatchedTritonActs,
     .quant = BatchedTritonQuant,
     .format = kBatched},
    // FlashInfer TRT-LLM BF16 MoE (SM100 family).
    {.name = "TrtLlmBf16ExpertsMonolithic",
     .device = CudaFam100Fi,
     .no_act_and_mul = true,
     .activations = Act(A::kSilu) | Act(A::kRelu2NoMul),
     .quant = UnquantOnly,
     .parallel = NoA2aOrAgRsNoEplb,
     .routing = TrtLlmBf16Routing,
     .monolithic = true},
    {.name = "TrtLlmBf16ExpertsModular",
     .device = CudaFam100Fi,
     .no_act_and_mul = true,
     .activations = Act(A::kSilu) | Act(A::kRelu2NoMul),
     .quant = UnquantOnly,
     .parallel = TrtLlmBf16ModularParallel},
    // FlashInfer CUTLASS fused MoE.
    {.name = "FlashInferExperts",
     .device = FiCutlassDevice,
     .no_act_and_mul = true,
     .activations = Act(A::kSilu) | Act(A::kGeluTanh) | Act(A::kRelu2NoMul) | Act(A::kSwigluoai),
     .quant = FiCutlassQuant},
    // FlashInfer TRT-LLM FP8 (block, per-tensor, MXFP8).
    {.name = "TrtLlmFp8ExpertsMonolithic",
     .device = CudaFam100Fi,
     .no_act_and_mul = true,
     .activations = Act(A::kSilu) | Act(A::kSwigluoaiUninterleave) | Act(A::kRelu2NoMul),
     .quant = TrtLlmFp8MonoQuant,
     .parallel = TrtLlmFp8MonoParallel,
     .routing = TrtLlmFp8Routing,
     .logits = Bf16OrFp32Logits,
     .monolithic = true},
    {.name = "TrtLlmFp8ExpertsModular",
     .device = CudaFam100Fi,
     .no_act_and_mul = true,
     .activations = Act(A::kSilu) | Act(A::kSwigluoaiUninterleave) | Act(A::kRelu2NoMul),
     .quant = TrtLlmFp8ModularQuant,
     .parallel = TrtLlmFp8ModularParallel},
    // DeepGEMM grouped GEMMs.
    {.name = "DeepGemmExperts",
     .device = IsDeepGemmSupported,
     .activations = kDeepGemmActs,
     .quant = DeepGemmQuant,
     .parallel = NotFiNvl},
    // FallbackExperts(DeepGemmExperts, TritonExperts): every _supports_* AND-combined.
    {.name = "TritonOrDeepGemmExperts",
     .device = TritonOrDeepGemmDevice,
     .activations = kDeepGemmActs & kTritonActs,
     .quant = Block128Quant,
     .parallel = NotFiNvl},
    {.name = "BatchedDeepGemmExperts",
     .device = IsDeepGemmSupported,
     .activations = Act(A::kSilu),
     .quant = Block128Quant,
     .format = kBatched},
    {.name = "DeepGemmFP4Experts",
     .device = DeepGemmFp4Device,
     .activations = Act(A::kSilu) | Act(A::kSwiglustep),
     .quant = DeepGemmFp4Quant,
     .parallel = NotFiNvl},
    // vLLM CUTLASS fp8 grouped GEMM, wrapped with the Triton fallback.
    {.name = "TritonOrCutlassExperts",
     .device = TritonOrCutlassDevice,
     .activations = kCutlassFp8Acts & kTritonActs,
     .quant = CutlassFp8Quant,
     .parallel = CutlassFp8Parallel},
    {.name = "CutlassBatchedExpertsFp8",
     .device = CutlassGroupGemm,
     .activations = kCutlassFp8Acts,
     .quant = CutlassFp8Quant,
     .format = kBatched},
    // vLLM CUTLASS NVFP4 (SM100/110/120 families).
    {.name = "CutlassExpertsFp4",
     .device = CutlassFp4Device,
     .no_act_and_mul = true,
     .activations = Act(A::kSilu) | Act(A::kGelu) | Act(A::kGeluTanh) | Act(A::kSwigluoai) |
                    Act(A::kSwiglustep) | kNoMul4,
     .quant = Nvfp4Quant,
     .parallel = EpSizeOne},
    // W4A8 CUTLASS (int4 weights x fp8 per-token activations).
    {.name = "CutlassExpertsW4A8Fp8",
     .device = CutlassGroupGemm,
     .activations = Act(A::kSilu) | Act(A::kGelu) | Act(A::kSwigluoai),
     .quant = W4A8Fp8Quant,
     .precheck = W4A8Precheck},
    // Marlin weight-only kernels (activation key ignored).
    {.name = "MarlinExperts",
     .device = MarlinDevice,
     .no_act_and_mul = true,
     .activations = kTritonActs,
     .quant = MarlinQuant,
     .parallel = NotFiNvl},
    {.name = "BatchedMarlinExperts",
     .device = MarlinDevice,
     .no_act_and_mul = true,
     .activations = kTritonActs,
     .quant = MarlinQuant,
     .parallel = NotFiNvl,
     .format = kBatched},
    // Humming mixed-precision kernels (CUDA, package `humming`).
    {.name = "BatchedHummingGroupedExperts",
     .device = HummingDevice,
     .no_act_and_mul = true,
     .activations = kTritonActs,
     .quant = HummingQuant,
     .format = kBatched},
    {.name = "HummingGroupedExperts",
     .device = HummingDevice,
     .no_act_and_mul = true,
     .activations = kTritonActs,
     .quant = HummingQuant},
    {.name = "HummingIndexedExperts",
     .device = HummingDevice,
     .no_act_and_mul = true,
     .activations = kTritonActs,
     .quant = HummingQuant},
    // ROCm AITER fused MoE.
    {.name = "AiterExperts",
     .device = AiterDevice,
     .activations =
         Act(A::kSilu) | Act(A::kGelu) | Act(A::kSwigluoai) | Act(A::kSwigluoaiUninterleave),
     .quant = AiterQuant,
     .parallel = NotFiNvl,
     .reason_suffix = AiterSuffix},
    // ROCm AITER/FlyDSL MXFP8 (gfx950 + flydsl).
    {.name = "AiterMxfp8Experts",
     .device = AiterMxfp8Device,
     .activations = Act(A::kSilu),
     .quant = AiterMxfp8Quant,
     .parallel = NotFiNvl},
    // MXFP8 Triton: native on gfx950 (supports_mx), else emulated.
    {.name = "Mxfp8NativeTritonExperts",
     .device = Mxfp8NativeDevice,
     .activations = kTritonActs,
     .quant = Mxfp8Any,
     .parallel = NotFiNvl},
    {.name = "Mxfp8EmulationTritonExperts",
     .device = CudaAlike,
     .activations = kTritonActs,
     .quant = Mxfp8Any,
     .parallel = NotFiNvl},
    // FlashInfer TRT-LLM NVFP4.
    {.name = "TrtLlmNvFp4ExpertsMonolithic",
     .device = CudaFam100Fi,
     .no_act_and_mul = true,
     .activations = Act(A::kSilu) | Act(A::kRelu2NoMul) | Act(A::kGelu) | Act(A::kGeluTanh) |
                    Act(A::kSwigluoaiUninterleave),
     .quant = Nvfp4Quant,
     .parallel = NoA2aNoEplb,
     .routing = TrtLlmNvfp4Routing,
     .logits = Bf16OrFp32Logits,
     .monolithic = true},
    {.name = "TrtLlmNvFp4ExpertsModular",
     .device = CudaFam100Fi,
     .no_act_and_mul = true,
     .activations = Act(A::kSilu) | Act(A::kRelu2NoMul) | Act(A::kGelu) | Act(A::kGeluTanh) |
                    Act(A::kSwigluoaiUninterleave),
     .quant = Nvfp4Quant},
    // FlashInfer CuTeDSL NVFP4 (standard and masked batched).
    {.name = "FlashInferCuteDSLExperts",
     .device = CudaFam100Fi,
     .activations = Act(A::kSilu),
     .quant = Nvfp4Quant},
    {.name = "FlashInferCuteDSLBatchedExperts",
     .device = CudaFam100Fi,
     .activations = Act(A::kSilu),
     .quant = Nvfp4Quant,
     .format = kBatched},
    // FlashInfer b12x (SM120 family), opt-in only.
    {.name = "FlashInferB12xExperts",
     .device = CudaFam120Fi,
     .no_act_and_mul = true,
     .activations = Act(A::kSilu) | Act(A::kRelu2NoMul),
     .quant = B12xQuant,
     .parallel = NoEp},
    // FlashInfer TRT-LLM MXFP4 (gpt-oss).
    {.name = "TrtLlmMxfp4ExpertsMonolithic",
     .device = CudaFam100Fi,
     .activations = Act(A::kSwigluoai) | Act(A::kSilu),
     .quant = TrtLlmMxfp4Quant,
     .parallel = NoA2aNoEplbDp1,
     .routing = RenormalizeOnly,
     .monolithic = true},
    {.name = "TrtLlmMxfp4ExpertsModular",
     .device = CudaFam100Fi,
     .activations = Act(A::kSwigluoai) | Act(A::kSilu),
     .quant = TrtLlmMxfp4Quant},
    // triton_kernels OAI MXFP4 (W4A16).
    {.name = "OAITritonMxfp4ExpertsMonolithic",
     .device = OaiTritonDevice,
     .activations = Act(A::kSwigluoai),
     .quant = Mxfp4W4A16,
     .parallel = NoA2aNoEplbDp1,
     .routing = RenormalizeOnly,
     .monolithic = true},
    {.name = "OAITritonExperts",
     .device = OaiTritonDevice,
     .activations = Act(A::kSwigluoai),
     .quant = Mxfp4W4A16},
    {.name = "UnfusedOAITritonExperts",
     .device = OaiTritonDevice,
     .activations = Act(A::kSilu) | Act(A::kGelu) | Act(A::kSwigluoai) | Act(A::kSwiglustep) |
                    Act(A::kSwigluoaiUninterleave),
     .quant = Mxfp4W4A16},
    // XPU kernels (vllm_xpu_kernels): one class per scheme family.
    {.name = "XPUExperts",
     .device = Xpu,
     .no_act_and_mul = true,
     .activations = kXpuActs,
     .quant = XpuQuant},
    {.name = "XPUExpertsFp8",
     .device = Xpu,
     .no_act_and_mul = true,
     .activations = kXpuActs,
     .quant = XpuFp8Quant},
    {.name = "XPUExpertsMxFp8",
     .device = Xpu,
     .no_act_and_mul = true,
     .activations = kXpuActs,
     .quant = XpuMxfp8Quant},
    {.name = "XPUExpertsBlockFp8",
     .device = Xpu,
     .no_act_and_mul = true,
     .activations = kXpuActs,
     .quant = XpuBlockFp8Quant},
    {.name = "XPUExpertsMXFp4",
     .device = Xpu,
     .no_act_and_mul = true,
     .activations = kXpuActs,
     .quant = Mxfp4Any},
    {.name = "XPUExpertsWNA16",
     .device = Xpu,
     .no_act_and_mul = true,
     .activations = kXpuActs,
     .quant = XpuWna16Quant},
    // CPU kernels.
    {.name = "CPUExpertsFp8",
     .device = Cpu,
     .activations = Act(A::kSilu),
     .quant = Block128Quant,
     .routing = CpuFp8Routing,
     .monolithic = true},
    {.name = "CPUExpertsInt8", .device = Cpu, .activations = Act(A::kSilu), .quant = Int8Quant},
    {.name = "CPUExpertsInt4",
     .id = "cpu_moe.CPUExpertsInt4",
     .device = Cpu,
     .activations = Act(A::kSilu),
     .quant = Wna16Quant},
    {.name = "CPUExpertsMxfp4",
     .device = Cpu,
     .activations = Act(A::kSilu) | Act(A::kSwigluoai),
     .quant = Mxfp4Any},
    {.name = "CPUExpertsInt4",
     .id = "cpu_int4_moe.CPUExpertsInt4",
     .device = Cpu,
     .activations = Act(A::kSilu),
     .quant = W4A8Int8Quant,
     .monolithic = true},  // make_w4a8_int8_moe_kernel: monolithic experts only
    // HPC fp8 kernels (SM90 / SM100 family, package `hpc`).
    {.name = "HPCExperts",
     .device = HpcDevice,
     .activations = Act(A::kSilu),
     .quant = HpcQuant,
     .shape = Hidden128},
    // FlashInfer TRT-LLM MXINT4 (WNA16 int4 group-32).
    {.name = "TrtLlmMxint4ExpertsMonolithic",
     .device = CudaFam100Fi,
     .activations = Act(A::kSilu) | Act(A::kSwigluoai),
     .quant = Int4G32Only,
     .parallel = NoA2aOrAgRsNoEplb,
     .routing = TrtLlmMxint4Routing,
     .logits = Mxint4Logits,
     .monolithic = true},
    // Emulation experts of the schemes whose oracles list EMULATION (dequantise
    // weights, QDQ activations, BF16 GEMMs): vLLM runs them on CUDA-alike devices.
    {.name = "Nvfp4QuantizationEmulationTritonExperts",
     .device = CudaAlike,
     .no_act_and_mul = true,
     .activations = kTritonActs,
     .quant = Nvfp4Any},
    {.name = "OCP_MXQuantizationEmulationTritonExperts",
     .device = CudaAlike,
     .no_act_and_mul = true,
     .activations = kTritonActs,
     .quant = Mxfp4Any},
    {.name = "Mxfp8EmulationTritonExperts",
     .device = CudaAlike,
     .no_act_and_mul = true,
     .activations = kTritonActs,
     .quant = Mxfp8Any},
    {.name = "WNA16EmulationExperts",
     .device = CudaAlike,
     .no_act_and_mul = true,
     .activations = kTritonActs,
     .quant = Wna16Quant},

    // ---- kplan's own executable family (ARCHITECTURE.md "Vocabulary"); vLLM
    // platforms never list library `kplan`, so these rows never change a
    // vLLM resolution. The CUDA kernels apply every activation of the CPU
    // reference (kernels/cpu/moe), so every row takes them all. One row per
    // GPU route of server/moe/gpu_layer.cc (which of them runs a call depends
    // on its slots: RunMoE's answer names the one that ran, moe_route.h
    // GpuLayerExpertsKernel).
    // bf16 / fp16 weights: the wgmma grouped GEMMs (and their decode kernels).
    {.name = "KplanExperts",
     .device = KplanCudaDevice,
     .no_act_and_mul = true,
     .activations = kAllActs,
     .quant = KplanUnquantized,
     .parallel = NoPassthrough,
     .batch_invariant = true,
     .precheck = KplanPrecheck,
     .kplan_executable = true},
    // fp8 weights: the e4m3 tensor-core grouped GEMMs (moe_experts.h, the
    // warp-specialised moe_gemm_ws_fp8 at large batches).
    {.name = "KplanFp8Experts",
     .device = KplanCudaDevice,
     .no_act_and_mul = true,
     .activations = kAllActs,
     .quant = KplanFp8Quant,
     .parallel = NoPassthrough,
     .batch_invariant = true,
     .precheck = KplanPrecheck,
     .kplan_executable = true},
    // int8 / int4 weights past decode size: int4 on the int4 GEMMs
    // themselves up to kMoeIntWeightsMaxSlots slots a hit expert
    // (moe_quant_route.h); else, and for int8, the hit experts dequantised
    // once per call, then the bf16 / fp16 grouped GEMMs.
    {.name = "KplanDequantExperts",
     .device = KplanCudaDevice,
     .no_act_and_mul = true,
     .activations = kAllActs,
     .quant = KplanIntQuant,
     .parallel = NoPassthrough,
     .batch_invariant = true,
     .precheck = KplanPrecheck,
     .kplan_executable = true},
    // fp8 / int weights at decode sizes: each hit expert's quantised weights
    // read once for all its slots (not batch-invariant: chosen by slots).
    {.name = "KplanQuantDecodeExperts",
     .device = KplanCudaDevice,
     .no_act_and_mul = true,
     .activations = kAllActs,
     .quant = KplanDecodeQuant,
     .parallel = NoPassthrough,
     .precheck = KplanPrecheck,
     .kplan_executable = true},
    {.name = "KplanBatchedExperts",
     .device = KplanCudaDevice,
     .no_act_and_mul = true,
     .activations = kAllActs,
     .quant = KplanQuant,
     .parallel = NoPassthrough,
     .format = kBatched,
     .batch_invariant = true,
     .precheck = KplanPrecheck,
     .kplan_executable = true},
    // dispatches and combines itself: only behind the passthrough all2all binding.
    {.name = "KplanEpExperts",
     .device = KplanCudaDevice,
     .no_act_and_mul = true,
     .activations = kAllActs,
     .quant = KplanQuant,
     .parallel = Passthrough,
     .batch_invariant = true,
     .precheck = KplanPrecheck,
     .kplan_executable = true},
    // dequantise + plain GEMMs, CPU reference or GPU: any scheme, any activation.
    {.name = "KplanEmulationExperts",
     .device = KplanAnywhere,
     .no_act_and_mul = true,
     .activations = kAllActs,
     .quant = AnyQuant,
     .parallel = NoPassthrough,
     .batch_invariant = true,
     .kplan_executable = true},
};

std::string Fail(absl::string_view what) { return absl::StrCat("kernel does not support ", what); }

}  // namespace

absl::string_view ActivationFormatName(ActivationFormat f) {
  return f == ActivationFormat::kStandard ? "standard" : "batched_experts";
}

bool SupportsFp8(const Platform& p) {
  if (p.is_cuda()) return p.HasDeviceCapability(89);
  if (p.is_rocm()) {
    return absl::StartsWith(p.gcn_arch_name, "gfx94") ||
           absl::StartsWith(p.gcn_arch_name, "gfx95") ||
           absl::StartsWith(p.gcn_arch_name, "gfx12") ||
           (p.gcn_arch_name.empty() && p.HasDeviceCapability(94));
  }
  return p.is_xpu();
}

bool IsDeepGemmSupported(const SelectionContext& c) {
  const Platform& p = c.platform;
  return c.env.Flag("VLLM_USE_DEEP_GEMM", true) && p.is_cuda() && p.HasLibrary("deep_gemm") &&
         (p.IsDeviceCapability(90) || p.IsDeviceCapabilityFamily(100) ||
          p.IsDeviceCapabilityFamily(120));
}

bool RocmSupportsMx(const Platform& p) { return p.is_rocm() && p.gcn_arch_name == "gfx950"; }

const ExpertsClass* FindExpertsClass(absl::string_view id) {
  for (const ExpertsClass& e : kExperts) {
    if ((e.id.empty() ? e.name : e.id) == id) return &e;
  }
  return nullptr;
}

const ExpertsClass* ExpertsClasses(int* count) {
  *count = static_cast<int>(sizeof(kExperts) / sizeof(kExperts[0]));
  return kExperts;
}

SupportVerdict IsSupportedConfig(const ExpertsClass& cls, const SelectionContext& ctx, QuantKey w,
                                 QuantKey a, ActivationFormat format) {
  SupportVerdict v;
  v.ok = false;
  const FusedMoEConfig& moe = ctx.moe;
  if (cls.precheck != nullptr) v.reason = cls.precheck(ctx);
  if (!v.reason.empty()) {
  } else if (!cls.device(ctx)) {
    v.reason = Fail(absl::StrCat("current device ", moe.device));
  } else if (!moe.is_act_and_mul() && !cls.no_act_and_mul) {
    v.reason = Fail("no act_and_mul MLP layer");
  } else if ((cls.activations & Act(moe.activation)) == 0) {
    v.reason = Fail(absl::StrCat(MoEActivationRepr(moe.activation), " activation"));
  } else if (!cls.quant(ctx, w, a)) {
    v.reason = Fail(absl::StrCat("quantization scheme ", QuantKeyStr(w), "x", QuantKeyStr(a)));
  } else if (cls.parallel != nullptr && !cls.parallel(ctx.pc())) {
    v.reason = Fail(absl::StrCat("parallel config ", ctx.pc().Repr()));
  } else if (cls.routing != nullptr && !cls.routing(moe.routing_method, w, a)) {
    // RoutingMethodType is an IntEnum: f"{member}" prints its integer value.
    v.reason = Fail(absl::StrCat("routing method ", static_cast<int>(moe.routing_method)));
  } else if (cls.logits != nullptr && !cls.logits(moe.router_logits_dtype, moe.routing_method)) {
    v.reason = Fail(absl::StrCat("router logits dtype torch.", moe.router_logits_dtype));
  } else if (cls.shape != nullptr && !cls.shape(moe.hidden_dim)) {
    v.reason = Fail(absl::StrCat(moe.hidden_dim, " hidden dim is not supported"));
  } else if (format != cls.format) {
    // FusedMoEActivationFormat values are 1-tuples: ("standard",).
    v.reason = Fail(absl::StrCat("('", ActivationFormatName(format), "',) activation format"));
  } else if (ctx.env.Flag("VLLM_BATCH_INVARIANT", false) && !cls.batch_invariant) {
    v.reason = Fail("batch invariance");
  } else if (moe.is_lora_enabled && !cls.lora) {
    v.reason = Fail("LoRA");
  } else {
    v.ok = true;
    return v;
  }
  if (cls.reason_suffix != nullptr) v.reason += cls.reason_suffix(ctx);
  return v;
}

}  // namespace kplan
