#include "absl/strings/string_view.h"
#include "resolve/plan/kernel_config.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "base/status.h"
#include "resolve/plan/vocabulary.h"

namespace kplan {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::StartsWith;

Platform Cuda() { return ParsePlatformSpec("cuda:9.0").value(); }

TEST(NormalizeKernelConfigTest, LowersAndReplacesDashes) {
  KernelConfig c;
  c.moe_backend = "FlashInfer-TRTLLM";
  c.linear_backend = "Flashinfer-Cutlass";
  c.sparse_indexer_topk_backend = "PER-ROW";
  KernelConfig n = NormalizeKernelConfig(c).value();
  EXPECT_EQ(n.moe_backend, "flashinfer_trtllm");
  EXPECT_EQ(n.linear_backend, "flashinfer_cutlass");
  EXPECT_EQ(n.sparse_indexer_topk_backend, "per_row");
}

TEST(NormalizeKernelConfigTest, UnknownValuesListTheValidOnes) {
  struct Case {
    std::string KernelConfig::*field;
    std::string name;
    const std::vector<absl::string_view>& values;
  };
  for (const Case& cs :
       {Case{&KernelConfig::moe_backend, "moe_backend", MoeBackendValues()},
        Case{&KernelConfig::linear_backend, "linear_backend", LinearBackendValues()},
        Case{&KernelConfig::sparse_indexer_topk_backend, "sparse_indexer_topk_backend",
             SparseIndexerTopkBackendValues()}}) {
    KernelConfig c;
    c.*cs.field = "No-pe";  // the error quotes the normalised value
    absl::Status s = NormalizeKernelConfig(c).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(FieldOf(s).value(), cs.name);
    EXPECT_THAT(std::string(s.message()), StartsWith("Input should be 'auto', "));
    EXPECT_THAT(std::string(s.message()),
                HasSubstr(absl::StrCat(" or '", cs.values.back(),
                                       "' [type=literal_error, "
                                       "input_value='no_pe', input_type=str]")));
  }
}

TEST(NormalizeKernelConfigTest, ReportsTheFirstFieldInDeclarationOrder) {
  KernelConfig c;
  c.linear_backend = "bad";
  c.sparse_indexer_topk_backend = "bad";
  EXPECT_EQ(FieldOf(NormalizeKernelConfig(c).status()).value(), "sparse_indexer_topk_backend");
  c.moe_backend = "bad";
  EXPECT_EQ(FieldOf(NormalizeKernelConfig(c).status()).value(), "moe_backend");
}

TEST(NormalizeKernelConfigTest, LinearBackendPerQuant) {
  KernelConfig c;
  c.linear_backend_per_quant = std::map<std::string, std::string>{};
  absl::Status empty = NormalizeKernelConfig(c).status();
  EXPECT_EQ(empty.message(), "Dictionary should have at least 1 item after validation, not 0");
  EXPECT_EQ(FieldOf(empty).value(), "linear_backend_per_quant");

  c.linear_backend_per_quant = std::map<std::string, std::string>{{"nvfp4_w4a16", "Humming"}};
  absl::Status bad = NormalizeKernelConfig(c).status();
  EXPECT_EQ(FieldOf(bad).value(), "linear_backend_per_quant.nvfp4_w4a16");
  EXPECT_THAT(std::string(bad.message()), HasSubstr("input_value='Humming'"));

  c.linear_backend_per_quant = std::map<std::string, std::string>{{"nvfp4_w4a16", "humming"}};
  EXPECT_TRUE(NormalizeKernelConfig(c).ok());
}

TEST(NormalizeKernelConfigTest, UnknownIrProviderNamesTheOp) {
  KernelConfig c;
  c.ir_op_priority.of("fused_add_rms_norm") = {"vllm_c", "cuda_magic"};
  absl::Status s = NormalizeKernelConfig(c).status();
  EXPECT_EQ(FieldOf(s).value(), "ir_op_priority.fused_add_rms_norm");
  EXPECT_THAT(std::string(s.message()),
              StartsWith("All providers in priority must be registered implementations."));
  EXPECT_THAT(std::string(s.message()), HasSubstr("'cuda_magic'"));
}

TEST(SplitPriorityStringTest, DropsSpacesAndSplits) {
  EXPECT_THAT(SplitPriorityString(" native, vllm_c "), ElementsAre("native", "vllm_c"));
  EXPECT_THAT(SplitPriorityString("oink"), ElementsAre("oink"));
}

TEST(ParallelConfigTest, RemovedBackendsFallBackWithVllmsText) {
  for (const char* removed : {"naive", "pplx"}) {
    ParallelConfig p;
    p.all2all_backend = removed;
    std::vector<std::string> warnings;
    ParallelConfig n = NormalizeParallelConfig(p, &warnings).value();
    EXPECT_EQ(n.all2all_backend, "allgather_reducescatter");
    ASSERT_EQ(warnings.size(), 1u);
    EXPECT_EQ(warnings[0], absl::StrCat("The '", removed,
                                        "' all2all backend has been removed. Falling back to "
                                        "'allgather_reducescatter'."));
  }
}

TEST(ParallelConfigTest, RejectsBadSizesRanksAndBackends) {
  ParallelConfig p;
  p.tp_size = 0;
  EXPECT_EQ(FieldOf(NormalizeParallelConfig(p, nullptr).status()).value(), "tp_size");
  p = ParallelConfig{};
  p.dp_size = 2;
  p.dp_rank = 2;
  EXPECT_EQ(FieldOf(NormalizeParallelConfig(p, nullptr).status()).value(), "dp_rank");
  p = ParallelConfig{};
  p.all2all_backend = "carrier_pigeon";
  absl::Status s = NormalizeParallelConfig(p, nullptr).status();
  EXPECT_EQ(FieldOf(s).value(), "all2all_backend");
  EXPECT_THAT(std::string(s.message()), HasSubstr("'deepep_low_latency'"));
  // vLLM's Literal lists the removed naive and pplx first.
  EXPECT_THAT(std::string(s.message()), ::testing::StartsWith("Input should be 'naive', 'pplx', "));
}

TEST(NormalizeParallelConfigTest, EplbNeedsExpertParallelAndMoreThanOneRank) {
  ParallelConfig p;
  p.enable_eplb = true;
  p.tp_size = 2;
  absl::Status s = NormalizeParallelConfig(p, nullptr).status();
  EXPECT_EQ(FieldOf(s).value(), "enable_eplb");
  EXPECT_EQ(s.message(), "enable_expert_parallel must be True to use EPLB.");
  p.enable_expert_parallel = true;
  EXPECT_TRUE(NormalizeParallelConfig(p, nullptr).ok());
  p.tp_size = 1;
  EXPECT_EQ(NormalizeParallelConfig(p, nullptr).status().message(),
            "EPLB requires tensor, prefill-context, or data parallelism, but got TP=1, PCP=1, "
            "DP=1.");
  p.pcp_size = 2;  // the EP group spans TP x PCP x DP
  EXPECT_TRUE(NormalizeParallelConfig(p, nullptr).ok());
}

TEST(NormalizeParallelConfigTest, SequenceParallelMoeIsOneOrTpSize) {
  ParallelConfig p;
  p.tp_size = 2;
  p.dp_size = 2;
  p.enable_expert_parallel = true;
  p.sp_size = 2;
  EXPECT_TRUE(NormalizeParallelConfig(p, nullptr).ok());
  p.sp_size = 4;
  absl::Status s = NormalizeParallelConfig(p, nullptr).status();
  EXPECT_EQ(FieldOf(s).value(), "sp_size");
  EXPECT_EQ(s.message(), "sp_size must be 1 or tp_size (2), got 4");
  p.sp_size = 2;
  p.dp_size = 1;  // no DP: vLLM's MoE layers are not sequence parallel
  EXPECT_THAT(std::string(NormalizeParallelConfig(p, nullptr).status().message()),
              HasSubstr("needs sequence-parallel MoE"));
  p.dp_size = 2;
  p.all2all_backend = "flashinfer_nvlink_two_sided";
  EXPECT_EQ(FieldOf(NormalizeParallelConfig(p, nullptr).status()).value(), "sp_size");
  // A self-dispatching moe_backend binds passthrough, which is not sequence
  // parallel: checked again after the binding.
  p.all2all_backend = "allgather_reducescatter";
  ASSERT_TRUE(NormalizeParallelConfig(p, nullptr).ok());
  KernelConfig k;
  k.moe_backend = "flashinfer_moe_ep_cutedsl";
  absl::Status bound = SetPlatformDefaults(k, nullptr, p, ParsePlatformSpec("cuda:10.0").value(),
                                           EnvVars{}, nullptr);
  EXPECT_EQ(FieldOf(bound).value_or(""), "parallel.sp_size") << bound;
}

TEST(NormalizeParallelConfigTest, BackendNameIsCheckedBeforeEplb) {
  ParallelConfig p;
  p.enable_eplb = true;  // without expert parallel: an EPLB error too
  p.all2all_backend = "bogus";
  EXPECT_EQ(FieldOf(NormalizeParallelConfig(p, nullptr).status()).value(), "all2all_backend");
}

TEST(ValidateFlashinferMoeEpModelTest, OnlyDeepSeekV4) {
  EXPECT_TRUE(ValidateFlashinferMoeEpModel("triton", {"LlamaForCausalLM"}).ok());
  EXPECT_TRUE(
      ValidateFlashinferMoeEpModel("flashinfer_moe_ep_mega_deep_gemm", {"DeepseekV4ForCausalLM"})
          .ok());
  absl::Status s =
      ValidateFlashinferMoeEpModel("flashinfer_moe_ep_mega_deep_gemm", {"LlamaForCausalLM"});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(),
            "moe_backend='flashinfer_moe_ep_mega_deep_gemm' is only supported for DeepSeek-V4 "
            "models (['DeepSeekV4MTPModel', 'DeepseekV41ForCausalLM', 'DeepseekV4ForCausalLM']), "
            "but the model is ['LlamaForCausalLM'].");
  EXPECT_EQ(FieldOf(s).value(), "kernel_config.moe_backend");
}

