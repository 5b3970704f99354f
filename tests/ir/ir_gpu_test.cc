// GPU providers against the CPU reference: the kplan kernels and the native
// GPU kernels on fresh random inputs (never zeros) for fp32/fp16/bf16, odd
// and even hidden sizes, one row and many, 3-D inputs, rows longer than the
// register cache, weight or none, variance_size, strided and misaligned
// views, mixed dtypes, and concurrent requests on several streams.
// Every test skips itself without a CUDA device. Run: ./ir_gpu_test
#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdio>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gtest/gtest.h"
#include "kernels/cuda/ir/ir_ops.h"
#include "server/ir/builtin_ops.h"
#include "server/ir/run.h"
#include "tests/ir/test_util.h"
#include "tests/testing/gpu_test_util.h"

namespace kplan {
namespace {

using testing_ir::CountMismatches;
using testing_ir::Host;
using testing_ir::RandomValues;
using testing_ir::ToleranceFor;
using testing_ir::Values;

using test_util::HaveCuda;

std::mt19937& Rng() {
  static std::mt19937 rng = [] {
    const unsigned seed = std::random_device{}();
    std::printf("ir_gpu_test: random seed %u\n", seed);
    return std::mt19937(seed);
  }();
  return rng;
}

int64_t Numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

absl::string_view Short(kernels::DType t) {
  return t == kernels::DType::kFloat32 ? "fp32" : t == kernels::DType::kFloat16 ? "fp16" : "bf16";
}

class IrGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!HaveCuda()) GTEST_SKIP() << "no CUDA device";
    registry_ = *MakeBuiltinIrRegistry({.kplan_supported = true});
  }

  // Runs `r` on the CPU (native) and on GPU 0 with `priority`; checks the
  // provider and every output against the CPU within vLLM's tolerance.
  void Compare(IrOpRequest r, const std::vector<std::string>& priority,
               const std::string& expected_provider, bool rms_op) {
    IrOpRequest cpu = r;
    cpu.priority = std::vector<std::string>{"native"};
    cpu.device = {};
    absl::StatusOr<IrOpResult> want = RunIrOp(*registry_, cpu);
    ASSERT_TRUE(want.ok()) << want.status();
    r.priority = priority;
    r.device.device = IrDevice::Cuda(0);
    absl::StatusOr<IrOpResult> got = RunIrOp(*registry_, r);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->provider, expected_provider);
    ASSERT_EQ(got->outputs.size(), want->outputs.size());
    const kernels::DType dtype = r.tensors[0].tensor.dtype;
    for (size_t i = 0; i < got->outputs.size(); ++i) {
      const std::vector<float> g = Values(got->outputs[i].tensor);
      const std::vector<float> w = Values(want->outputs[i].tensor);
      std::string first;
      const size_t bad = CountMismatches(g, w, ToleranceFor(dtype, rms_op), &first);
      double max_err = 0;
      for (size_t k = 0; k < g.size() && k < w.size(); ++k) {
        max_err = std::max(max_err, static_cast<double>(std::fabs(g[k] - w[k])));
      }
      std::printf("  %-20s %-4s %-16s %-7s %-8s max|err| %.3g  mismatches %zu\n", r.op.c_str(),
                  std::string(Short(dtype)).c_str(),
                  absl::StrCat("[", absl::StrJoin(r.tensors[0].tensor.shape, ","), "]").c_str(),
                  got->provider.c_str(), got->outputs[i].name.c_str(), max_err, bad);
      EXPECT_EQ(bad, 0u) << r.op << " output " << got->outputs[i].name << ": " << first;
    }
  }

  std::unique_ptr<IrRegistry> registry_;
};

const kernels::DType kDTypes[] = {kernels::DType::kFloat32, kernels::DType::kFloat16,
                                  kernels::DType::kBFloat16};

