// RunIrOp: request validation with Python's argument errors, priority
// overrides per request, server defaults, and concurrent requests.
#include "server/ir/run.h"

#include <atomic>
#include <thread>

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "base/status.h"
#include "server/ir/builtin_ops.h"
#include "resolve/plan/vocabulary.h"
#include "tests/ir/test_util.h"

namespace kplan {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using testing_ir::Host;
using testing_ir::Values;

IrOpRequest RmsRequest() {
  IrOpRequest r;
  r.op = "rms_norm";
  r.tensors = {{"x", Host(kernels::DType::kFloat32, {1, 2}, {3, 4})}};
  r.epsilon = 0.0;
  return r;
}

TEST(IrDefaultsTest, ServerDefaults) {
  std::unique_ptr<IrRegistry> cpu = *MakeBuiltinIrRegistry({.kplan_supported = false});
  std::unique_ptr<IrRegistry> gpu = *MakeBuiltinIrRegistry({.kplan_supported = true});
  for (absl::string_view op : {"rms_norm", "fused_add_rms_norm", "gelu_and_mul_sparse"}) {
    EXPECT_THAT(DefaultPriorityFor(*cpu, op), ElementsAre("native"));
    EXPECT_THAT(DefaultPriorityFor(*gpu, op), ElementsAre("kplan", "native"));
  }
  EXPECT_THAT(DefaultPriorityFor(*cpu, "nope"), IsEmpty());
  EXPECT_THAT(ServerDefaultIrPriority(true), ElementsAre("kplan", "native"));
  // The global registry follows the build and the host.
  EXPECT_EQ(DefaultPriorityFor("rms_norm"), ServerDefaultIrPriority(CudaKernelsAvailable()));
#if !KPLAN_HAVE_CUDA
  EXPECT_FALSE(CudaKernelsAvailable());
  EXPECT_THAT(DefaultPriorityFor("rms_norm"), ElementsAre("native"));
#endif
}

// Past its deadline the CPU path stops between row blocks and answers
// DEADLINE_EXCEEDED instead of an incomplete output; before it, it runs.
TEST(IrRunTest, CpuOpsStopPastTheirDeadline) {
  std::unique_ptr<IrRegistry> reg = *MakeBuiltinIrRegistry({});
  constexpr int64_t kRows = 4096, kCols = 8;
  IrOpRequest r;
  r.op = "rms_norm";
  r.tensors = {{"x", Host(kernels::DType::kFloat32, {kRows, kCols},
                          std::vector<float>(kRows * kCols, 1.0f))}};
  r.epsilon = 1e-6;
  r.deadline = absl::Now() - absl::Seconds(1);
  absl::StatusOr<IrOpResult> late = RunIrOp(*reg, r);
  EXPECT_EQ(late.status().code(), absl::StatusCode::kDeadlineExceeded) << late.status();
  EXPECT_THAT(std::string(late.status().message()), HasSubstr("rms_norm"));
  r.deadline = absl::Now() + absl::Hours(1);
  EXPECT_TRUE(RunIrOp(*reg, r).ok());
}

TEST(IrRunTest, RunsWithTheDefaultPriority) {
  std::unique_ptr<IrRegistry> reg = *MakeBuiltinIrRegistry({});
  absl::StatusOr<IrOpResult> out = RunIrOp(*reg, RmsRequest());
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->op, "rms_norm");
  EXPECT_EQ(out->provider, "native");
  EXPECT_EQ(out->provider_uuid, IrProviderUuid("rms_norm", "native"));
  EXPECT_THAT(out->priority, ElementsAre("native"));
  EXPECT_THAT(out->warnings, IsEmpty());
  ASSERT_EQ(out->outputs.size(), 1u);
  EXPECT_EQ(out->outputs[0].name, "out");
  EXPECT_THAT(out->outputs[0].tensor.shape, ElementsAre(1, 2));
  EXPECT_THAT(Values(out->outputs[0].tensor),
              ElementsAre(::testing::FloatEq(0.84852814f), ::testing::FloatEq(1.13137085f)));
}