TEST(BindPassthroughTest, DefaultBecomesPassthroughIdempotently) {
  for (const char* backend :
       {"flashinfer_moe_ep_cutedsl", "flashinfer_moe_ep_mega_deep_gemm", "kplan_ep"}) {
    ParallelConfig p;
    std::vector<std::string> warnings;
    ASSERT_TRUE(BindPassthroughAll2AllBackend(backend, p, &warnings).ok());
    EXPECT_EQ(p.all2all_backend, "passthrough");
    ASSERT_TRUE(BindPassthroughAll2AllBackend(backend, p, &warnings).ok());
    EXPECT_EQ(p.all2all_backend, "passthrough");
    EXPECT_EQ(warnings.size(), 1u);
    EXPECT_EQ(warnings[0], absl::StrCat("moe_backend='", backend,
                                        "': using all2all_backend='passthrough' (dispatch and "
                                        "combine run inside the MoE backend)."));
  }
}

TEST(BindPassthroughTest, ExplicitOtherBackendIsRejected) {
  ParallelConfig p;
  p.all2all_backend = "deepep_low_latency";
  absl::Status s = BindPassthroughAll2AllBackend("flashinfer_moe_ep_cutedsl", p, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(),
            "moe_backend='flashinfer_moe_ep_cutedsl' dispatches and combines itself and cannot "
            "be paired with all2all_backend='deepep_low_latency'; leave --all2all-backend unset.");
  EXPECT_EQ(FieldOf(s).value(), "parallel.all2all_backend");
  EXPECT_EQ(p.all2all_backend, "deepep_low_latency");
}