// Shapes of x: one row, hidden a multiple of 8 or not, many rows, 3-D, rows
// longer than the register cache (512 threads x 4 vectors).
const std::vector<std::vector<int64_t>> kShapes = {{1, 4096}, {7, 8192},  {300, 1003}, {3, 5, 24},
                                                   {1, 3},    {4, 40000}, {2048, 128}, {16}};

TEST_F(IrGpuTest, RmsNormMatchesReference) {
  for (kernels::DType dtype : kDTypes) {
    for (const auto& shape : kShapes) {
      for (bool weight : {false, true}) {
        for (bool variance : {false, true}) {
          SCOPED_TRACE(absl::StrCat(IrDTypeName(dtype), " [", absl::StrJoin(shape, ","),
                                    "] weight=", weight, " variance_size=", variance));
          IrOpRequest r;
          r.op = "rms_norm";
          r.epsilon = 1e-6;
          const int64_t hidden = shape.back();
          r.tensors = {{"x", Host(dtype, shape, RandomValues(Numel(shape), Rng(), dtype))}};
          if (weight) {
            r.tensors.push_back(
                {"weight", Host(dtype, {hidden}, RandomValues(hidden, Rng(), dtype))});
          }
          if (variance) r.variance_size = std::max<int64_t>(1, hidden / 2);
          // kplan declines variance_size: native runs on the GPU instead.
          Compare(r, {"kplan", "native"}, variance ? "native" : "kplan", true);
          Compare(r, {"native"}, "native", true);
        }
      }
    }
  }
}

TEST_F(IrGpuTest, FusedAddRmsNormMatchesReference) {
  for (kernels::DType dtype : kDTypes) {
    for (const auto& shape : kShapes) {
      for (bool weight : {false, true}) {
        for (bool variance : {false, true}) {
          SCOPED_TRACE(absl::StrCat(IrDTypeName(dtype), " [", absl::StrJoin(shape, ","),
                                    "] weight=", weight, " variance_size=", variance));
          IrOpRequest r;
          r.op = "fused_add_rms_norm";
          r.epsilon = 1e-5;
          const int64_t hidden = shape.back();
          r.tensors = {
              {"x", Host(dtype, shape, RandomValues(Numel(shape), Rng(), dtype))},
              {"x_residual", Host(dtype, shape, RandomValues(Numel(shape), Rng(), dtype))}};
          if (weight) {
            r.tensors.push_back(
                {"weight", Host(dtype, {hidden}, RandomValues(hidden, Rng(), dtype))});
          }
          if (variance) r.variance_size = std::max<int64_t>(1, hidden - 1);
          Compare(r, {"kplan", "native"}, variance ? "native" : "kplan", true);
          Compare(r, {"native"}, "native", true);
        }
      }
    }
  }
}

TEST_F(IrGpuTest, GeluAndMulSparseMatchesReference) {
  const std::vector<std::vector<int64_t>> shapes = {{1, 2 * 4096},  {9, 2 * 1003},   {3, 4, 64},
                                                    {2, 2 * 20000}, {512, 2 * 2048}, {2}};
  for (kernels::DType dtype : kDTypes) {
    for (const auto& shape : shapes) {
      for (const char* approximate : {"none", "tanh"}) {
        // Phi^-1 of the sparsities 0.95, 0.5 and 0.1.
        for (double mult : {1.6448536269514722, 0.0, -1.2815515655446004}) {
          SCOPED_TRACE(absl::StrCat(IrDTypeName(dtype), " [", absl::StrJoin(shape, ","), "] ",
                                    approximate, " ", mult));
          IrOpRequest r;
          r.op = "gelu_and_mul_sparse";
          r.std_multiplier = mult;
          r.approximate = approximate;
          r.tensors = {{"x", Host(dtype, shape, RandomValues(Numel(shape), Rng(), dtype))}};
          Compare(r, {"kplan", "native"}, "kplan", false);
          Compare(r, {"native"}, "native", false);
        }
      }
    }
  }
}

