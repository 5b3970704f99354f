#include "server/oracle/experts.h"

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
constexpr ActivationSet kNoMul4 = Act(A::kSiluNoMul) | Act(A::kGeluNoMul) |
                                  Act(A::kGeluTanhNoMul) | Act(A::kRelu2NoMul);
// TritonExperts / MarlinExperts: the ten activations fused_moe's triton path applies.
constexpr ActivationSet kTritonActs = Act(A::kSilu) | Act(A::kGelu) | Act(A::kGeluTanh) |
                                      Act(A::kSwigluoai) | Act(A::kSwigluoaiUninterleave) |
                                      Act(A::kSwiglustep) | kNoMul4;
constexpr ActivationSet kBatchedTritonActs =
    kTritonActs & ~(Act(A::kSwigluoaiUninterleave) | Act(A::kSwiglustep));
constexpr ActivationSet kDeepGemmActs =
    Act(A::kSilu) | Act(A::kSwiglustep) | Act(A::kSwigluoaiUninterleave);
constexpr ActivationSet kXpuActs = Act(A::kSilu) | Act(A::kGelu) | Act(A::kGeluTanh) |
                                   Act(A::kSwigluoai) | Act(A::kRelu2NoMul);
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
bool RocmGfx9(const Platform& p) {
  return p.is_rocm() && (absl::StartsWith(p.gcn_arch_name, "gfx9") ||
                         (p.gcn_arch_name.empty() && p.capability && p.capability->major == 9));
}
bool RocmGfx1x(const Platform& p) {
  return p.is_rocm() && (absl::StartsWith(p.gcn_arch_name, "gfx1") ||
                         (p.gcn_arch_name.empty() && p.capability && p.capability->major >= 10));
}
// triton_kernels' OAI MXFP4 kernels: CUDA 9.0 <= cc < 11.0, ROCm gfx9/gfx1x.
bool OaiTritonDevice(const Ctx& c) {
  const Platform& p = c.platform;
  bool dev = (Cuda(c) && p.HasDeviceCapability(90) && !p.HasDeviceCapability(110)) ||
             RocmGfx9(p) || RocmGfx1x(p);
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
  return IsDeepGemmSupported(c) && (c.platform.IsDeviceCapabilityFamily(100) ||
                                    c.platform.IsDeviceCapabilityFamily(120));
}
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
  bool fp8 = RocmGfx9(c.platform) || (c.platform.is_cuda() && c.platform.HasDeviceCapability(89));
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
bool B12xQuant(const Ctx&, Q w, Q a) { return Nvfp4(w, a) || (w == Q::kNvfp4Static && a == Q::kNone); }
// Marlin dequantises weights in the kernel: only the weight key matters.
bool MarlinQuant(const Ctx&, Q w, Q) {
  switch (w) {
    case Q::kFp8Static128BlockSym: case Q::kFp8StaticChannelSym: case Q::kFp8StaticTensorSym:
    case Q::kMxfp4Static: case Q::kMxfp8Static: case Q::kNvfp4Static: case Q::kInt4Static:
    case Q::kInt8Static: case Q::kInt4Static32: case Q::kInt4StaticAsym: case Q::kInt4Static32Asym:
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
bool XpuQuant(const Ctx&, Q w, Q a) {
  return Unquantized(w, a) ||
         (w == Q::kFp8StaticTensorSym && (a == Q::kNone || a == Q::kFp8DynamicTensorSym ||
                                          a == Q::kFp8StaticTensorSym));
}
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
bool KplanQuant(const Ctx&, Q w, Q a) {
  const bool tensor_or_channel = w == Q::kFp8StaticTensorSym || w == Q::kFp8StaticChannelSym;
  const bool token_or_tensor =
      a == Q::kFp8DynamicTokenSym || a == Q::kFp8StaticTensorSym || a == Q::kFp8DynamicTensorSym;
  return Unquantized(w, a) || Block128(w, a) || (tensor_or_channel && token_or_tensor);
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

constexpr ActivationFormat S = ActivationFormat::kStandard;
constexpr ActivationFormat B = ActivationFormat::kBatchedExperts;

// The capability matrix. Columns: name, device, non-gated, activations,
// (W,A) schemes, parallel, routing, logits, shape, format, monolithic, LoRA,
// batch-invariant, precheck, reason suffix, kplan-executable.
const ExpertsClass kExperts[] = {
    // fused_moe/fused_moe.py TritonExperts: the general fallback (LoRA and batch-invariant).
    {"TritonExperts", TritonDevice, true, kTritonActs, TritonQuant, NotFiNvl, nullptr, nullptr,
     nullptr, S, false, true, true, nullptr, nullptr, false},
    // fused_batched_moe.py BatchedTritonExperts.
    {"BatchedTritonExperts", CudaAlike, true, kBatchedTritonActs, BatchedTritonQuant, nullptr,
     nullptr, nullptr, nullptr, B, false, false, false, nullptr, nullptr, false},
    // FlashInfer TRT-LLM BF16 MoE (SM100 family).
    {"TrtLlmBf16ExpertsMonolithic", CudaFam100Fi, true, Act(A::kSilu) | Act(A::kRelu2NoMul),
     UnquantOnly, NoA2aOrAgRsNoEplb, TrtLlmBf16Routing, nullptr, nullptr, S, true, false, false,
     nullptr, nullptr, false},
    {"TrtLlmBf16ExpertsModular", CudaFam100Fi, true, Act(A::kSilu) | Act(A::kRelu2NoMul),
     UnquantOnly, TrtLlmBf16ModularParallel, nullptr, nullptr, nullptr, S, false, false, false,
     nullptr, nullptr, false},
    // FlashInfer CUTLASS fused MoE.
    {"FlashInferExperts", FiCutlassDevice, true,
     Act(A::kSilu) | Act(A::kGeluTanh) | Act(A::kRelu2NoMul) | Act(A::kSwigluoai), FiCutlassQuant,
     nullptr, nullptr, nullptr, nullptr, S, false, false, false, nullptr, nullptr, false},
    // FlashInfer TRT-LLM FP8 (block, per-tensor, MXFP8).
    {"TrtLlmFp8ExpertsMonolithic", CudaFam100Fi, true,
     Act(A::kSilu) | Act(A::kSwigluoaiUninterleave) | Act(A::kRelu2NoMul), TrtLlmFp8MonoQuant,
     TrtLlmFp8MonoParallel, TrtLlmFp8Routing, Bf16OrFp32Logits, nullptr, S, true, false, false,
     nullptr, nullptr, false},
    {"TrtLlmFp8ExpertsModular", CudaFam100Fi, true,
     Act(A::kSilu) | Act(A::kSwigluoaiUninterleave) | Act(A::kRelu2NoMul), TrtLlmFp8ModularQuant,
     TrtLlmFp8ModularParallel, nullptr, nullptr, nullptr, S, false, false, false, nullptr, nullptr,
     false},
    // DeepGEMM grouped GEMMs.
    {"DeepGemmExperts", IsDeepGemmSupported, false, kDeepGemmActs, DeepGemmQuant, NotFiNvl,
     nullptr, nullptr, nullptr, S, false, false, false, nullptr, nullptr, false},
    // FallbackExperts(DeepGemmExperts, TritonExperts): every _supports_* AND-combined.
    {"TritonOrDeepGemmExperts", [](const Ctx& c) { return IsDeepGemmSupported(c) && TritonDevice(c); },
     false, kDeepGemmActs & kTritonActs, Block128Quant, NotFiNvl, nullptr, nullptr, nullptr, S,
     false, false, false, nullptr, nullptr, false},
    {"BatchedDeepGemmExperts", IsDeepGemmSupported, false, Act(A::kSilu), Block128Quant, nullptr,
     nullptr, nullptr, nullptr, B, false, false, false, nullptr, nullptr, false},
    {"DeepGemmFP4Experts", DeepGemmFp4Device, false, Act(A::kSilu) | Act(A::kSwiglustep),
     DeepGemmFp4Quant, NotFiNvl, nullptr, nullptr, nullptr, S, false, false, false, nullptr, nullptr,
     false},
    // vLLM CUTLASS fp8 grouped GEMM, wrapped with the Triton fallback.
    {"TritonOrCutlassExperts", [](const Ctx& c) { return CutlassGroupGemm(c) && TritonDevice(c); },
     false, kCutlassFp8Acts & kTritonActs, CutlassFp8Quant, CutlassFp8Parallel, nullptr, nullptr,
     nullptr, S, false, false, false, nullptr, nullptr, false},
    {"CutlassBatchedExpertsFp8", CutlassGroupGemm, false, kCutlassFp8Acts, CutlassFp8Quant,
     nullptr, nullptr, nullptr, nullptr, B, false, false, false, nullptr, nullptr, false},
    // vLLM CUTLASS NVFP4 (SM100/110/120 families).
    {"CutlassExpertsFp4",
     [](const Ctx& c) {
       const Platform& p = c.platform;
       return Cuda(c) && (p.IsDeviceCapabilityFamily(100) || p.IsDeviceCapabilityFamily(110) ||
                          p.IsDeviceCapabilityFamily(120));
     },
     true,
     Act(A::kSilu) | Act(A::kGelu) | Act(A::kGeluTanh) | Act(A::kSwigluoai) | Act(A::kSwiglustep) |
         kNoMul4,
     Nvfp4Quant, EpSizeOne, nullptr, nullptr, nullptr, S, false, false, false, nullptr, nullptr,
     false},
    // W4A8 CUTLASS (int4 weights x fp8 per-token activations).
    {"CutlassExpertsW4A8Fp8", CutlassGroupGemm, false,
     Act(A::kSilu) | Act(A::kGelu) | Act(A::kSwigluoai), W4A8Fp8Quant, nullptr, nullptr, nullptr,
     nullptr, S, false, false, false, W4A8Precheck, nullptr, false},
    // Marlin weight-only kernels (activation key ignored).
    {"MarlinExperts", MarlinDevice, true, kTritonActs, MarlinQuant, NotFiNvl, nullptr, nullptr,
     nullptr, S, false, false, false, nullptr, nullptr, false},
    {"BatchedMarlinExperts", MarlinDevice, true, kTritonActs, MarlinQuant, NotFiNvl, nullptr,
     nullptr, nullptr, B, false, false, false, nullptr, nullptr, false},
    // Humming mixed-precision kernels (CUDA, package `humming`).
    {"BatchedHummingGroupedExperts", HummingDevice, true, kTritonActs, HummingQuant, nullptr,
     nullptr, nullptr, nullptr, B, false, false, false, nullptr, nullptr, false},
    {"HummingGroupedExperts", HummingDevice, true, kTritonActs, HummingQuant, nullptr, nullptr,
     nullptr, nullptr, S, false, false, false, nullptr, nullptr, false},
    {"HummingIndexedExperts", HummingDevice, true, kTritonActs, HummingQuant, nullptr, nullptr,
     nullptr, nullptr, S, false, false, false, nullptr, nullptr, false},
    // ROCm AITER fused MoE.
    {"AiterExperts", AiterDevice, false,
     Act(A::kSilu) | Act(A::kGelu) | Act(A::kSwigluoai) | Act(A::kSwigluoaiUninterleave),
     AiterQuant, NotFiNvl, nullptr, nullptr, nullptr, S, false, false, false, nullptr, AiterSuffix,
     false},
    // ROCm AITER/FlyDSL MXFP8 (gfx950 + flydsl).
    {"AiterMxfp8Experts",
     [](const Ctx& c) {
       return c.platform.is_rocm() && c.platform.gcn_arch_name == "gfx950" &&
              c.platform.HasLibrary("flydsl");
     },
     false, Act(A::kSilu), AiterMxfp8Quant, NotFiNvl, nullptr, nullptr, nullptr, S, false, false,
     false, nullptr, nullptr, false},
    // MXFP8 Triton: native on gfx950 (supports_mx), else emulated.
    {"Mxfp8NativeTritonExperts", [](const Ctx& c) { return RocmSupportsMx(c.platform); }, false,
     kTritonActs, Mxfp8Any, NotFiNvl, nullptr, nullptr, nullptr, S, false, false, false, nullptr,
     nullptr, false},
    {"Mxfp8EmulationTritonExperts", CudaAlike, false, kTritonActs, Mxfp8Any, NotFiNvl, nullptr,
     nullptr, nullptr, S, false, false, false, nullptr, nullptr, false},
    // FlashInfer TRT-LLM NVFP4.
    {"TrtLlmNvFp4ExpertsMonolithic", CudaFam100Fi, true,
     Act(A::kSilu) | Act(A::kRelu2NoMul) | Act(A::kGelu) | Act(A::kGeluTanh) |
         Act(A::kSwigluoaiUninterleave),
     Nvfp4Quant, NoA2aNoEplb, TrtLlmNvfp4Routing, Bf16OrFp32Logits, nullptr, S, true, false, false,
     nullptr, nullptr, false},
    {"TrtLlmNvFp4ExpertsModular", CudaFam100Fi, true,
     Act(A::kSilu) | Act(A::kRelu2NoMul) | Act(A::kGelu) | Act(A::kGeluTanh) |
         Act(A::kSwigluoaiUninterleave),
     Nvfp4Quant, nullptr, nullptr, nullptr, nullptr, S, false, false, false, nullptr, nullptr, false},
    // FlashInfer CuTeDSL NVFP4 (standard and masked batched).
    {"FlashInferCuteDSLExperts", CudaFam100Fi, false, Act(A::kSilu), Nvfp4Quant, nullptr, nullptr,
     nullptr, nullptr, S, false, false, false, nullptr, nullptr, false},
    {"FlashInferCuteDSLBatchedExperts", CudaFam100Fi, false, Act(A::kSilu), Nvfp4Quant, nullptr,
     nullptr, nullptr, nullptr, B, false, false, false, nullptr, nullptr, false},
    // FlashInfer b12x (SM120 family), opt-in only.
    {"FlashInferB12xExperts", CudaFam120Fi, true, Act(A::kSilu) | Act(A::kRelu2NoMul), B12xQuant,
     NoEp, nullptr, nullptr, nullptr, S, false, false, false, nullptr, nullptr, false},
    // FlashInfer TRT-LLM MXFP4 (gpt-oss).
    {"TrtLlmMxfp4ExpertsMonolithic", CudaFam100Fi, false, Act(A::kSwigluoai) | Act(A::kSilu),
     TrtLlmMxfp4Quant, NoA2aNoEplbDp1, RenormalizeOnly, nullptr, nullptr, S, true, false, false,
     nullptr, nullptr, false},
    {"TrtLlmMxfp4ExpertsModular", CudaFam100Fi, false, Act(A::kSwigluoai) | Act(A::kSilu),
     TrtLlmMxfp4Quant, nullptr, nullptr, nullptr, nullptr, S, false, false, false, nullptr, nullptr,
     false},
    // triton_kernels OAI MXFP4 (W4A16).
    {"OAITritonMxfp4ExpertsMonolithic", OaiTritonDevice, false, Act(A::kSwigluoai), Mxfp4W4A16,
     NoA2aNoEplbDp1, RenormalizeOnly, nullptr, nullptr, S, true, false, false, nullptr, nullptr,
     false},
    {"OAITritonExperts", OaiTritonDevice, false, Act(A::kSwigluoai), Mxfp4W4A16, nullptr, nullptr,
     nullptr, nullptr, S, false, false, false, nullptr, nullptr, false},
    {"UnfusedOAITritonExperts", OaiTritonDevice, false,
     Act(A::kSilu) | Act(A::kGelu) | Act(A::kSwigluoai) | Act(A::kSwiglustep) |
         Act(A::kSwigluoaiUninterleave),
     Mxfp4W4A16, nullptr, nullptr, nullptr, nullptr, S, false, false, false, nullptr, nullptr,
     false},
    // XPU kernels (vllm_xpu_kernels): one class per scheme family.
    {"XPUExperts", Xpu, true, kXpuActs, XpuQuant, nullptr, nullptr, nullptr, nullptr, S, false,
     false, false, nullptr, nullptr, false},
    {"XPUExpertsFp8", Xpu, true, kXpuActs, XpuQuant, nullptr, nullptr, nullptr, nullptr, S, false,
     false, false, nullptr, nullptr, false},
    {"XPUExpertsMxFp8", Xpu, true, kXpuActs, XpuMxfp8Quant, nullptr, nullptr, nullptr, nullptr, S,
     false, false, false, nullptr, nullptr, false},
    {"XPUExpertsBlockFp8", Xpu, true, kXpuActs, XpuBlockFp8Quant, nullptr, nullptr, nullptr,
     nullptr, S, false, false, false, nullptr, nullptr, false},
    {"XPUExpertsMxFp4", Xpu, true, kXpuActs, Mxfp4Any, nullptr, nullptr, nullptr, nullptr, S,
     false, false, false, nullptr, nullptr, false},
    {"XPUExpertsWNA16", Xpu, true, kXpuActs, XpuWna16Quant, nullptr, nullptr, nullptr, nullptr, S,
     false, false, false, nullptr, nullptr, false},
    // CPU kernels.
    {"CPUExpertsFp8", Cpu, false, Act(A::kSilu), Block128Quant, nullptr, CpuFp8Routing, nullptr,
     nullptr, S, true, false, false, nullptr, nullptr, false},
    {"CPUExpertsInt8", Cpu, false, Act(A::kSilu), Int8Quant, nullptr, nullptr, nullptr, nullptr, S,
     false, false, false, nullptr, nullptr, false},
    {"CPUExpertsWNA16", Cpu, false, Act(A::kSilu), Wna16Quant, nullptr, nullptr, nullptr, nullptr,
     S, false, false, false, nullptr, nullptr, false},
    {"CPUExpertsMxfp4", Cpu, false, Act(A::kSilu) | Act(A::kSwigluoai), Mxfp4Any, nullptr, nullptr,
     nullptr, nullptr, S, false, false, false, nullptr, nullptr, false},
    {"CPUExpertsW4A8Int8", Cpu, false, Act(A::kSilu), W4A8Int8Quant, nullptr, nullptr, nullptr,
     nullptr, S, false, false, false, nullptr, nullptr, false},
    // HPC fp8 kernels (SM90 / SM100 family, package `hpc`).
    {"HPCExperts", HpcDevice, false, Act(A::kSilu), HpcQuant, nullptr, nullptr, nullptr, Hidden128,
     S, false, false, false, nullptr, nullptr, false},
    // FlashInfer TRT-LLM MXINT4 (WNA16 int4 group-32).
    {"TrtLlmMxint4ExpertsMonolithic", CudaFam100Fi, false, Act(A::kSilu) | Act(A::kSwigluoai),
     Int4G32Only, NoA2aOrAgRsNoEplb, TrtLlmMxint4Routing, Mxint4Logits, nullptr, S, true, false,
     false, nullptr, nullptr, false},
    // Emulation experts of the schemes whose oracles list EMULATION (dequantise
    // weights, QDQ activations, BF16 GEMMs): vLLM runs them on CUDA-alike devices.
    {"Nvfp4EmulationExperts", CudaAlike, true, kTritonActs, Nvfp4Any, nullptr, nullptr, nullptr,
     nullptr, S, false, false, false, nullptr, nullptr, false},
    {"Mxfp4EmulationExperts", CudaAlike, true, kTritonActs, Mxfp4Any, nullptr, nullptr, nullptr,
     nullptr, S, false, false, false, nullptr, nullptr, false},
    {"Mxfp8EmulationExperts", CudaAlike, true, kTritonActs, Mxfp8Any, nullptr, nullptr, nullptr,
     nullptr, S, false, false, false, nullptr, nullptr, false},
    {"WNA16EmulationExperts", CudaAlike, true, kTritonActs, Wna16Quant, nullptr, nullptr, nullptr,
     nullptr, S, false, false, false, nullptr, nullptr, false},

    // ---- kplan's own executable family (DESIGN.md "Vocabulary"); vLLM
    // platforms never list library `kplan`, so these rows never change a
    // vLLM resolution. The CUDA kernels apply every activation of the CPU
    // reference (kernels/cpu/moe), so every row takes them all.
    {"KplanExperts", KplanCudaDevice, true, kAllActs, KplanQuant, NoPassthrough, nullptr,
     nullptr, nullptr, S, false, false, true, KplanPrecheck, nullptr, true},
    {"KplanBatchedExperts", KplanCudaDevice, true, kAllActs, KplanQuant, NoPassthrough, nullptr,
     nullptr, nullptr, B, false, false, true, KplanPrecheck, nullptr, true},
    // dispatches and combines itself: only behind the passthrough all2all binding.
    {"KplanEpExperts", KplanCudaDevice, true, kAllActs, KplanQuant, Passthrough, nullptr,
     nullptr, nullptr, S, false, false, true, KplanPrecheck, nullptr, true},
    // dequantise + plain GEMMs, CPU reference or GPU: any scheme, any activation.
    {"KplanEmulationExperts", KplanAnywhere, true, kAllActs, AnyQuant, NoPassthrough, nullptr,
     nullptr, nullptr, S, false, false, true, nullptr, nullptr, true},
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

const ExpertsClass* FindExpertsClass(absl::string_view name) {
  for (const ExpertsClass& e : kExperts) {
    if (e.name == name) return &e;
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
