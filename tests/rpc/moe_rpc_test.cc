// LoadExperts / ListExperts / RunMoE / UnloadExperts through the server on
// the CPU path, checked against a straightforward double-precision MoE written
// here (softmax, top-k, renormalise, SiLU-and-mul experts, weighted sum).
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <numeric>
#include <random>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_replace.h"
#include "client/cpp/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "base/status.h"
#include "server/rpc/raw_service.h"
#include "server/rpc/server.h"
#include "tests/rpc/moe_rpc_util.h"

namespace kplan::rpc {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr int kE = 4, kK = 2, kH = 16, kI = 8;

using testing::Bytes;
using testing::MakeTensor;
using testing::Random;
using testing::Ref;

v1::TensorChunk Chunk(const std::string& name, std::vector<int64_t> shape, const std::string& data,
                      size_t begin, size_t end) {
  v1::TensorChunk c;
  c.set_name(name);
  if (begin == 0) {
    c.set_dtype(v1::DTYPE_FLOAT32);
    for (int64_t d : shape) c.add_shape(d);
  }
  c.set_offset(static_cast<int64_t>(begin));
  c.set_data(data.substr(begin, end - begin));
  return c;
}

class MoeRpcTest : public ::testing::Test {
 protected:
  void SetUp() override {
    static NoDeviceProber prober;
    ServerOptions options;
    options.listen_address = "127.0.0.1:0";
    options.prober = &prober;
    options.max_expert_bytes = 64 << 10;
    options.model_roots = {::testing::TempDir()};  // server-side loads from the test's files
    server_ = std::move(KplanServer::Start(options).value());
    client_ = Client::Connect(absl::StrCat("127.0.0.1:", server_->port()));
    std::mt19937 rng(std::random_device{}());
    w13_ = Random(kE * 2 * kI * kH, rng, 0.3f);
    w2_ = Random(kE * kH * kI, rng, 0.3f);
  }

  v1::ExpertsHeader Header(const std::string& id) const {
    return testing::Float32Header(id, kE, kH, kI);
  }

  // w13 in three chunks, w2 in one.
  std::vector<v1::TensorChunk> Chunks() const {
    const std::string a = Bytes(w13_), b = Bytes(w2_);
    return {Chunk("w13", {kE, 2 * kI, kH}, a, 0, 100), Chunk("w13", {}, a, 100, 1000),
            Chunk("w13", {}, a, 1000, a.size()), Chunk("w2", {kE, kH, kI}, b, 0, b.size())};
  }

  // The layer in double precision, independent of the server's code.
  std::vector<double> Reference(const std::vector<float>& x, const std::vector<float>& logits,
                                int m) const {
    std::vector<double> out(m * kH, 0.0);
    for (int t = 0; t < m; ++t) {
      std::vector<double> p(kE);
      double mx = *std::max_element(&logits[t * kE], &logits[t * kE] + kE), sum = 0;
      for (int e = 0; e < kE; ++e) sum += p[e] = std::exp(logits[t * kE + e] - mx);
      for (double& v : p) v /= sum;
      std::vector<int> order(kE);
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return p[a] > p[b]; });
      double wsum = p[order[0]] + p[order[1]];
      for (int j = 0; j < kK; ++j) {
        const int e = order[j];
        std::vector<double> act(kI);
        for (int i = 0; i < kI; ++i) {
          double g = 0, u = 0;
          for (int h = 0; h < kH; ++h) {
            g += double(w13_[(e * 2 * kI + i) * kH + h]) * x[t * kH + h];
            u += double(w13_[(e * 2 * kI + kI + i) * kH + h]) * x[t * kH + h];
          }
          act[i] = g / (1 + std::exp(-g)) * u;
        }
        for (int h = 0; h < kH; ++h) {
          double y = 0;
          for (int i = 0; i < kI; ++i) y += double(w2_[(e * kH + h) * kI + i]) * act[i];
          out[t * kH + h] += p[e] / wsum * y;
        }
      }
    }
    return out;
  }

  // The fixture's weights as a stacked safetensors file in the temporary
  // directory (the server's model root); its path.
  std::string WriteStackedFile(const std::string& name) const {
    const std::string a = Bytes(w13_), b = Bytes(w2_);
    const std::string header = absl::StrCat(
        "{\"w13\":{\"dtype\":\"F32\",\"shape\":[", kE, ",", 2 * kI, ",", kH,
        "],\"data_offsets\":[0,", a.size(), "]},\"w2\":{\"dtype\":\"F32\",\"shape\":[", kE, ",", kH,
        ",", kI, "],\"data_offsets\":[", a.size(), ",", a.size() + b.size(), "]}}");
    const std::string path = absl::StrCat(::testing::TempDir(), "/", name);
    uint64_t n = header.size();  // little-endian hosts only, as the file format
    std::ofstream f(path, std::ios::binary);
    f.write(reinterpret_cast<const char*>(&n), 8);
    f << header << a << b;
    return path;
  }

  std::unique_ptr<KplanServer> server_;
  std::unique_ptr<Client> client_;
  std::vector<float> w13_, w2_;
};