TEST_F(IrGpuTest, MixedDtypesFallBackToNative) {
  // A float32 weight on bfloat16 x: kplan's predicate declines, native runs.
  IrOpRequest r;
  r.op = "rms_norm";
  r.epsilon = 1e-6;
  r.tensors = {{"x", Host(kernels::DType::kBFloat16, {33, 256},
                          RandomValues(33 * 256, Rng(), kernels::DType::kBFloat16))},
               {"weight", Host(kernels::DType::kFloat32, {256},
                               RandomValues(256, Rng(), kernels::DType::kFloat32))}};
  Compare(r, {"kplan", "native"}, "native", true);
  IrOpRequest f;
  f.op = "fused_add_rms_norm";
  f.epsilon = 1e-6;
  f.tensors = {{"x", Host(kernels::DType::kFloat16, {5, 512},
                          RandomValues(5 * 512, Rng(), kernels::DType::kFloat16))},
               {"x_residual", Host(kernels::DType::kFloat32, {5, 512},
                                   RandomValues(5 * 512, Rng(), kernels::DType::kFloat32))}};
  Compare(f, {"kplan", "native"}, "native", true);
}

// Device views the RPC path never builds: padded rows, a misaligned start
// (both still kplan) and a transposed view (native on the GPU).
TEST_F(IrGpuTest, StridedAndMisalignedViews) {
  const IrOp* op = registry_->Find("rms_norm");
  const std::vector<std::string> priority = {"kplan", "native"};
  struct Case {
    const char* name;
    int64_t rows, cols, row_stride, col_stride, offset;
    const char* provider;
    bool vector_path;
  };
  const Case cases[] = {
      {"padded rows", 37, 1024, 1024 + 64, 1, 0, "kplan", true},
      {"odd padding", 37, 1024, 1024 + 3, 1, 0, "kplan", false},
      {"misaligned start", 37, 1024, 1024, 1, 1, "kplan", false},
      {"transposed", 64, 48, 1, 64, 0, "native", false},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const kernels::DType dtype = kernels::DType::kBFloat16;
    const int64_t span = c.offset + (c.rows - 1) * c.row_stride + (c.cols - 1) * c.col_stride + 1;
    IrHostTensor buf = Host(dtype, {span}, RandomValues(span, Rng(), dtype));
    std::vector<float> w = RandomValues(c.cols, Rng(), dtype);
    IrHostTensor weight = Host(dtype, {c.cols}, w);

    void* dbuf = nullptr;
    void* dw = nullptr;
    void* dout = nullptr;
    ASSERT_EQ(cudaMalloc(&dbuf, buf.data.size()), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&dw, weight.data.size()), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&dout, c.rows * c.cols * 2), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(dbuf, buf.data.data(), buf.data.size(), cudaMemcpyHostToDevice),
              cudaSuccess);
    ASSERT_EQ(cudaMemcpy(dw, weight.data.data(), weight.data.size(), cudaMemcpyHostToDevice),
              cudaSuccess);
    ASSERT_EQ(cudaMemset(dout, 0xff, c.rows * c.cols * 2), cudaSuccess);

    auto view = [&](void* base, IrDevice dev) {
      TensorView x;
      x.dtype = dtype;
      x.device = dev;
      x.shape = {c.rows, c.cols};
      x.strides = {c.row_stride, c.col_stride};
      x.data = static_cast<char*>(base) + c.offset * 2;
      return x;
    };
    TensorView x = view(dbuf, IrDevice::Cuda(0));
    TensorView wv = TensorView::Contiguous(dw, dtype, {c.cols}, IrDevice::Cuda(0));
    IrArgs args = RmsNormArgs(x, &wv, 1e-6);
    absl::StatusOr<const IrOpImpl*> impl = op->Dispatch(args, {&priority});
    ASSERT_TRUE(impl.ok()) << impl.status();
    EXPECT_EQ((*impl)->provider(), c.provider);
    if (std::string(c.provider) == "kplan") {
      int64_t rs = 0;
      ASSERT_TRUE(x.RowsWithStride(&rs));
      EXPECT_EQ(kernels::cuda::KplanVectorPath(dtype, c.cols, {{x.data, rs}}), c.vector_path);
    }
    TensorView out = TensorView::Contiguous(dout, dtype, {c.rows, c.cols}, IrDevice::Cuda(0));
    ASSERT_TRUE((*impl)->Run(args, {&out, 1}, IrExecContext{}).ok());
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    IrHostTensor got{dtype, {c.rows, c.cols}, std::string(c.rows * c.cols * 2, '\0')};
    ASSERT_EQ(cudaMemcpy(got.data.data(), dout, got.data.size(), cudaMemcpyDeviceToHost),
              cudaSuccess);

    // The CPU reference on the same strided view of the host copy.
    TensorView hx = view(buf.data.data(), IrDevice::Cpu());
    TensorView hw = TensorView::Contiguous(weight.data.data(), dtype, {c.cols});
    IrHostTensor want{dtype, {c.rows, c.cols}, std::string(c.rows * c.cols * 2, '\0')};
    TensorView hout = TensorView::Contiguous(want.data.data(), dtype, {c.rows, c.cols});
    ASSERT_TRUE(op->impl("native")->Run(RmsNormArgs(hx, &hw, 1e-6), {&hout, 1}, {}).ok());
    std::string first;
    EXPECT_EQ(CountMismatches(Values(got), Values(want), ToleranceFor(dtype, true), &first), 0u)
        << first;
    cudaFree(dbuf);
    cudaFree(dw);
    cudaFree(dout);
  }
}