TEST(BindPassthroughTest, PassthroughNeedsASelfDispatchingBackend) {
  ParallelConfig p;
  p.all2all_backend = "passthrough";
  absl::Status s = BindPassthroughAll2AllBackend("triton", p, nullptr);
  EXPECT_EQ(s.message(),
            "all2all_backend='passthrough' is only valid with a moe_backend that dispatches and "
            "combines itself (['flashinfer_moe_ep_cutedsl', 'flashinfer_moe_ep_mega_deep_gemm']),"
            " got moe_backend='triton'.");
  ParallelConfig other;
  other.all2all_backend = "deepep_high_throughput";
  EXPECT_TRUE(BindPassthroughAll2AllBackend("triton", other, nullptr).ok());
  EXPECT_EQ(other.all2all_backend, "deepep_high_throughput");
}

TEST(DefaultIrOpPriorityTest, PerPlatform) {
  EnvVars env;
  IrOpPriorityConfig cuda = DefaultIrOpPriority(Cuda(), env);
  EXPECT_THAT(cuda.of("rms_norm"), ElementsAre("vllm_c", "native"));
  EXPECT_THAT(cuda.of("fused_add_rms_norm"), ElementsAre("vllm_c", "native"));
  EXPECT_THAT(cuda.of("gelu_and_mul_sparse"), ElementsAre("triton", "native"));

  Platform inductor = Cuda();
  inductor.use_inductor = true;
  EXPECT_THAT(DefaultIrOpPriority(inductor, env).of("rms_norm"), ElementsAre("native"));
  inductor.enforce_eager = true;  // compilation mode NONE: no inductor
  EXPECT_THAT(DefaultIrOpPriority(inductor, env).of("rms_norm"), ElementsAre("vllm_c", "native"));

  EnvVars oink({{"VLLM_USE_OINK_OPS", "1"}});
  EXPECT_THAT(DefaultIrOpPriority(Cuda(), oink).of("rms_norm"),
              ElementsAre("oink", "vllm_c", "native"));
  EXPECT_THAT(DefaultIrOpPriority(Cuda(), EnvVars({{"VLLM_USE_OINK_OPS", "0"}})).of("rms_norm"),
              ElementsAre("vllm_c", "native"));

  Platform rocm = ParsePlatformSpec("rocm:gfx942").value();
  EXPECT_THAT(DefaultIrOpPriority(rocm, env).of("rms_norm"), ElementsAre("vllm_c", "native"));
  EnvVars aiter({{"VLLM_ROCM_USE_AITER", "1"}});
  EXPECT_THAT(DefaultIrOpPriority(rocm, aiter).of("fused_add_rms_norm"),
              ElementsAre("aiter", "vllm_c", "native"));
  EnvVars aiter_no_rms({{"VLLM_ROCM_USE_AITER", "1"}, {"VLLM_ROCM_USE_AITER_RMSNORM", "0"}});
  EXPECT_THAT(DefaultIrOpPriority(rocm, aiter_no_rms).of("rms_norm"),
              ElementsAre("vllm_c", "native"));
  rocm.enforce_eager = true;
  EXPECT_THAT(DefaultIrOpPriority(rocm, aiter).of("rms_norm"), ElementsAre("vllm_c", "native"));

  Platform xpu = ParsePlatformSpec("xpu").value();
  EXPECT_THAT(DefaultIrOpPriority(xpu, env).of("gelu_and_mul_sparse"),
              ElementsAre("xpu_kernels", "native"));
  for (const char* spec : {"cpu", "tpu", "oot"}) {
    IrOpPriorityConfig c = DefaultIrOpPriority(ParsePlatformSpec(spec).value(), env);
    for (absl::string_view op : IrOpNames()) EXPECT_THAT(c.of(op), ElementsAre("native")) << spec;
  }
}

