// Writes the seed corpus of the fuzz targets: small valid requests in
// protobuf's binary format, one file each, under OUT/<target>/.
//   build-asan/bin/make_fuzz_corpus fuzz/corpus
// Deterministic (fixed seeds), so regenerating changes nothing. Crashing
// inputs found by scripts/fuzz.sh are added next to these by hand
// (crash-<sha1> names) and are not rewritten here.
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "kplan/v1/service.pb.h"

namespace {

using namespace kplan;
namespace fs = std::filesystem;

// fuzz/fuzz_util.h: the stream delimiter and the server_fuzz method bytes.
const std::string kDelimiter = "\xf0KPLAN\xf1";
enum Method : char {
  kResolve = 0,
  kServerInfo = 1,
  kRunIrOp = 2,
  kUnload = 3,
  kList = 4,
  kRunMoE = 5,
  kJoinEp = 6,
  kRunEpStep = 7,
  kLoadExperts = 8,
  kChannelRunMoE = 9,  // through a shared-memory call channel
};

std::mt19937 rng(7);

std::string Floats(size_t n, float scale = 1.f) {
  std::normal_distribution<float> d(0.f, scale);
  std::string s(n * 4, '\0');
  for (size_t i = 0; i < n; ++i) {
    const float f = d(rng);
    std::memcpy(&s[i * 4], &f, 4);
  }
  return s;
}

std::string Bf16(size_t n) {
  std::string f = Floats(n), s(n * 2, '\0');
  for (size_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, &f[i * 4], 4);
    const uint16_t b = static_cast<uint16_t>(bits >> 16);
    std::memcpy(&s[i * 2], &b, 2);
  }
  return s;
}

std::string Ints(const std::vector<int32_t>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * 4);
}

v1::Tensor Tensor(v1::DType dtype, std::vector<int64_t> shape, std::string data) {
  v1::Tensor t;
  t.set_dtype(dtype);
  for (int64_t d : shape) t.add_shape(d);
  t.set_data(std::move(data));
  return t;
}