TEST(IrRunTest, KplanDeclinesHostTensors) {
  // Even where kplan is supported, its predicate wants CUDA tensors.
  std::unique_ptr<IrRegistry> reg = *MakeBuiltinIrRegistry({.kplan_supported = true});
  absl::StatusOr<IrOpResult> out = RunIrOp(*reg, RmsRequest());
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->provider, "native");
  EXPECT_THAT(out->priority, ElementsAre("kplan", "native"));
}

TEST(IrRunTest, PriorityOverrides) {
  std::unique_ptr<IrRegistry> reg = *MakeBuiltinIrRegistry({});
  IrOpRequest r = RmsRequest();
  // vLLM's CUDA default: vllm_c is not available here, so it filters to native.
  r.priority = std::vector<std::string>{"vllm_c", "native"};
  absl::StatusOr<IrOpResult> out = RunIrOp(*reg, r);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_THAT(out->priority, ElementsAre("native"));
  EXPECT_THAT(out->warnings, IsEmpty());

  // No all-args provider listed: native appended with vLLM's warning, once.
  r.priority = std::vector<std::string>{"oink"};
  out = RunIrOp(*reg, r);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->provider, "native");
  EXPECT_THAT(out->warnings,
              ElementsAre(HasSubstr("Op rms_norm: No implementation in priority list supports "
                                    "all args")));
  EXPECT_THAT(RunIrOp(*reg, r)->warnings, IsEmpty());

  r.priority = std::vector<std::string>{"kplan", "nope"};
  absl::Status bad = RunIrOp(*reg, r).status();
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.message(), "All providers in priority must be registered implementations.");
  EXPECT_EQ(FieldOf(bad).value(), "priority");
}

TEST(IrRunTest, ArgumentErrors) {
  std::unique_ptr<IrRegistry> reg = *MakeBuiltinIrRegistry({});
  struct Case {
    std::function<void(IrOpRequest&)> edit;
    absl::StatusCode code;
    std::string message;
    std::string field;
  };
  const std::vector<Case> cases = {
      {[](IrOpRequest& r) { r.op = "silu_and_mul"; }, absl::StatusCode::kNotFound,
       "Unknown IR op 'silu_and_mul'; this server has rms_norm, fused_add_rms_norm, "
       "gelu_and_mul_sparse",
       "op"},
      {[](IrOpRequest& r) { r.epsilon.reset(); }, absl::StatusCode::kInvalidArgument,
       "rms_norm() missing 1 required positional argument: 'epsilon'", "epsilon"},
      {[](IrOpRequest& r) { r.tensors.clear(); }, absl::StatusCode::kInvalidArgument,
       "rms_norm() missing 1 required positional argument: 'x'", "x"},
      {[](IrOpRequest& r) { r.std_multiplier = 0.5; }, absl::StatusCode::kInvalidArgument,
       "rms_norm() got an unexpected keyword argument 'std_multiplier'", "std_multiplier"},
      {[](IrOpRequest& r) {
         r.tensors.push_back({"x_residual", r.tensors[0].tensor});
       },
       absl::StatusCode::kInvalidArgument,
       "rms_norm() got an unexpected keyword argument 'x_residual'", "x_residual"},
      {[](IrOpRequest& r) { r.tensors.push_back(r.tensors[0]); },
       absl::StatusCode::kInvalidArgument, "rms_norm() got multiple values for argument 'x'", "x"},
      {[](IrOpRequest& r) { r.tensors[0].tensor.data.pop_back(); },
       absl::StatusCode::kInvalidArgument, "x holds 7 bytes; its shape [1, 2] needs 8", "x.data"},
      {[](IrOpRequest& r) {
         r.tensors.push_back({"weight", Host(kernels::DType::kFloat32, {3}, {1, 1, 1})});
       },
       absl::StatusCode::kInvalidArgument,
       "weight must have shape [2] (the last dim of x), got [3]", "weight"},
      {[](IrOpRequest& r) { r.variance_size = 3; }, absl::StatusCode::kInvalidArgument,
       "variance_size must be in [1, 2] (the last dim of x), got 3", "variance_size"},
      {[](IrOpRequest& r) { r.device.device = IrDevice::Cuda(99); },
       absl::StatusCode::kFailedPrecondition, "", "device"},
  };
  for (const Case& c : cases) {
    IrOpRequest r = RmsRequest();
    c.edit(r);
    absl::Status s = RunIrOp(*reg, r).status();
    EXPECT_EQ(s.code(), c.code) << s;
    if (!c.message.empty()) {
      EXPECT_EQ(s.message(), c.message);
    }
    if (!c.field.empty()) {
      EXPECT_EQ(FieldOf(s).value_or(""), c.field) << s;
    }
  }
}

