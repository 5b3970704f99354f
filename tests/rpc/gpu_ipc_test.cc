// RunMoE tensors in a client's CUDA memory (CUDA IPC shared-memory regions),
// GPU label. CUDA IPC needs two processes: the test starts a GPU server
// (--devices=0 --allow_shared_memory) and a CPU-reference server
// (--devices=none) in this process, then runs this binary again as the
// client (GpuIpcClient.*, which skips itself unless started so). The client
// cudaMallocs inputs and output on device 0, exports their handles, registers
// them and calls RunMoE with references: the output in its memory equals the
// inline GPU run bit for bit and the CPU reference within the layer
// tolerance, on fresh random data. Then the errors with real handles, and
// unregistering while calls use a region. Skips itself without a GPU.
#include <cuda_runtime_api.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/float16.h"
#include "base/status.h"
#include "client/cpp/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/rpc/server.h"
#include "tests/rpc/moe_rpc_util.h"
#include "tests/testing/gpu_test_util.h"
#include "tests/testing/tolerance.h"

extern char** environ;

namespace kplan::rpc {
namespace {

using testing::MakeTensor;
using testing::Ref;

constexpr int kE = 8, kH = 512, kI = 256, kK = 2;
constexpr const char* kGpuEnv = "KPLAN_IPC_TEST_GPU_SERVER";
constexpr const char* kCpuEnv = "KPLAN_IPC_TEST_CPU_SERVER";

// The parent: both servers, then this binary as the client process.
TEST(GpuIpcTest, RunMoeOnClientDeviceMemoryInAnotherProcess) {
  SKIP_WITHOUT_CUDA();
  ServerOptions gpu_options;
  gpu_options.listen_address = "127.0.0.1:0";
  gpu_options.devices = "0";
  gpu_options.allow_shared_memory = true;
  absl::StatusOr<std::unique_ptr<KplanServer>> gpu = KplanServer::Start(gpu_options);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  ServerOptions cpu_options;
  cpu_options.listen_address = "127.0.0.1:0";
  cpu_options.devices = "none";
  absl::StatusOr<std::unique_ptr<KplanServer>> cpu = KplanServer::Start(cpu_options);
  ASSERT_TRUE(cpu.ok()) << cpu.status();

  const std::string gpu_env = absl::StrCat(kGpuEnv, "=127.0.0.1:", (*gpu)->port());
  const std::string cpu_env = absl::StrCat(kCpuEnv, "=127.0.0.1:", (*cpu)->port());
  std::vector<char*> env;
  for (char** e = environ; *e != nullptr; ++e) env.push_back(*e);
  env.push_back(const_cast<char*>(gpu_env.c_str()));
  env.push_back(const_cast<char*>(cpu_env.c_str()));
  env.push_back(nullptr);
  std::string filter = "--gtest_filter=GpuIpcClient.*";
  char* argv[] = {const_cast<char*>("gpu_ipc_client"), filter.data(), nullptr};
  pid_t pid = 0;
  ASSERT_EQ(posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv, env.data()), 0);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << "the client process died: " << status;
  EXPECT_EQ(WEXITSTATUS(status), 0) << "the client process failed (its output is above)";