// Concurrent requests on their own streams with different overrides.
TEST_F(IrGpuTest, ConcurrentRequestsOnStreams) {
  constexpr int kThreads = 8;
  std::atomic<int> wrong{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      cudaSetDevice(0);
      cudaStream_t stream;
      if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) {
        wrong++;
        return;
      }
      std::mt19937 rng(1000 + t);
      for (int i = 0; i < 40; ++i) {
        IrOpRequest r;
        r.op = "fused_add_rms_norm";
        r.epsilon = 1e-6;
        r.tensors = {{"x", Host(kernels::DType::kBFloat16, {16, 2048},
                                RandomValues(16 * 2048, rng, kernels::DType::kBFloat16))},
                     {"x_residual", Host(kernels::DType::kBFloat16, {16, 2048},
                                         RandomValues(16 * 2048, rng, kernels::DType::kBFloat16))}};
        IrOpRequest cpu = r;
        const bool kplan = (t + i) % 2 == 0;
        r.priority = kplan ? std::vector<std::string>{"kplan", "native"}
                           : std::vector<std::string>{"native"};
        r.device = {IrDevice::Cuda(0), stream};
        absl::StatusOr<IrOpResult> got = RunIrOp(*registry_, r);
        absl::StatusOr<IrOpResult> want = RunIrOp(*registry_, cpu);
        if (!got.ok() || !want.ok() || got->provider != (kplan ? "kplan" : "native")) {
          wrong++;
          continue;
        }
        for (int k = 0; k < 2; ++k) {
          if (CountMismatches(Values(got->outputs[k].tensor), Values(want->outputs[k].tensor),
                              ToleranceFor(kernels::DType::kBFloat16, true), nullptr) != 0) {
            wrong++;
          }
        }
      }
      cudaStreamDestroy(stream);
    });
  }
  for (std::thread& th : threads) th.join();
  EXPECT_EQ(wrong.load(), 0);
}

TEST(IrGpuDefaultsTest, ServerDefaultsWithADevice) {
  SKIP_WITHOUT_CUDA();
  EXPECT_TRUE(CudaKernelsAvailable());
  EXPECT_EQ(DefaultPriorityFor("rms_norm"), (std::vector<std::string>{"kplan", "native"}));
}

}  // namespace
}  // namespace kplan