TEST(SetPlatformDefaultsTest, AppendsUniqueProvidersIdempotently) {
  KernelConfig c;
  c.ir_op_priority.of("rms_norm") = {"native"};
  c.ir_op_priority.of("fused_add_rms_norm") = {"vllm_c"};
  ParallelConfig p;
  EnvVars env;
  ASSERT_TRUE(SetPlatformDefaults(c, nullptr, p, Cuda(), env, nullptr).ok());
  EXPECT_THAT(c.ir_op_priority.of("rms_norm"), ElementsAre("native", "vllm_c"));
  EXPECT_THAT(c.ir_op_priority.of("fused_add_rms_norm"), ElementsAre("vllm_c", "native"));
  EXPECT_THAT(c.ir_op_priority.of("gelu_and_mul_sparse"), ElementsAre("triton", "native"));
  KernelConfig again = c;
  ASSERT_TRUE(SetPlatformDefaults(again, nullptr, p, Cuda(), env, nullptr).ok());
  EXPECT_EQ(again.ir_op_priority.priority, c.ir_op_priority.priority);
  EXPECT_EQ(ComputeHash(again), ComputeHash(c));
}

TEST(SetPlatformDefaultsTest, ChecksTheModelOnlyWhenGiven) {
  KernelConfig c;
  c.moe_backend = "flashinfer_moe_ep_mega_deep_gemm";
  ParallelConfig p;
  EnvVars env;
  EXPECT_TRUE(SetPlatformDefaults(c, nullptr, p, Cuda(), env, nullptr).ok());
  EXPECT_EQ(p.all2all_backend, "passthrough");
  ModelInfo llama{{"LlamaForCausalLM"}};
  ParallelConfig p2;
  EXPECT_FALSE(SetPlatformDefaults(c, &llama, p2, Cuda(), env, nullptr).ok());
}

TEST(DescribeIrOpPriorityTest, PythonStyle) {
  IrOpPriorityConfig c;
  c.of("rms_norm") = {"vllm_c", "native"};
  EXPECT_EQ(DescribeIrOpPriority(c),
            "IrOpPriorityConfig(rms_norm=['vllm_c', 'native'], fused_add_rms_norm=[], "
            "gelu_and_mul_sparse=[])");
}

}  // namespace
}  // namespace kplan