void Write(const fs::path& dir, const std::string& name, const std::string& bytes) {
  fs::create_directories(dir);
  std::ofstream out(dir / name, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// The expert set of fuzz/fuzz_util.h and server_fuzz: "fuzz", E=4, H=16.
constexpr int64_t kE = 4, kH = 16;

std::vector<v1::RunMoERequest> MoeRequests() {
  std::vector<v1::RunMoERequest> out;
  const char* methods[] = {"RenormalizeNaive", "Renormalize", "Sigmoid", "DeepSeekV3"};
  int m = 1;
  for (const char* method : methods) {
    v1::RunMoERequest r;
    r.set_experts_id("fuzz");
    *r.mutable_hidden_states() = Tensor(v1::DTYPE_BFLOAT16, {m, kH}, Bf16(m * kH));
    *r.mutable_router_logits() = Tensor(v1::DTYPE_FLOAT32, {m, kE}, Floats(m * kE));
    r.mutable_routing()->set_top_k(2);
    r.mutable_routing()->set_routing_method(method);
    if (std::string(method) == "DeepSeekV3") {
      r.mutable_routing()->set_num_expert_group(2);
      r.mutable_routing()->set_topk_group(1);
      r.mutable_routing()->set_routed_scaling_factor(2.5f);
      *r.mutable_routing()->mutable_e_score_correction_bias() =
          Tensor(v1::DTYPE_FLOAT32, {kE}, Floats(kE, 0.1f));
    }
    r.set_return_routing(m % 2 == 1);
    out.push_back(r);
    m += 2;
  }
  {  // float32 activations, given top-k ids and weights
    v1::RunMoERequest r;
    r.set_experts_id("fuzz");
    *r.mutable_hidden_states() = Tensor(v1::DTYPE_FLOAT32, {3, kH}, Floats(3 * kH));
    *r.mutable_topk_ids() = Tensor(v1::DTYPE_INT32, {3, 2}, Ints({0, 1, 2, 3, 3, 0}));
    *r.mutable_topk_weights() = Tensor(v1::DTYPE_FLOAT32, {3, 2}, Floats(6));
    r.mutable_kernel_config()->set_moe_backend("emulation");
    out.push_back(r);
  }
  {  // float16, k = 1 with the weight applied on the input
    v1::RunMoERequest r;
    r.set_experts_id("fuzz");
    *r.mutable_hidden_states() =
        Tensor(v1::DTYPE_FLOAT16, {2, kH}, std::string(2 * kH * 2, '\x3c'));
    *r.mutable_topk_ids() = Tensor(v1::DTYPE_INT32, {2, 1}, Ints({1, 2}));
    *r.mutable_topk_weights() = Tensor(v1::DTYPE_FLOAT32, {2, 1}, Floats(2));
    r.set_apply_router_weight_on_input(true);
    out.push_back(r);
  }
  return out;
}

std::vector<v1::RunIrOpRequest> IrRequests() {
  std::vector<v1::RunIrOpRequest> out;
  auto input = [](v1::RunIrOpRequest& r, const char* name, v1::Tensor t) {
    v1::NamedTensor* n = r.add_inputs();
    n->set_name(name);
    *n->mutable_tensor() = std::move(t);
  };
  {
    v1::RunIrOpRequest r;
    r.set_op("rms_norm");
    input(r, "x", Tensor(v1::DTYPE_FLOAT32, {2, 16}, Floats(32)));
    input(r, "weight", Tensor(v1::DTYPE_FLOAT32, {16}, Floats(16)));
    r.set_epsilon(1e-6);
    out.push_back(r);
  }
  {
    v1::RunIrOpRequest r;
    r.set_op("rms_norm");
    input(r, "x", Tensor(v1::DTYPE_BFLOAT16, {3, 8}, Bf16(24)));
    r.set_epsilon(1e-5);
    r.set_variance_size(4);
    r.add_priority("native");
    r.set_device("cpu");
    out.push_back(r);
  }
  {
    v1::RunIrOpRequest r;
    r.set_op("fused_add_rms_norm");
    input(r, "x", Tensor(v1::DTYPE_FLOAT32, {2, 8}, Floats(16)));
    input(r, "x_residual", Tensor(v1::DTYPE_FLOAT32, {2, 8}, Floats(16)));
    input(r, "weight", Tensor(v1::DTYPE_FLOAT32, {8}, Floats(8)));
    r.set_epsilon(1e-6);
    out.push_back(r);
  }
  {
    v1::RunIrOpRequest r;
    r.set_op("gelu_and_mul_sparse");
    input(r, "x", Tensor(v1::DTYPE_FLOAT16, {2, 16}, std::string(64, '\x3c')));
    r.set_std_multiplier(1.6448536269514722);
    r.set_approximate("tanh");
    out.push_back(r);
  }
  return out;
}

std::vector<v1::ResolveKernelConfigRequest> ResolveRequests() {
  std::vector<v1::ResolveKernelConfigRequest> out;
  auto moe = [](v1::MoELayerConfig* m, int e, int k, int h, int i) {
    m->set_num_experts(e);
    m->set_experts_per_token(k);
    m->set_hidden_dim(h);
    m->set_intermediate_size(i);
    m->set_in_dtype("bfloat16");
  };
  {  // Mixtral on the server's own platform
    v1::ResolveKernelConfigRequest r;
    r.mutable_kernel_config()->set_moe_backend("auto");
    r.mutable_model()->add_architectures("MixtralForCausalLM");
    moe(r.mutable_model()->mutable_moe(), 8, 2, 4096, 14336);
    r.mutable_parallel()->set_tp_size(2);
    out.push_back(r);
  }
  {  // DeepSeek-V3 fp8 block, EP on an H100 with libraries
    v1::ResolveKernelConfigRequest r;
    r.mutable_model()->add_architectures("DeepseekV3ForCausalLM");
    v1::MoELayerConfig* m = r.mutable_model()->mutable_moe();
    moe(m, 256, 8, 7168, 2048);
    m->set_routing_method("DeepSeekV3");
    m->set_num_expert_group(8);
    m->set_topk_group(4);
    m->set_has_e_score_correction_bias(true);
    m->set_weight_quant("kFp8Static128BlockSym");
    m->set_activation_quant("kFp8Dynamic128Sym");
    r.mutable_parallel()->set_dp_size(8);
    r.mutable_parallel()->set_enable_expert_parallel(true);
    r.mutable_parallel()->set_all2all_backend("deepep_low_latency");
    v1::Platform* p = r.mutable_platform();
    p->set_kind(v1::PLATFORM_KIND_CUDA);
    p->mutable_device_capability()->set_major(9);
    p->set_device_name("NVIDIA H100 80GB HBM3");
    p->add_libraries("deep_gemm");
    p->add_libraries("flashinfer");
    (*r.mutable_env())["VLLM_USE_DEEP_GEMM"] = "1";
    out.push_back(r);
  }
  {  // IR priorities and a ROCm platform, two layers
    v1::ResolveKernelConfigRequest r;
    v1::KernelConfig* kc = r.mutable_kernel_config();
    kc->set_moe_backend("triton");
    kc->mutable_ir_op_priority()->add_rms_norm("aiter");
    kc->mutable_ir_op_priority()->add_rms_norm("native");
    kc->set_enable_jit_warmup(false);
    (*kc->mutable_linear_backend_per_quant())["fp8"] = "auto";
    moe(r.mutable_model()->add_moe_layers(), 64, 6, 2048, 1408);
    moe(r.mutable_model()->add_moe_layers(), 128, 8, 4096, 1536);
    v1::Platform* p = r.mutable_platform();
    p->set_kind(v1::PLATFORM_KIND_ROCM);
    p->set_gcn_arch_name("gfx942");
    p->add_libraries("aiter");
    out.push_back(r);
  }
  return out;
}

// LoadExperts streams (header, then chunks), each message serialized, cut
// by kDelimiter.
std::vector<std::string> LoadStreams() {
  std::vector<std::string> out;
  for (int variant = 0; variant < 3; ++variant) {
    const int e = 2, h = 4, i = 8;
    std::vector<std::string> msgs;
    v1::LoadExpertsRequest head;
    v1::ExpertsHeader* hd = head.mutable_header();
    hd->set_experts_id(variant == 0 ? "seed" : "seed" + std::to_string(variant));
    hd->set_num_experts(e);
    hd->set_hidden_size(h);
    hd->set_intermediate_size(i);
    hd->set_activation(variant == 2 ? "gelu" : "silu");
    const bool bf16 = variant == 1;
    hd->set_dtype(bf16 ? v1::DTYPE_BFLOAT16 : v1::DTYPE_FLOAT32);
    if (variant == 2) hd->set_has_bias(true);
    msgs.push_back(head.SerializeAsString());
    struct T {
      const char* name;
      std::vector<int64_t> shape;
    };
    std::vector<T> tensors = {{"w13", {e, 2 * i, h}}, {"w2", {e, h, i}}};
    if (variant == 2) {
      tensors.push_back({"w13_bias", {e, 2 * i}});
      tensors.push_back({"w2_bias", {e, h}});
    }
    for (const T& t : tensors) {
      int64_t n = 1;
      for (int64_t d : t.shape) n *= d;
      const std::string data = bf16 ? Bf16(n) : Floats(n);
      // Two chunks: the first carries dtype and shape.
      const size_t half = data.size() / 2;
      v1::LoadExpertsRequest a, b;
      a.mutable_chunk()->set_name(t.name);
      a.mutable_chunk()->set_dtype(bf16 ? v1::DTYPE_BFLOAT16 : v1::DTYPE_FLOAT32);
      for (int64_t d : t.shape) a.mutable_chunk()->add_shape(d);
      a.mutable_chunk()->set_data(data.substr(0, half));
      b.mutable_chunk()->set_name(t.name);
      b.mutable_chunk()->set_offset(static_cast<int64_t>(half));
      b.mutable_chunk()->set_data(data.substr(half));
      msgs.push_back(a.SerializeAsString());
      msgs.push_back(b.SerializeAsString());
    }
    std::string joined;
    for (size_t k = 0; k < msgs.size(); ++k) {
      if (k) joined += kDelimiter;
      joined += msgs[k];
    }
    out.push_back(joined);
  }
  {  // a safetensors source (never opened by load_experts_fuzz)
    v1::LoadExpertsRequest head;
    v1::ExpertsHeader* hd = head.mutable_header();
    hd->set_experts_id("st");
    hd->set_num_experts(2);
    hd->set_hidden_size(4);
    hd->set_intermediate_size(8);
    hd->set_dtype(v1::DTYPE_BFLOAT16);
    hd->mutable_safetensors()->set_path("/nonexistent/model.safetensors");
    hd->mutable_safetensors()->set_w13("experts.w13_weight");
    hd->mutable_safetensors()->set_w2("experts.w2_weight");
    out.push_back(head.SerializeAsString());
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_fuzz_corpus OUT_DIR\n");
    return 2;
  }
  const fs::path root = argv[1];
  auto server = [&](Method m, const std::string& name, const std::string& bytes) {
    Write(root / "server_fuzz", name, std::string(1, static_cast<char>(m)) + bytes);
  };
  int n = 0;
  for (const v1::RunMoERequest& r : MoeRequests()) {
    const std::string name = "seed-" + std::to_string(n++);
    Write(root / "run_moe_fuzz", name, r.SerializeAsString());
    server(kRunMoE, "runmoe-" + name, r.SerializeAsString());
    server(kChannelRunMoE, "channel-runmoe-" + name, r.SerializeAsString());
  }
  n = 0;
  for (const v1::RunIrOpRequest& r : IrRequests()) {
    const std::string name = "seed-" + std::to_string(n++);
    Write(root / "run_ir_op_fuzz", name, r.SerializeAsString());
    server(kRunIrOp, "runirop-" + name, r.SerializeAsString());
  }
  n = 0;
  for (const v1::ResolveKernelConfigRequest& r : ResolveRequests()) {
    const std::string name = "seed-" + std::to_string(n++);
    Write(root / "resolve_fuzz", name, r.SerializeAsString());
    server(kResolve, "resolve-" + name, r.SerializeAsString());
  }
  n = 0;
  for (const std::string& s : LoadStreams()) {
    const std::string name = "seed-" + std::to_string(n++);
    Write(root / "load_experts_fuzz", name, s);
    server(kLoadExperts, "loadexperts-" + name, s);
  }
  server(kServerInfo, "serverinfo", "");
  server(kList, "listexperts", "");
  {
    v1::UnloadExpertsRequest u;
    u.set_experts_id("seed");
    server(kUnload, "unload-seed", u.SerializeAsString());
  }
  {
    v1::JoinEpGroupRequest j;
    j.set_rank(1);
    j.set_size(2);
    j.set_address("127.0.0.1:1");
    j.set_device("cpu");
    server(kJoinEp, "joinep", j.SerializeAsString());
    server(kRunEpStep, "runepstep", "");
  }
  // run_moe_shape_fuzz reads raw bytes (FuzzedDataProvider): a few fixed
  // byte strings of different lengths.
  for (int i = 0; i < 4; ++i) {
    std::string bytes(64 + 256 * i, '\0');
    for (char& c : bytes) c = static_cast<char>(rng());
    Write(root / "run_moe_shape_fuzz", "seed-" + std::to_string(i), bytes);
  }
  std::printf("make_fuzz_corpus: wrote %s\n", root.c_str());
  return 0;
}