TEST(IrRunTest, GeluAndMulSparseErrors) {
  std::unique_ptr<IrRegistry> reg = *MakeBuiltinIrRegistry({});
  IrOpRequest r;
  r.op = "gelu_and_mul_sparse";
  r.tensors = {{"x", Host(kernels::DType::kFloat32, {4}, {1, 2, 3, 4})}};
  r.std_multiplier = 1.6448536269514722;
  r.approximate = "erf";
  absl::Status s = RunIrOp(*reg, r).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "Unknown approximate mode: erf");
  EXPECT_EQ(FieldOf(s).value_or(""), "approximate");
  r.approximate = "none";
  // Any multiplier is the op's (vLLM's takes any float): 0, negative, huge.
  for (double m : {0.0, -3.0, 1e30}) {
    r.std_multiplier = m;
    EXPECT_TRUE(RunIrOp(*reg, r).ok()) << m;
  }
  r.tensors = {{"x", Host(kernels::DType::kFloat32, {3}, {1, 2, 3})}};
  EXPECT_THAT(std::string(RunIrOp(*reg, r).status().message()), HasSubstr("even last dim"));
  r.std_multiplier.reset();
  EXPECT_EQ(RunIrOp(*reg, r).status().message(),
            "gelu_and_mul_sparse() missing 1 required positional argument: 'std_multiplier'");
}

TEST(IrRunTest, EmptyRowsAndFusedShapes) {
  std::unique_ptr<IrRegistry> reg = *MakeBuiltinIrRegistry({});
  IrOpRequest r;
  r.op = "fused_add_rms_norm";
  r.epsilon = 1e-6;
  r.tensors = {{"x", Host(kernels::DType::kBFloat16, {0, 8}, {})},
               {"x_residual", Host(kernels::DType::kBFloat16, {0, 8}, {})}};
  absl::StatusOr<IrOpResult> out = RunIrOp(*reg, r);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_THAT(out->outputs[1].tensor.shape, ElementsAre(0, 8));
  r.tensors[1].tensor = Host(kernels::DType::kBFloat16, {1, 8}, std::vector<float>(8, 1.f));
  EXPECT_EQ(RunIrOp(*reg, r).status().message(),
            "x_residual must have the shape of x [0, 8], got [1, 8]");
}

// Requests with different overrides run at once on one registry; each must
// get the provider its own override picks. "marker" writes 7s.
TEST(IrRunConcurrencyTest, PerRequestOverridesDoNotLeak) {
  std::unique_ptr<IrRegistry> reg = *MakeBuiltinIrRegistry({});
  IrOp* op = reg->Find("rms_norm");
  IrImplSpec marker;
  marker.provider = "marker";
  marker.signature = op->signature();
  marker.fn = [](const IrArgs&, absl::Span<const TensorView> outs, const IrExecContext&) {
    float* o = static_cast<float*>(outs[0].data);
    for (int64_t i = 0; i < outs[0].numel(); ++i) o[i] = 7.f;
    return absl::OkStatus();
  };
  ASSERT_TRUE(op->RegisterImpl(std::move(marker)).ok());

  std::atomic<int> wrong{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 500; ++i) {
        IrOpRequest r = RmsRequest();
        const bool use_marker = (t + i) % 2 == 0;
        if (use_marker) r.priority = std::vector<std::string>{"marker"};
        absl::StatusOr<IrOpResult> out = RunIrOp(*reg, r);
        if (!out.ok()) {
          wrong++;
          continue;
        }
        const float v = Values(out->outputs[0].tensor)[0];
        if (out->provider != (use_marker ? "marker" : "native") ||
            (use_marker ? v != 7.f : std::fabs(v - 0.84852814f) > 1e-6f)) {
          wrong++;
        }
      }
    });
  }
  for (std::thread& th : threads) th.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_THAT(op->GetDefault(), ElementsAre("native"));
}

}  // namespace
}  // namespace kplan