TEST_F(MoeRpcTest, LoadRunListUnload) {
  absl::StatusOr<v1::LoadExpertsResponse> loaded = client_->LoadExperts(Header("layer0"), Chunks());
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->experts().bytes(), static_cast<int64_t>((w13_.size() + w2_.size()) * 4));
  ASSERT_EQ(loaded->experts().placement_size(), 1);
  EXPECT_EQ(loaded->experts().placement(0).device(), "cpu");

  std::mt19937 rng(std::random_device{}());
  const int m = 5;
  std::vector<float> x = Random(m * kH, rng, 1.f), logits = Random(m * kE, rng, 1.f);
  v1::RunMoERequest req;
  req.set_experts_id("layer0");
  *req.mutable_hidden_states() = MakeTensor(v1::DTYPE_FLOAT32, {m, kH}, Bytes(x));
  *req.mutable_router_logits() = MakeTensor(v1::DTYPE_FLOAT32, {m, kE}, Bytes(logits));
  req.mutable_routing()->set_top_k(kK);
  req.mutable_routing()->set_routing_method("RenormalizeNaive");
  req.set_return_routing(true);
  req.set_explain(true);
  absl::StatusOr<v1::RunMoEResponse> run = client_->RunMoE(req);
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->plan().backend(), "emulation");
  EXPECT_EQ(run->plan().experts_kernel(), "KplanEmulationExperts");
  EXPECT_EQ(run->plan().dispatch(), "MoEPrepareAndFinalizeNoDPEPModular");
  EXPECT_THAT(run->plan().devices(), ::testing::ElementsAre("cpu"));
  // The oracle's loop over what this CPU server runs: emulation, accepted.
  ASSERT_EQ(run->plan().candidates_size(), 1);
  EXPECT_EQ(run->plan().candidates(0).backend(), "EMULATION");
  EXPECT_TRUE(run->plan().candidates(0).accepted());
  const v1::MoETiming& t = run->timing();
  EXPECT_GT(t.device_us(), 0);
  EXPECT_GE(t.total_us(), t.device_us());
  // Every hop stamped, in order, since the request's bytes arrived.
  EXPECT_GT(t.decoded_at_us(), 0);
  EXPECT_LE(t.decoded_at_us(), t.queued_at_us());
  EXPECT_LE(t.queued_at_us(), t.device_start_at_us());
  EXPECT_LE(t.device_start_at_us(), t.device_end_at_us());
  EXPECT_LE(t.device_end_at_us(), t.encoded_at_us());
  EXPECT_EQ(t.encoded_at_us(), t.total_us());
  EXPECT_NEAR(t.device_end_at_us() - t.device_start_at_us(), t.device_us(), 1.0);
  ASSERT_EQ(run->output().data().size(), static_cast<size_t>(m * kH * 4));
  std::vector<float> out(m * kH);
  std::memcpy(out.data(), run->output().data().data(), out.size() * 4);
  std::vector<double> ref = Reference(x, logits, m);
  for (int i = 0; i < m * kH; ++i) EXPECT_NEAR(out[i], ref[i], 1e-4 + 1e-4 * std::abs(ref[i])) << i;
  EXPECT_EQ(run->topk_ids().shape(1), kK);

  // Given ids and weights give the same output as routing them.
  v1::RunMoERequest by_ids;
  by_ids.set_experts_id("layer0");
  *by_ids.mutable_hidden_states() = req.hidden_states();
  *by_ids.mutable_topk_ids() = run->topk_ids();
  *by_ids.mutable_topk_weights() = run->topk_weights();
  absl::StatusOr<v1::RunMoEResponse> again = client_->RunMoE(by_ids);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->output().data(), run->output().data());
  // Without explain the plan names what ran, and no candidates come.
  EXPECT_EQ(again->plan().backend(), "emulation");
  EXPECT_EQ(again->plan().candidates_size(), 0);

  EXPECT_EQ(client_->ListExperts()->experts_size(), 1);
  EXPECT_EQ(client_->UnloadExperts("layer0")->bytes_freed(), loaded->experts().bytes());
  EXPECT_EQ(client_->ListExperts()->experts_size(), 0);
  EXPECT_EQ(client_->RunMoE(req).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(client_->UnloadExperts("layer0").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(MoeRpcTest, FailedLoadsLeaveNothingBehind) {
  struct Case {
    std::string name;
    std::function<void(v1::ExpertsHeader&, std::vector<v1::TensorChunk>&)> mutate;
    absl::StatusCode code;
    std::string field;
  };
  const std::vector<Case> cases = {
      {"missing chunk", [](auto&, auto& c) { c.pop_back(); }, absl::StatusCode::kInvalidArgument,
       "chunk[w2]"},
      {"truncated tensor", [](auto&, auto& c) { c[2].mutable_data()->resize(8); },
       absl::StatusCode::kInvalidArgument, "chunk[w13]"},
      {"wrong shape", [](auto&, auto& c) { c[0].set_shape(1, 99); },
       absl::StatusCode::kInvalidArgument, "chunk[w13].shape"},
      {"wrong dtype", [](auto&, auto& c) { c[3].set_dtype(v1::DTYPE_BFLOAT16); },
       absl::StatusCode::kInvalidArgument, "chunk[w2].dtype"},
      {"out of order", [](auto&, auto& c) { std::swap(c[1], c[2]); },
       absl::StatusCode::kInvalidArgument, "chunk[w13].offset"},
      {"unknown tensor", [](auto&, auto& c) { c[3].set_name("w4"); },
       absl::StatusCode::kInvalidArgument, "chunk[w4]"},
      {"bad activation", [](auto& h, auto&) { h.set_activation("swish"); },
       absl::StatusCode::kInvalidArgument, "header.activation"},
      {"over budget", [](auto& h, auto&) { h.set_num_experts(400); },
       absl::StatusCode::kResourceExhausted, ""},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    v1::ExpertsHeader h = Header("bad");
    std::vector<v1::TensorChunk> chunks = Chunks();
    c.mutate(h, chunks);
    absl::StatusOr<v1::LoadExpertsResponse> r = client_->LoadExperts(h, chunks);
    EXPECT_EQ(r.status().code(), c.code) << r.status();
    if (!c.field.empty()) {
      EXPECT_EQ(FieldOf(r.status()).value_or(""), c.field) << r.status();
    }
    EXPECT_EQ(client_->ListExperts()->experts_size(), 0);
  }
  ASSERT_TRUE(client_->LoadExperts(Header("dup"), Chunks()).ok());
  absl::StatusOr<v1::LoadExpertsResponse> dup = client_->LoadExperts(Header("dup"), Chunks());
  EXPECT_EQ(dup.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(client_->ListExperts()->experts_size(), 1);
}

// A request mutated one way and the error it must get.
struct RequestCase {
  std::string name;
  std::function<void(v1::RunMoERequest&)> mutate;
  absl::StatusCode code;
  std::string field;
};

void ExpectErrors(Client& client, const v1::RunMoERequest& base,
                  const std::vector<RequestCase>& cases) {
  for (const RequestCase& c : cases) {
    SCOPED_TRACE(c.name);
    v1::RunMoERequest req = base;
    c.mutate(req);
    absl::Status s = client.RunMoE(req).status();
    EXPECT_EQ(s.code(), c.code) << s;
    EXPECT_EQ(FieldOf(s).value_or(""), c.field) << s;
  }
}

TEST_F(MoeRpcTest, RunMoeErrorsNameTheField) {
  ASSERT_TRUE(client_->LoadExperts(Header("l"), Chunks()).ok());
  std::mt19937 rng(3);
  std::vector<float> x = Random(2 * kH, rng, 1.f), logits = Random(2 * kE, rng, 1.f);
  auto base = [&] {
    v1::RunMoERequest r;
    r.set_experts_id("l");
    *r.mutable_hidden_states() = MakeTensor(v1::DTYPE_FLOAT32, {2, kH}, Bytes(x));
    *r.mutable_router_logits() = MakeTensor(v1::DTYPE_FLOAT32, {2, kE}, Bytes(logits));
    r.mutable_routing()->set_top_k(2);
    return r;
  };
  const std::vector<RequestCase> cases = {
      {"hidden width", [](auto& r) { r.mutable_hidden_states()->set_shape(1, 15); },
       absl::StatusCode::kInvalidArgument, "hidden_states.shape"},
      {"short data", [](auto& r) { r.mutable_hidden_states()->mutable_data()->resize(4); },
       absl::StatusCode::kInvalidArgument, "hidden_states.data"},
      {"int8 hidden", [](auto& r) { r.mutable_hidden_states()->set_dtype(v1::DTYPE_INT8); },
       absl::StatusCode::kInvalidArgument, "hidden_states.dtype"},
      {"top_k too big", [](auto& r) { r.mutable_routing()->set_top_k(9); },
       absl::StatusCode::kInvalidArgument, "routing.top_k"},
      {"unknown routing", [](auto& r) { r.mutable_routing()->set_routing_method("Magic"); },
       absl::StatusCode::kInvalidArgument, "routing.routing_method"},
      {"no routing input", [](auto& r) { r.clear_router_logits(); },
       absl::StatusCode::kInvalidArgument, "router_logits"},
      {"backend not here", [](auto& r) { r.mutable_kernel_config()->set_moe_backend("kplan"); },
       absl::StatusCode::kFailedPrecondition, "kernel_config.moe_backend"},
      {"vLLM backend", [](auto& r) { r.mutable_kernel_config()->set_moe_backend("Triton"); },
       absl::StatusCode::kFailedPrecondition, "kernel_config.moe_backend"},
      {"no such backend", [](auto& r) { r.mutable_kernel_config()->set_moe_backend("warp"); },
       absl::StatusCode::kInvalidArgument, "kernel_config.moe_backend"},
      {"unknown experts", [](auto& r) { r.set_experts_id("nope"); }, absl::StatusCode::kNotFound,
       "experts_id"},
  };
  ExpectErrors(*client_, base(), cases);
  EXPECT_TRUE(client_->RunMoE(base()).ok());
}

// A Hugging Face style per-expert safetensors file, and a truncated copy.
TEST_F(MoeRpcTest, LoadsPerExpertSafetensors) {
  std::string header = "{";
  std::string data;
  auto add = [&](const std::string& name, std::vector<int64_t> shape, const float* v, size_t n) {
    if (header.size() > 1) header += ",";
    header += absl::StrCat("\"", name, "\":{\"dtype\":\"F32\",\"shape\":[", shape[0], ",", shape[1],
                           "],\"data_offsets\":[", data.size(), ",", data.size() + n * 4, "]}");
    data.append(reinterpret_cast<const char*>(v), n * 4);
  };
  for (int e = 0; e < kE; ++e) {
    const std::string p = absl::StrCat("model.layers.0.mlp.experts.", e, ".");
    add(p + "gate_proj.weight", {kI, kH}, &w13_[e * 2 * kI * kH], kI * kH);
    add(p + "up_proj.weight", {kI, kH}, &w13_[(e * 2 * kI + kI) * kH], kI * kH);
    add(p + "down_proj.weight", {kH, kI}, &w2_[e * kH * kI], kH * kI);
  }
  header += "}";
  const std::string path =
      absl::StrCat(::testing::TempDir(), "/experts-", getpid(), ".safetensors");
  uint64_t n = header.size();
  {
    std::ofstream f(path, std::ios::binary);
    f.write(reinterpret_cast<const char*>(&n), 8);
    f << header << data;
  }
  v1::ExpertsHeader h = Header("st");
  h.mutable_safetensors()->set_path(path);
  h.mutable_safetensors()->set_gate_proj("model.layers.0.mlp.experts.{e}.gate_proj.weight");
  h.mutable_safetensors()->set_up_proj("model.layers.0.mlp.experts.{e}.up_proj.weight");
  h.mutable_safetensors()->set_down_proj("model.layers.0.mlp.experts.{e}.down_proj.weight");
  absl::StatusOr<v1::LoadExpertsResponse> st = client_->LoadExperts(h, {});
  ASSERT_TRUE(st.ok()) << st.status();
  ASSERT_TRUE(client_->LoadExperts(Header("inline"), Chunks()).ok());

  // Same weights, same outputs.
  std::mt19937 rng(11);
  std::vector<float> x = Random(3 * kH, rng, 1.f), logits = Random(3 * kE, rng, 1.f);
  std::string outputs[2];
  for (int i = 0; i < 2; ++i) {
    v1::RunMoERequest r;
    r.set_experts_id(i == 0 ? "st" : "inline");
    *r.mutable_hidden_states() = MakeTensor(v1::DTYPE_FLOAT32, {3, kH}, Bytes(x));
    *r.mutable_router_logits() = MakeTensor(v1::DTYPE_FLOAT32, {3, kE}, Bytes(logits));
    r.mutable_routing()->set_top_k(kK);
    outputs[i] = client_->RunMoE(r)->output().data();
  }
  EXPECT_EQ(outputs[0], outputs[1]);

  // A truncated file is rejected and leaves nothing.
  truncate(path.c_str(), static_cast<off_t>(8 + header.size() + data.size() / 2));
  h.set_experts_id("st2");
  absl::StatusOr<v1::LoadExpertsResponse> bad = client_->LoadExperts(h, {});
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("truncated"));
  EXPECT_EQ(client_->ListExperts()->experts_size(), 2);
  unlink(path.c_str());
}

// Server-side loads need --model_root; under it they load (relative paths
// from the first root), and every path refused outside it, missing or not,
// gets the same answer.
TEST_F(MoeRpcTest, SafetensorsLoadsOnlyUnderModelRoots) {
  const std::string a = Bytes(w13_), b = Bytes(w2_);
  const std::string name = absl::StrCat("stacked-", getpid(), ".safetensors");
  const std::string path = WriteStackedFile(name);
  v1::ExpertsHeader h = Header("st-root");
  h.mutable_safetensors()->set_path(path);
  h.mutable_safetensors()->set_w13("w13");
  h.mutable_safetensors()->set_w2("w2");

  // A server without --model_root refuses before it touches the path.
  static NoDeviceProber prober;
  ServerOptions options;
  options.listen_address = "127.0.0.1:0";
  options.prober = &prober;
  std::unique_ptr<KplanServer> no_roots = std::move(KplanServer::Start(options).value());
  std::unique_ptr<Client> client = Client::Connect(absl::StrCat("127.0.0.1:", no_roots->port()));
  absl::StatusOr<v1::LoadExpertsResponse> off = client->LoadExperts(h, {});
  EXPECT_EQ(off.status().code(), absl::StatusCode::kPermissionDenied) << off.status();
  EXPECT_EQ(FieldOf(off.status()).value_or(""), "header.safetensors.path") << off.status();
  EXPECT_THAT(std::string(off.status().message()), HasSubstr("--model_root"));
  EXPECT_EQ(client->ListExperts()->experts_size(), 0);

  // This fixture's server has the temporary directory as its root.
  absl::StatusOr<v1::LoadExpertsResponse> loaded = client_->LoadExperts(h, {});
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->experts().bytes(), static_cast<int64_t>(a.size() + b.size()));
  h.set_experts_id("st-relative");
  h.mutable_safetensors()->set_path(name);
  EXPECT_TRUE(client_->LoadExperts(h, {}).ok());

  // Outside the root, missing, through "..", a device: one answer.
  std::vector<absl::Status> refused;
  for (const std::string& p : {std::string("/etc/passwd"), path + ".missing",
                               std::string("../../../../../../../../etc/passwd"),
                               std::string("/dev/zero"), std::string("/proc/self/mem")}) {
    h.set_experts_id("st-refused");
    h.mutable_safetensors()->set_path(p);
    refused.push_back(client_->LoadExperts(h, {}).status());
  }
  for (const absl::Status& s : refused) {
    EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
    EXPECT_EQ(s.message(), refused.front().message()) << s;
    EXPECT_EQ(FieldOf(s).value_or(""), "header.safetensors.path") << s;
    EXPECT_THAT(std::string(s.message()), Not(HasSubstr("passwd")));
  }
  EXPECT_EQ(client_->ListExperts()->experts_size(), 2);
  unlink(path.c_str());
}

// A random float32 set of any shape, as one header and whole-tensor chunks.
std::pair<v1::ExpertsHeader, std::vector<v1::TensorChunk>> RandomSet(const std::string& id, int e,
                                                                     int h, int i,
                                                                     std::mt19937& rng) {
  v1::ExpertsHeader header = testing::Float32Header(id, e, h, i);
  std::vector<v1::TensorChunk> chunks = {
      testing::Chunk("w13", {e, 2 * i, h}, Bytes(Random(size_t(e) * 2 * i * h, rng, 0.3f))),
      testing::Chunk("w2", {e, h, i}, Bytes(Random(size_t(e) * h * i, rng, 0.3f)))};
  return {header, chunks};
}

v1::RunMoERequest LogitsRequest(const std::string& id, int m, int h, int e, int k,
                                std::mt19937& rng) {
  v1::RunMoERequest r;
  r.set_experts_id(id);
  *r.mutable_hidden_states() = MakeTensor(v1::DTYPE_FLOAT32, {m, h}, Bytes(Random(m * h, rng, 1)));
  *r.mutable_router_logits() = MakeTensor(v1::DTYPE_FLOAT32, {m, e}, Bytes(Random(m * e, rng, 1)));
  r.mutable_routing()->set_top_k(k);
  return r;
}

// M = 0: the output is [0, H] (the set's hidden size), routed or by ids.
TEST_F(MoeRpcTest, EmptyBatchIsZeroByHidden) {
  ASSERT_TRUE(client_->LoadExperts(Header("l"), Chunks()).ok());
  std::mt19937 rng(5);
  v1::RunMoERequest by_logits = LogitsRequest("l", 0, kH, kE, kK, rng);
  by_logits.set_return_routing(true);
  v1::RunMoERequest by_ids;
  by_ids.set_experts_id("l");
  *by_ids.mutable_hidden_states() = MakeTensor(v1::DTYPE_FLOAT32, {0, kH}, "");
  *by_ids.mutable_topk_ids() = MakeTensor(v1::DTYPE_INT32, {0, kK}, "");
  *by_ids.mutable_topk_weights() = MakeTensor(v1::DTYPE_FLOAT32, {0, kK}, "");
  for (const v1::RunMoERequest& req : {by_logits, by_ids}) {
    absl::StatusOr<v1::RunMoEResponse> run = client_->RunMoE(req);
    ASSERT_TRUE(run.ok()) << run.status();
    EXPECT_THAT(run->output().shape(), ::testing::ElementsAre(0, kH));
    EXPECT_EQ(run->output().dtype(), v1::DTYPE_FLOAT32);
    EXPECT_TRUE(run->output().data().empty());
  }
  absl::StatusOr<v1::RunMoEResponse> routed = client_->RunMoE(by_logits);
  ASSERT_TRUE(routed.ok()) << routed.status();
  EXPECT_THAT(routed->topk_ids().shape(), ::testing::ElementsAre(0, kK));
}

// The route is chosen once per kind of call and set; an unload drops it,
// and a set loaded again under the id with another shape gets a new one.
TEST_F(MoeRpcTest, RouteIsCachedAndDroppedAtUnload) {
  MoeRouteCache* routes = server_->environment().routes;
  ASSERT_NE(routes, nullptr);
  std::mt19937 rng(9);
  auto [header, chunks] = RandomSet("r", 4, 16, 8, rng);
  ASSERT_TRUE(client_->LoadExperts(header, chunks).ok());
  const int64_t before = routes->misses();
  for (int i = 0; i < 3; ++i)
    ASSERT_TRUE(client_->RunMoE(LogitsRequest("r", 2, 16, 4, 2, rng)).ok());
  EXPECT_EQ(routes->misses(), before + 1);
  // Same bucket (2 tokens), then another top_k and another bucket: new routes.
  ASSERT_TRUE(client_->RunMoE(LogitsRequest("r", 2, 16, 4, 1, rng)).ok());
  ASSERT_TRUE(client_->RunMoE(LogitsRequest("r", 7, 16, 4, 2, rng)).ok());
  EXPECT_EQ(routes->misses(), before + 3);
  EXPECT_EQ(routes->size(), 3u);
  // An explain request takes the cached route and still gets the candidates.
  v1::RunMoERequest explain = LogitsRequest("r", 2, 16, 4, 2, rng);
  explain.set_explain(true);
  absl::StatusOr<v1::RunMoEResponse> explained = client_->RunMoE(explain);
  ASSERT_TRUE(explained.ok()) << explained.status();
  EXPECT_EQ(routes->misses(), before + 3);
  EXPECT_EQ(explained->plan().candidates_size(), 1);

  ASSERT_TRUE(client_->UnloadExperts("r").ok());
  EXPECT_EQ(routes->size(), 0u);
  auto [wide, wide_chunks] = RandomSet("r", 2, 32, 8, rng);
  ASSERT_TRUE(client_->LoadExperts(wide, wide_chunks).ok());
  absl::StatusOr<v1::RunMoEResponse> run = client_->RunMoE(LogitsRequest("r", 2, 32, 2, 2, rng));
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_THAT(run->output().shape(), ::testing::ElementsAre(2, 32));
  EXPECT_EQ(routes->misses(), before + 4);
  // The old shape is refused by the new set, not served by an old route.
  EXPECT_EQ(client_->RunMoE(LogitsRequest("r", 2, 16, 4, 2, rng)).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(MoeRouteCacheTest, BucketsAndBound) {
  EXPECT_EQ(MoeRouteCache::TokenBucket(0), 0);
  EXPECT_EQ(MoeRouteCache::TokenBucket(1), 1);
  EXPECT_EQ(MoeRouteCache::TokenBucket(5), 8);
  EXPECT_EQ(MoeRouteCache::TokenBucket(512), 512);
}

// skip_device: refused unless the server allows it; then the whole path
// runs without the layer and answers zeros of [M, H], every hop stamped.
TEST_F(MoeRpcTest, SkipDeviceOnlyWhenTheServerAllowsIt) {
  ASSERT_TRUE(client_->LoadExperts(Header("l"), Chunks()).ok());
  std::mt19937 rng(4);
  v1::RunMoERequest req = LogitsRequest("l", 3, kH, kE, kK, rng);
  req.set_skip_device(true);
  absl::StatusOr<v1::RunMoEResponse> refused = client_->RunMoE(req);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();
  EXPECT_EQ(FieldOf(refused.status()).value_or(""), "skip_device");

  static NoDeviceProber prober;
  ServerOptions options;
  options.listen_address = "127.0.0.1:0";
  options.prober = &prober;
  options.allow_skip_device = true;
  options.metrics_listen = "127.0.0.1:0";
  std::unique_ptr<KplanServer> server = std::move(KplanServer::Start(options).value());
  std::unique_ptr<Client> client = Client::Connect(absl::StrCat("127.0.0.1:", server->port()));
  ASSERT_TRUE(client->LoadExperts(Header("l"), Chunks()).ok());
  // On the gRPC thread (--inline_runs), as it would on an idle GPU. A call
  // runs inline only when the worker is idle, and the worker may still be
  // ending the load's last job when the answer is back: a few tries.
  DeviceExecutor& executor = *server->environment().executor;
  int runs = 0;
  absl::StatusOr<v1::RunMoEResponse> run;
  for (; runs < 50 && executor.inline_runs() == 0; ++runs) {
    if (runs > 0) absl::SleepFor(absl::Milliseconds(10));
    run = client->RunMoE(req);
    ASSERT_TRUE(run.ok()) << run.status();
  }
  EXPECT_EQ(executor.inline_runs(), 1);
  EXPECT_THAT(run->output().shape(), ::testing::ElementsAre(3, kH));
  EXPECT_EQ(run->output().data(), std::string(3 * kH * 4, '\0'));
  EXPECT_GT(run->timing().device_start_at_us(), 0);
  EXPECT_LE(run->timing().device_end_at_us(), run->timing().total_us());
  // Its input is still checked.
  req.mutable_hidden_states()->set_shape(1, kH + 1);
  EXPECT_EQ(client->RunMoE(req).status().code(), absl::StatusCode::kInvalidArgument);
  req.set_skip_device(false);
  req.mutable_hidden_states()->set_shape(1, kH);
  absl::StatusOr<v1::RunMoEResponse> real = client->RunMoE(req);
  ASSERT_TRUE(real.ok()) << real.status();
  EXPECT_NE(real->output().data(), std::string(3 * kH * 4, '\0'));
  EXPECT_EQ(executor.inline_runs(), 1);  // the CPU reference runs on the worker
  // The hops of the two that ran, in the histograms.
  const std::string page = server->metrics()->Render();
  for (const char* hop :
       {"decode", "route", "queue", "device", "answer_wait", "encode", "serialize"}) {
    EXPECT_THAT(page, HasSubstr(absl::StrCat("kplan_hop_seconds_count{hop=\"", hop,
                                             "\",method=\"RunMoE\"} ", runs + 1)))
        << hop;
  }
}

// A tensor streamed from `bytes` by reads of at most `chunk` bytes each,
// which records the largest read and how many there were.
struct ReadLog {
  int64_t reads = 0, largest = 0;
};
StreamedTensor FromBytes(const std::string& name, std::vector<int64_t> shape,
                         const std::string& bytes, std::shared_ptr<ReadLog> log) {
  StreamedTensor t;
  t.name = name;
  t.dtype = v1::DTYPE_FLOAT32;
  t.shape = std::move(shape);
  t.bytes = static_cast<int64_t>(bytes.size());
  t.read = [&bytes, log](int64_t offset, int64_t n, char* out) {
    ++log->reads;
    log->largest = std::max(log->largest, n);
    std::memcpy(out, bytes.data() + offset, n);
    return absl::OkStatus();
  };
  return t;
}

// The client streams a set from a source chunk by chunk: the same set as
// the inline chunks; a source that fails mid-stream leaves nothing behind.
TEST_F(MoeRpcTest, LoadsFromAChunkSource) {
  const std::string a = Bytes(w13_), b = Bytes(w2_);
  auto log = std::make_shared<ReadLog>();
  std::vector<StreamedTensor> tensors;
  tensors.push_back(FromBytes("w13", {kE, 2 * kI, kH}, a, log));
  tensors.push_back(FromBytes("w2", {kE, kH, kI}, b, log));
  TensorChunkSource source(tensors, 96);
  absl::StatusOr<v1::LoadExpertsResponse> streamed = client_->LoadExperts(Header("src"), source);
  ASSERT_TRUE(streamed.ok()) << streamed.status();
  EXPECT_EQ(log->largest, 96);
  EXPECT_EQ(log->reads, int64_t((a.size() + 95) / 96 + (b.size() + 95) / 96));
  ASSERT_TRUE(client_->LoadExperts(Header("inline"), Chunks()).ok());
  std::mt19937 rng(2);
  v1::RunMoERequest req = LogitsRequest("src", 3, kH, kE, kK, rng);
  absl::StatusOr<v1::RunMoEResponse> from_source = client_->RunMoE(req);
  req.set_experts_id("inline");
  absl::StatusOr<v1::RunMoEResponse> from_inline = client_->RunMoE(req);
  ASSERT_TRUE(from_source.ok() && from_inline.ok());
  EXPECT_EQ(from_source->output().data(), from_inline->output().data());

  // A rewound source streams the same again.
  ASSERT_TRUE(source.Rewind().ok());
  EXPECT_EQ(client_->LoadExperts(Header("src"), source).status().code(),
            absl::StatusCode::kAlreadyExists);

  int calls = 0;
  tensors[1].read = [&calls](int64_t, int64_t, char*) {
    return ++calls == 2 ? absl::DataLossError("disk gone") : absl::OkStatus();
  };
  TensorChunkSource failing(tensors, 96);
  absl::StatusOr<v1::LoadExpertsResponse> failed = client_->LoadExperts(Header("half"), failing);
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kDataLoss) << failed.status();
  EXPECT_THAT(std::string(failed.status().message()), HasSubstr("disk gone"));
  TensorChunkSource again(tensors, 96);
  for (int i = 0; i < 50; ++i) {  // the server's reservation goes with the cancelled call
    absl::StatusOr<v1::LoadExpertsResponse> r = client_->LoadExperts(Header("half"), again);
    if (r.ok()) break;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kAlreadyExists) << r.status();
    ASSERT_TRUE(again.Rewind().ok());
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_EQ(client_->ListExperts()->experts_size(), 3);
}

// A raw file of the right size streams; the wrong size is refused naming the field.
TEST_F(MoeRpcTest, RawFileTensors) {
  const std::string dir = ::testing::TempDir();
  const std::string a = Bytes(w13_), b = Bytes(w2_);
  const std::string pa = absl::StrCat(dir, "/w13-", getpid(), ".raw");
  const std::string pb = absl::StrCat(dir, "/w2-", getpid(), ".raw");
  std::ofstream(pa, std::ios::binary) << a;
  std::ofstream(pb, std::ios::binary) << b;
  absl::StatusOr<StreamedTensor> w13 =
      RawFileTensor("w13", v1::DTYPE_FLOAT32, {kE, 2 * kI, kH}, 4, pa, "w13-file");
  absl::StatusOr<StreamedTensor> w2 =
      RawFileTensor("w2", v1::DTYPE_FLOAT32, {kE, kH, kI}, 4, pb, "w2-file");
  ASSERT_TRUE(w13.ok() && w2.ok()) << w13.status() << w2.status();
  TensorChunkSource source({*w13, *w2}, 100);
  ASSERT_TRUE(client_->LoadExperts(Header("raw"), source).ok());
  absl::StatusOr<StreamedTensor> wrong =
      RawFileTensor("w13", v1::DTYPE_FLOAT32, {kE, 2 * kI, kH}, 4, pb, "w13-file");
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(FieldOf(wrong.status()).value_or(""), "w13-file");
  absl::StatusOr<StreamedTensor> missing =
      RawFileTensor("w13", v1::DTYPE_FLOAT32, {1}, 4, pa + ".none", "w13-file");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  unlink(pa.c_str());
  unlink(pb.c_str());
}

// An output of at least kZeroCopyOutputBytes travels as its own slice: the
// client gets the same rows as from two smaller (plainly encoded) calls.
TEST_F(MoeRpcTest, LargeOutputsArriveWhole) {
  std::mt19937 rng(13);
  const int e = 2, h = 256, i = 8, m = 80;  // 48 KiB of weights: under the budget
  auto [header, chunks] = RandomSet("big", e, h, i, rng);
  ASSERT_TRUE(client_->LoadExperts(header, chunks).ok());
  v1::RunMoERequest whole = LogitsRequest("big", m, h, e, 2, rng);
  ASSERT_GE(size_t(m) * h * 4, kZeroCopyOutputBytes);
  absl::StatusOr<v1::RunMoEResponse> big = client_->RunMoE(whole);
  ASSERT_TRUE(big.ok()) << big.status();
  EXPECT_THAT(big->output().shape(), ::testing::ElementsAre(m, h));
  std::string halves;
  for (int part = 0; part < 2; ++part) {
    v1::RunMoERequest half = whole;
    const int rows = m / 2;
    *half.mutable_hidden_states() = MakeTensor(
        v1::DTYPE_FLOAT32, {rows, h},
        whole.hidden_states().data().substr(size_t(part) * rows * h * 4, size_t(rows) * h * 4));
    *half.mutable_router_logits() = MakeTensor(
        v1::DTYPE_FLOAT32, {rows, e},
        whole.router_logits().data().substr(size_t(part) * rows * e * 4, size_t(rows) * e * 4));
    absl::StatusOr<v1::RunMoEResponse> r = client_->RunMoE(half);
    ASSERT_TRUE(r.ok()) << r.status();
    halves += r->output().data();
  }
  EXPECT_EQ(big->output().data(), halves);
}

// RunMoE tensors in the client's POSIX shared memory: off by default; with
// --allow_shared_memory the inputs are read from a region and the output
// written into one, equal to the inline call; every reference is checked.
TEST_F(MoeRpcTest, SharedMemoryTensors) {
  std::mt19937 rng(17);
  const int m = 3;
  v1::RunMoERequest inline_req = LogitsRequest("l", m, kH, kE, kK, rng);
  const std::string& x = inline_req.hidden_states().data();
  const std::string& logits = inline_req.router_logits().data();
  v1::SharedMemoryRegion in;
  in.set_name("in");
  in.set_key(absl::StrCat("/kplan-moe-rpc-test-", getpid()));
  in.set_byte_size(8192);
  // Off: refused, naming the field.
  ASSERT_TRUE(client_->LoadExperts(Header("l"), Chunks()).ok());
  EXPECT_EQ(client_->RegisterSharedMemory(in).code(), absl::StatusCode::kFailedPrecondition);
  v1::RunMoERequest off = inline_req;
  *off.mutable_hidden_states()->mutable_shm() = Ref("in", 0, int64_t(x.size()));
  off.mutable_hidden_states()->clear_data();
  absl::Status refused = client_->RunMoE(off).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  EXPECT_EQ(FieldOf(refused).value_or(""), "hidden_states.shm");

  static NoDeviceProber prober;
  ServerOptions options;
  options.listen_address = "127.0.0.1:0";
  options.prober = &prober;
  options.allow_shared_memory = true;
  std::unique_ptr<KplanServer> server = std::move(KplanServer::Start(options).value());
  std::unique_ptr<Client> client = Client::Connect(absl::StrCat("127.0.0.1:", server->port()));
  ASSERT_TRUE(client->LoadExperts(Header("l"), Chunks()).ok());

  // The client's object: [x | logits] at 0, the output window at 4096.
  const int fd = shm_open(in.key().c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  ASSERT_GE(fd, 0) << std::strerror(errno);
  absl::Cleanup unlink = [&] { shm_unlink(in.key().c_str()); };  // also when an assertion fails
  ASSERT_EQ(ftruncate(fd, 8192), 0);
  char* mem = static_cast<char*>(mmap(nullptr, 8192, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
  close(fd);
  ASSERT_NE(mem, MAP_FAILED);
  std::memcpy(mem, x.data(), x.size());
  std::memcpy(mem + x.size(), logits.data(), logits.size());
  std::memset(mem + 4096, 0, 4096);
  v1::SharedMemoryRegion out = in;
  out.set_name("out");
  out.set_offset(4096);
  out.set_byte_size(4096);
  in.set_byte_size(4096);
  ASSERT_TRUE(client->RegisterSharedMemory(in).ok());
  ASSERT_TRUE(client->RegisterSharedMemory(out).ok());
  EXPECT_EQ(client->RegisterSharedMemory(out).code(), absl::StatusCode::kAlreadyExists);
  ASSERT_EQ(client->ListSharedMemory()->regions_size(), 2);

  v1::RunMoERequest req = inline_req;
  *req.mutable_hidden_states()->mutable_shm() = Ref("in", 0, int64_t(x.size()));
  req.mutable_hidden_states()->clear_data();
  *req.mutable_router_logits()->mutable_shm() =
      Ref("in", int64_t(x.size()), int64_t(logits.size()));
  req.mutable_router_logits()->clear_data();
  *req.mutable_output_shm() = Ref("out", 64, int64_t(x.size()));
  absl::StatusOr<v1::RunMoEResponse> via_shm = client->RunMoE(req);
  ASSERT_TRUE(via_shm.ok()) << via_shm.status();
  EXPECT_TRUE(via_shm->output().data().empty());
  EXPECT_THAT(via_shm->output().shape(), ::testing::ElementsAre(m, kH));
  EXPECT_EQ(via_shm->output().shm().region(), "out");
  absl::StatusOr<v1::RunMoEResponse> inline_run = client->RunMoE(inline_req);
  ASSERT_TRUE(inline_run.ok()) << inline_run.status();
  EXPECT_EQ(std::string(mem + 4096 + 64, x.size()), inline_run->output().data());
  EXPECT_EQ(std::string(mem + 4096, 64), std::string(64, '\0'));  // nothing before the window

  const std::vector<RequestCase> cases = {
      {"past the region",
       [](auto& r) { r.mutable_hidden_states()->mutable_shm()->set_offset(4000); },
       absl::StatusCode::kInvalidArgument, "hidden_states.shm.byte_size"},
      {"negative offset", [](auto& r) { r.mutable_router_logits()->mutable_shm()->set_offset(-8); },
       absl::StatusCode::kInvalidArgument, "router_logits.shm.offset"},
      {"unknown region", [](auto& r) { r.mutable_router_logits()->mutable_shm()->set_region("x"); },
       absl::StatusCode::kNotFound, "router_logits.shm.region"},
      {"data and shm", [](auto& r) { r.mutable_hidden_states()->set_data("abcd"); },
       absl::StatusCode::kInvalidArgument, "hidden_states.shm"},
      {"output size", [](auto& r) { r.mutable_output_shm()->set_byte_size(8); },
       absl::StatusCode::kInvalidArgument, "output_shm.byte_size"},
      {"output past the region", [](auto& r) { r.mutable_output_shm()->set_offset(4090); },
       absl::StatusCode::kInvalidArgument, "output_shm.byte_size"},
  };
  ExpectErrors(*client, req, cases);
  // The output may alias the hidden states, through their window or another
  // registration of the same bytes: it is the inline call's all the same.
  v1::SharedMemoryRegion alias = in;
  alias.set_name("alias");
  ASSERT_TRUE(client->RegisterSharedMemory(alias).ok());
  for (const char* region : {"in", "alias"}) {
    SCOPED_TRACE(region);
    v1::RunMoERequest aliased = req;
    *aliased.mutable_output_shm() = Ref(region, 0, int64_t(x.size()));
    absl::StatusOr<v1::RunMoEResponse> r = client->RunMoE(aliased);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(std::string(mem, x.size()), inline_run->output().data());
    std::memcpy(mem, x.data(), x.size());
  }
  ASSERT_TRUE(client->UnregisterSharedMemory("alias").ok());
  // Registration errors name the region's fields.
  v1::SharedMemoryRegion wide = in;
  wide.set_name("wide");
  wide.set_byte_size(1 << 20);
  absl::Status too_wide = client->RegisterSharedMemory(wide);
  EXPECT_EQ(too_wide.code(), absl::StatusCode::kInvalidArgument) << too_wide;
  EXPECT_EQ(FieldOf(too_wide).value_or(""), "region.byte_size");

  // A CUDA IPC region on a server without a GPU: refused, saying why.
  v1::SharedMemoryRegion cuda;
  cuda.set_name("gpu");
  cuda.set_cuda_ipc_handle(std::string(64, '\x01'));
  cuda.set_byte_size(4096);
  absl::Status no_gpu = client->RegisterSharedMemory(cuda);
  EXPECT_EQ(no_gpu.code(), absl::StatusCode::kFailedPrecondition) << no_gpu;
  EXPECT_EQ(FieldOf(no_gpu).value_or(""), "region.cuda_ipc_handle");
  EXPECT_THAT(std::string(no_gpu.message()), ::testing::HasSubstr("no GPU"));

  ASSERT_TRUE(client->UnregisterSharedMemory("in").ok());
  EXPECT_EQ(client->UnregisterSharedMemory("in").code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(client->RunMoE(req).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(client->ListSharedMemory()->regions_size(), 1);
  munmap(mem, 8192);
}

// --preload: the sets are resident (and readiness SERVING) when Start
// returns, loaded through LoadExperts' own checks; a bad file or set stops
// the start with the entry named.
TEST_F(MoeRpcTest, PreloadLoadsSetsBeforeReadiness) {
  const std::string file = absl::StrCat("preload-", getpid(), ".safetensors");
  WriteStackedFile(file);
  auto write_preload = [&](const std::string& json) {
    const std::string path = absl::StrCat(::testing::TempDir(), "/preload-", getpid(), ".json");
    std::ofstream(path) << json;
    return path;
  };
  const std::string entry = absl::StrCat(
      "\"num_experts\": ", kE, ", \"hidden_size\": ", kH, ", \"intermediate_size\": ", kI,
      ", \"activation\": \"silu\", \"dtype\": \"DTYPE_FLOAT32\", \"safetensors\": {\"path\": \"",
      file, "\", \"w13\": \"w13\", \"w2\": \"w2\"}");
  static NoDeviceProber prober;
  ServerOptions options;
  options.listen_address = "127.0.0.1:0";
  options.prober = &prober;
  options.model_roots = {::testing::TempDir()};
  options.auth_token_file = absl::StrCat(::testing::TempDir(), "/preload-token-", getpid());
  std::ofstream(options.auth_token_file) << "s3cret\n";  // the preload authenticates too
  // Both spellings of the field names.
  options.preload_file = write_preload(absl::StrCat(
      "{\"experts\": [{\"experts_id\": \"pre-a\", ", entry, "}, {\"expertsId\": \"pre-b\", ",
      absl::StrReplaceAll(entry, {{"num_experts", "numExperts"}}), "}]}"));
  absl::StatusOr<std::unique_ptr<KplanServer>> started = KplanServer::Start(options);
  ASSERT_TRUE(started.ok()) << started.status();
  ClientOptions client_options;
  client_options.bearer_token = "s3cret";
  std::unique_ptr<Client> client =
      Client::Connect(absl::StrCat("127.0.0.1:", (*started)->port()), client_options);
  EXPECT_EQ(client->Health(KplanServer::kReadinessService).value_or(false), true);
  absl::StatusOr<v1::ListExpertsResponse> listed = client->ListExperts();
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_EQ(listed->experts_size(), 2);
  // The preloaded weights are the file's: same output as the inline set.
  ASSERT_TRUE(client->LoadExperts(Header("inline"), Chunks()).ok());
  std::mt19937 rng(std::random_device{}());
  std::vector<float> x = Random(3 * kH, rng, 1.f), logits = Random(3 * kE, rng, 1.f);
  std::string outputs[2];
  for (int i = 0; i < 2; ++i) {
    v1::RunMoERequest r;
    r.set_experts_id(i == 0 ? "pre-b" : "inline");
    *r.mutable_hidden_states() = MakeTensor(v1::DTYPE_FLOAT32, {3, kH}, Bytes(x));
    *r.mutable_router_logits() = MakeTensor(v1::DTYPE_FLOAT32, {3, kE}, Bytes(logits));
    r.mutable_routing()->set_top_k(kK);
    absl::StatusOr<v1::RunMoEResponse> out = client->RunMoE(r);
    ASSERT_TRUE(out.ok()) << out.status();
    outputs[i] = out->output().data();
  }
  EXPECT_EQ(outputs[0], outputs[1]);
  started->reset();

  struct Bad {
    std::string json, field, message;
  };
  const std::vector<Bad> bad = {
      {"[1]", "preload", "must be an object"},
      {"{\"experts\": [{\"experts_id\": \"x\", \"no_such_field\": 1}]}", "preload.experts[0]",
       "not an ExpertsHeader"},
      {"{\"experts\": [{\"experts_id\": \"x\", \"num_experts\": 4}]}",
       "preload.experts[0].safetensors", "safetensors"},
      {absl::StrCat("{\"experts\": [{\"experts_id\": \"x\", ", entry, "}, {\"experts_id\": \"x\", ",
                    entry, "}]}"),
       "preload.experts[1].experts_id", "appears twice"},
  };
  for (const Bad& b : bad) {
    SCOPED_TRACE(b.json);
    options.preload_file = write_preload(b.json);
    absl::StatusOr<std::unique_ptr<KplanServer>> s = KplanServer::Start(options);
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << s.status();
    EXPECT_EQ(FieldOf(s.status()).value_or(""), b.field) << s.status();
    EXPECT_THAT(std::string(s.status().message()), HasSubstr(b.message));
  }
  // A set LoadExperts refuses (a file outside the roots) stops the start and names the entry.
  options.preload_file =
      write_preload(absl::StrCat("{\"experts\": [{\"experts_id\": \"far\", ",
                                 absl::StrReplaceAll(entry, {{file, "/etc/passwd"}}), "}]}"));
  absl::StatusOr<std::unique_ptr<KplanServer>> far = KplanServer::Start(options);
  ASSERT_FALSE(far.ok());
  EXPECT_EQ(far.status().code(), absl::StatusCode::kPermissionDenied) << far.status();
  EXPECT_THAT(std::string(far.status().message()), HasSubstr("preload.experts[0] ('far')"));
  options.preload_file = "/nonexistent/preload.json";
  EXPECT_EQ(FieldOf(KplanServer::Start(options).status()).value_or(""), "preload");
}

}  // namespace
}  // namespace kplan::rpc