  // The client left one region registered and exited: the server still
  // holds it open, lists it, and closes it at shutdown.
  std::unique_ptr<Client> client = Client::Connect(absl::StrCat("127.0.0.1:", (*gpu)->port()));
  absl::StatusOr<v1::ListSharedMemoryResponse> left = client->ListSharedMemory();
  ASSERT_TRUE(left.ok()) << left.status();
  ASSERT_EQ(left->regions_size(), 1);
  EXPECT_EQ(left->regions(0).name(), "left");
  EXPECT_TRUE(left->regions(0).cuda_ipc_handle().empty()) << "a listing hands out no handle";
  EXPECT_EQ(left->regions(0).device_id(), 0);
  gpu->reset();
}

// ---------------------------------------------------------------------------
// The client process.

std::string Bf16Bytes(const std::vector<float>& v) {
  std::string out(v.size() * 2, '\0');
  for (size_t i = 0; i < v.size(); ++i) {
    const uint16_t b = FloatToBf16(v[i]);
    std::memcpy(out.data() + 2 * i, &b, 2);
  }
  return out;
}

std::vector<float> RandomValues(size_t n, std::mt19937_64& rng, float scale) {
  std::normal_distribution<float> d(0.f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// One cudaMalloc of `bytes` on device 0 and its IPC handle, freed at the end.
struct DeviceBlock {
  explicit DeviceBlock(int64_t bytes) : bytes(bytes) {
    EXPECT_EQ(cudaMalloc(&ptr, bytes), cudaSuccess);
    cudaIpcMemHandle_t h;
    EXPECT_EQ(cudaIpcGetMemHandle(&h, ptr), cudaSuccess);
    handle.assign(reinterpret_cast<const char*>(&h), sizeof(h));
  }
  ~DeviceBlock() { cudaFree(ptr); }
  v1::SharedMemoryRegion Region(const std::string& name) const {
    v1::SharedMemoryRegion r;
    r.set_name(name);
    r.set_cuda_ipc_handle(handle);
    r.set_device_id(0);
    r.set_byte_size(bytes);
    return r;
  }
  void Put(int64_t at, const std::string& data) const {
    ASSERT_EQ(
        cudaMemcpy(static_cast<char*>(ptr) + at, data.data(), data.size(), cudaMemcpyHostToDevice),
        cudaSuccess);
  }
  std::string Get(int64_t at, int64_t n) const {
    std::string out(n, '\0');
    EXPECT_EQ(cudaMemcpy(out.data(), static_cast<char*>(ptr) + at, n, cudaMemcpyDeviceToHost),
              cudaSuccess);
    return out;
  }
  void* ptr = nullptr;
  int64_t bytes;
  std::string handle;
};

// The element-wise comparison of a bf16 [M, H] output with the CPU
// reference's, in the layer tolerance (tests/testing/tolerance.h).
void ExpectNearReference(const std::string& got, const std::string& ref) {
  ASSERT_EQ(got.size(), ref.size());
  const size_t n = got.size() / 2;
  std::vector<float> g(n), r(n);
  double sq = 0;
  for (size_t i = 0; i < n; ++i) {
    uint16_t a, b;
    std::memcpy(&a, got.data() + 2 * i, 2);
    std::memcpy(&b, ref.data() + 2 * i, 2);
    g[i] = Bf16ToFloat(a);
    r[i] = Bf16ToFloat(b);
    sq += double(r[i]) * r[i];
  }
  const double rms = std::sqrt(sq / std::max<size_t>(n, 1));
  ASSERT_GT(rms, 0.0);
  int bad = 0;
  for (size_t i = 0; i < n; ++i) {
    if (std::fabs(g[i] - r[i]) > test_util::MoeLayerElementTolerance(r[i], rms) && ++bad <= 5) {
      ADD_FAILURE() << "element " << i << ": " << g[i] << " vs the CPU reference's " << r[i];
    }
  }
  EXPECT_EQ(bad, 0);
}

TEST(GpuIpcClient, RunMoeWithTensorsInThisProcessDeviceMemory) {
  const char* gpu_addr = std::getenv(kGpuEnv);
  const char* cpu_addr = std::getenv(kCpuEnv);
  if (gpu_addr == nullptr || cpu_addr == nullptr) {
    GTEST_SKIP() << "the client half of GpuIpcTest (started by it)";
  }
  ClientOptions options;
  options.deadline = absl::Seconds(60);
  std::unique_ptr<Client> gpu = Client::Connect(gpu_addr, options);
  std::unique_ptr<Client> cpu = Client::Connect(cpu_addr, options);
  std::mt19937_64 rng(test_util::TestSeed("gpu_ipc_test", "KPLAN_IPC_TEST_SEED"));

  // bf16 experts (the fast kplan kernels on the GPU), the same on both.
  v1::ExpertsHeader header;
  header.set_experts_id("ipc");
  header.set_num_experts(kE);
  header.set_hidden_size(kH);
  header.set_intermediate_size(kI);
  header.set_activation("silu");
  header.set_dtype(v1::DTYPE_BFLOAT16);
  std::vector<v1::TensorChunk> chunks(2);
  chunks[0].set_name("w13");
  chunks[1].set_name("w2");
  const std::vector<std::vector<int64_t>> shapes = {{kE, 2 * kI, kH}, {kE, kH, kI}};
  for (int i = 0; i < 2; ++i) {
    chunks[i].set_dtype(v1::DTYPE_BFLOAT16);
    for (int64_t d : shapes[i]) chunks[i].add_shape(d);
    chunks[i].set_data(
        Bf16Bytes(RandomValues(size_t(kE) * kH * (i == 0 ? 2 * kI : kI), rng, 0.06f)));
  }
  absl::StatusOr<v1::LoadExpertsResponse> loaded = gpu->LoadExperts(header, chunks);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ASSERT_TRUE(cpu->LoadExperts(header, chunks).ok());

  // One block for the inputs (and a given top-k), another for the output.
  constexpr int64_t kMaxM = 300;
  DeviceBlock in(kMaxM * (kH * 2 + kE * 4 + 2 * kK * 4) + 4096);
  DeviceBlock out(kMaxM * kH * 2 + 256);
  ASSERT_TRUE(gpu->RegisterSharedMemory(in.Region("in")).ok());
  ASSERT_TRUE(gpu->RegisterSharedMemory(out.Region("out")).ok());

  for (int64_t m : {int64_t{1}, int64_t{37}, kMaxM}) {
    SCOPED_TRACE(absl::StrCat(m, " tokens"));
    v1::RunMoERequest inline_req;
    inline_req.set_experts_id("ipc");
    *inline_req.mutable_hidden_states() =
        MakeTensor(v1::DTYPE_BFLOAT16, {m, kH}, Bf16Bytes(RandomValues(m * kH, rng, 1.f)));
    std::vector<float> logits = RandomValues(m * kE, rng, 1.f);
    *inline_req.mutable_router_logits() =
        MakeTensor(v1::DTYPE_FLOAT32, {m, kE},
                   std::string(reinterpret_cast<char*>(logits.data()), m * kE * 4));
    inline_req.mutable_routing()->set_top_k(kK);
    inline_req.mutable_routing()->set_routing_method("Renormalize");
    inline_req.set_return_routing(true);
    const std::string& x = inline_req.hidden_states().data();
    const std::string& l = inline_req.router_logits().data();
    const int64_t x_at = 0, l_at = x.size() + 4;  // an unaligned offset on purpose
    in.Put(x_at, x);
    in.Put(l_at, l);
    out.Put(0, std::string(out.bytes, '\xff'));

    v1::RunMoERequest req = inline_req;
    req.mutable_hidden_states()->clear_data();
    *req.mutable_hidden_states()->mutable_shm() = Ref("in", x_at, x.size());
    req.mutable_router_logits()->clear_data();
    *req.mutable_router_logits()->mutable_shm() = Ref("in", l_at, l.size());
    *req.mutable_output_shm() = Ref("out", 128, x.size());
    absl::StatusOr<v1::RunMoEResponse> ipc = gpu->RunMoE(req);
    ASSERT_TRUE(ipc.ok()) << ipc.status();
    EXPECT_EQ(ipc->plan().backend(), "kplan");
    EXPECT_TRUE(ipc->output().data().empty());
    EXPECT_THAT(ipc->output().shape(), ::testing::ElementsAre(m, kH));
    EXPECT_EQ(ipc->output().shm().region(), "out");
    const std::string got = out.Get(128, x.size());
    EXPECT_EQ(out.Get(0, 128), std::string(128, '\xff'));  // nothing outside the window
    EXPECT_EQ(out.Get(128 + x.size(), 64), std::string(64, '\xff'));

    absl::StatusOr<v1::RunMoEResponse> gpu_inline = gpu->RunMoE(inline_req);
    ASSERT_TRUE(gpu_inline.ok()) << gpu_inline.status();
    EXPECT_TRUE(got == gpu_inline->output().data()) << "differs from the inline GPU run";
    EXPECT_EQ(ipc->topk_ids().data(), gpu_inline->topk_ids().data());
    absl::StatusOr<v1::RunMoEResponse> reference = cpu->RunMoE(inline_req);
    ASSERT_TRUE(reference.ok()) << reference.status();
    ExpectNearReference(got, reference->output().data());

    // A given top-k in the CUDA region (it comes to the host to be checked).
    v1::RunMoERequest given = req;
    given.clear_router_logits();
    given.clear_routing();
    const std::string& ids = reference->topk_ids().data();
    const std::string& weights = reference->topk_weights().data();
    const int64_t ids_at = l_at + l.size(), w_at = ids_at + ids.size();
    in.Put(ids_at, ids);
    in.Put(w_at, weights);
    *given.mutable_topk_ids() = MakeTensor(v1::DTYPE_INT32, {m, kK}, "");
    *given.mutable_topk_ids()->mutable_shm() = Ref("in", ids_at, ids.size());
    *given.mutable_topk_weights() = MakeTensor(v1::DTYPE_FLOAT32, {m, kK}, "");
    *given.mutable_topk_weights()->mutable_shm() = Ref("in", w_at, weights.size());
    out.Put(0, std::string(out.bytes, '\xff'));
    absl::StatusOr<v1::RunMoEResponse> by_ids = gpu->RunMoE(given);
    ASSERT_TRUE(by_ids.ok()) << by_ids.status();
    v1::RunMoERequest given_inline = inline_req;
    given_inline.clear_router_logits();
    given_inline.clear_routing();
    *given_inline.mutable_topk_ids() = MakeTensor(v1::DTYPE_INT32, {m, kK}, ids);
    *given_inline.mutable_topk_weights() = MakeTensor(v1::DTYPE_FLOAT32, {m, kK}, weights);
    absl::StatusOr<v1::RunMoEResponse> by_ids_inline = gpu->RunMoE(given_inline);
    ASSERT_TRUE(by_ids_inline.ok()) << by_ids_inline.status();
    EXPECT_TRUE(out.Get(128, x.size()) == by_ids_inline->output().data());
  }

  // Errors with real handles, each naming its field.
  absl::Status s;
  v1::RunMoERequest base;
  base.set_experts_id("ipc");
  *base.mutable_hidden_states() = MakeTensor(v1::DTYPE_BFLOAT16, {4, kH}, "");
  *base.mutable_hidden_states()->mutable_shm() = Ref("in", 0, 4 * kH * 2);
  *base.mutable_router_logits() = MakeTensor(v1::DTYPE_FLOAT32, {4, kE}, "");
  *base.mutable_router_logits()->mutable_shm() = Ref("in", 4 * kH * 2, 4 * kE * 4);
  base.mutable_routing()->set_top_k(kK);
  *base.mutable_output_shm() = Ref("out", 0, 4 * kH * 2);
  ASSERT_TRUE(gpu->RunMoE(base).ok());
  struct Case {
    const char* what;
    std::function<void(v1::RunMoERequest&)> edit;
    absl::StatusCode code;
    const char* field;
  };
  const Case cases[] = {
      {"input past the region",
       [&](auto& r) { r.mutable_hidden_states()->mutable_shm()->set_offset(in.bytes - 16); },
       absl::StatusCode::kInvalidArgument, "hidden_states.shm.byte_size"},
      {"negative offset", [](auto& r) { r.mutable_router_logits()->mutable_shm()->set_offset(-4); },
       absl::StatusCode::kInvalidArgument, "router_logits.shm.offset"},
      {"output past the region",
       [&](auto& r) { r.mutable_output_shm()->set_offset(out.bytes - 8); },
       absl::StatusCode::kInvalidArgument, "output_shm.byte_size"},
      {"output size", [](auto& r) { r.mutable_output_shm()->set_byte_size(8); },
       absl::StatusCode::kInvalidArgument, "output_shm.byte_size"},
      {"shape against bytes",
       [](auto& r) {
         r.mutable_hidden_states()->mutable_shm()->set_byte_size(3 * kH * 2);
         r.mutable_output_shm()->set_byte_size(3 * kH * 2);
       },
       absl::StatusCode::kInvalidArgument, "hidden_states"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    v1::RunMoERequest r = base;
    c.edit(r);
    s = gpu->RunMoE(r).status();
    EXPECT_EQ(s.code(), c.code) << s;
    EXPECT_THAT(FieldOf(s).value_or(""), ::testing::StartsWith(c.field)) << s;
  }
  v1::SharedMemoryRegion again = in.Region("again");  // one region per allocation
  s = gpu->RegisterSharedMemory(again);
  EXPECT_EQ(s.code(), absl::StatusCode::kAlreadyExists) << s;
  EXPECT_EQ(FieldOf(s).value_or(""), "region.cuda_ipc_handle");
  DeviceBlock spare(1 << 16);
  v1::SharedMemoryRegion wide = spare.Region("wide");
  wide.set_byte_size(spare.bytes + (4 << 20));  // past the allocation (rounded to 2 MiB)
  s = gpu->RegisterSharedMemory(wide);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_EQ(FieldOf(s).value_or(""), "region.byte_size");
  v1::SharedMemoryRegion other_gpu = in.Region("other");
  other_gpu.set_device_id(57);
  s = gpu->RegisterSharedMemory(other_gpu);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_EQ(FieldOf(s).value_or(""), "region.device_id");
  v1::SharedMemoryRegion forged = in.Region("forged");
  forged.set_cuda_ipc_handle(std::string(64, '\x5a'));
  s = gpu->RegisterSharedMemory(forged);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_EQ(FieldOf(s).value_or(""), "region.cuda_ipc_handle");
  v1::SharedMemoryRegion short_handle = in.Region("short");
  short_handle.set_cuda_ipc_handle("abc");
  s = gpu->RegisterSharedMemory(short_handle);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_EQ(FieldOf(s).value_or(""), "region.cuda_ipc_handle");
  ASSERT_EQ(gpu->ListSharedMemory()->regions_size(), 2);

  // Unregistering while calls use the region: each call either ran (its
  // output right) or found the region gone (NOT_FOUND); nothing else.
  absl::StatusOr<v1::RunMoEResponse> want = gpu->RunMoE(base);
  ASSERT_TRUE(want.ok()) << want.status();
  const std::string want_out = out.Get(0, 4 * kH * 2);
  std::atomic<int> ran{0}, gone{0}, other{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      std::unique_ptr<Client> c = Client::Connect(gpu_addr, options);
      for (int i = 0; i < 25; ++i) {
        absl::StatusOr<v1::RunMoEResponse> r = c->RunMoE(base);
        if (r.ok()) {
          ++ran;
        } else if (absl::IsNotFound(r.status())) {
          ++gone;
        } else {
          ++other;
          ADD_FAILURE() << r.status();
        }
      }
    });
  }
  while (ran.load() < 8 && other.load() == 0) std::this_thread::yield();
  ASSERT_TRUE(gpu->UnregisterSharedMemory("in").ok());
  for (std::thread& t : threads) t.join();
  EXPECT_GE(ran.load(), 8);
  EXPECT_GT(gone.load(), 0);
  EXPECT_EQ(other.load(), 0);
  EXPECT_EQ(out.Get(0, 4 * kH * 2), want_out);
  EXPECT_EQ(gpu->RunMoE(base).status().code(), absl::StatusCode::kNotFound);

  ASSERT_TRUE(gpu->UnregisterSharedMemory("out").ok());
  // Left registered on purpose: the parent checks the server holds it after
  // this process exits, and closes it at shutdown. Its memory stays
  // allocated until then (the server's open handle keeps it).
  static DeviceBlock* left = new DeviceBlock(1 << 20);
  ASSERT_TRUE(gpu->RegisterSharedMemory(left->Region("left")).ok());
}

}  // namespace
}  // namespace kplan::rpc
