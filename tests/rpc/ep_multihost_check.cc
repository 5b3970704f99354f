// ep_multihost_check SINGLE_ADDR GROUP_ADDR RANKS: RunMoE on an expert-parallel
// group across servers (GROUP_ADDR is its rank 0) against a single-device
// server, through the C++ client (the GPU hosts have no Python gRPC). Loads
// the same random bfloat16 layer (E=16, H=2048, I=768) on both, then per
// dispatch, top-k and token count compares the outputs within the GPU layer's
// element tolerance (tests/testing/tolerance.h): the group's GEMMs run fewer
// rows per call than the single device's and may pick another block size or
// split-K, so bit equality holds only where both pick the same.
// Exits 1 on any mismatch or error. scripts/ep-multihost-check.sh runs it.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "client/cpp/client.h"
#include "kernels/cpu/ir_float.h"
#include "tests/testing/tolerance.h"

namespace {

using kplan::kernels::cpu::Bf16ToFloat;
using kplan::kernels::cpu::FloatToBf16;

std::string Bf16(size_t n, std::mt19937& rng, float scale) {
  std::normal_distribution<float> d(0.f, scale);
  std::string out(n * 2, '\0');
  for (size_t i = 0; i < n; ++i) {
    uint16_t h = FloatToBf16(d(rng));
    std::memcpy(&out[i * 2], &h, 2);
  }
  return out;
}
std::string F32(size_t n, std::mt19937& rng) {
  std::normal_distribution<float> d(0.f, 1.f);
  std::string out(n * 4, '\0');
  for (size_t i = 0; i < n; ++i) {
    float f = d(rng);
    std::memcpy(&out[i * 4], &f, 4);
  }
  return out;
}
kplan::v1::Tensor Tensor(kplan::v1::DType dtype, std::vector<int64_t> shape, std::string data) {
  kplan::v1::Tensor t;
  t.set_dtype(dtype);
  for (int64_t d : shape) t.add_shape(d);
  t.set_data(std::move(data));
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  int ranks = 0;
  if (argc != 4 || !absl::SimpleAtoi(argv[3], &ranks)) {
    std::fprintf(stderr, "usage: ep_multihost_check SINGLE_ADDR GROUP_ADDR RANKS\n");
    return 2;
  }
  const int e = 16, h = 2048, inter = 768;
  kplan::ClientOptions options;
  options.deadline = absl::Seconds(300);
  auto single = kplan::Client::Connect(argv[1], options);
  auto group = kplan::Client::Connect(argv[2], options);
  absl::StatusOr<kplan::v1::GetServerInfoResponse> info = group->GetServerInfo();
  if (!info.ok() || info->ep_group().size() != ranks) {
    std::printf("FAIL: %s is not an expert-parallel group of %d ranks (%s)\n", argv[2], ranks,
                info.ok() ? std::to_string(info->ep_group().size()).c_str()
                          : info.status().ToString().c_str());
    return 1;
  }
  std::printf("group: %d ranks:", ranks);
  for (const std::string& d : info->ep_group().devices()) std::printf(" %s", d.c_str());
  std::printf(" over %s\n", info->ep_group().communicator().c_str());

  std::mt19937 rng(std::random_device{}());
  kplan::v1::ExpertsHeader header;
  header.set_experts_id("ep_multihost_check");
  header.set_num_experts(e);
  header.set_hidden_size(h);
  header.set_intermediate_size(inter);
  header.set_dtype(kplan::v1::DTYPE_BFLOAT16);
  std::vector<kplan::v1::TensorChunk> chunks;
  for (auto [name, n, shape, scale] :
       {std::tuple<const char*, size_t, std::vector<int64_t>, float>{
            "w13", size_t(e) * 2 * inter * h, {e, 2 * inter, h}, 1.f / std::sqrt(float(h))},
        {"w2", size_t(e) * h * inter, {e, h, inter}, 1.f / std::sqrt(float(inter))}}) {
    kplan::AppendTensorChunks(name, kplan::v1::DTYPE_BFLOAT16, shape, Bf16(n, rng, scale), 16 << 20,
                              &chunks);
  }
  for (auto* c : {single.get(), group.get()}) {
    (void)c->UnloadExperts(header.experts_id());
    absl::StatusOr<kplan::v1::LoadExpertsResponse> loaded = c->LoadExperts(header, chunks);
    if (!loaded.ok()) {
      std::printf("FAIL: LoadExperts: %s\n", loaded.status().ToString().c_str());
      return 1;
    }
    if (c == group.get()) {
      for (const auto& s : loaded->experts().shards()) {
        std::printf("  rank %d on %s: experts [%d, %d), %lld bytes\n", s.rank(), s.device().c_str(),
                    s.first_expert(), s.first_expert() + s.num_experts(),
                    static_cast<long long>(s.bytes()));
      }
      if (loaded->experts().shards_size() != ranks) {
        std::printf("FAIL: the experts are not placed on the group (see the servers' logs)\n");
        return 1;
      }
    }
  }
  int failures = 0;
  std::printf("%-24s %5s %2s %-28s %9s %9s\n", "all2all_backend", "M", "k", "result", "1-dev us",
              "group us");
  for (const char* strategy : {"allgather_reducescatter", "kplan_all2allv"}) {
    for (int k : {2, 4}) {
      for (int m : {1, std::max(1, ranks - 1), 7, 64, 333}) {
        kplan::v1::RunMoERequest req;
        req.set_experts_id(header.experts_id());
        std::string x = Bf16(size_t(m) * h, rng, 1.f);
        *req.mutable_hidden_states() = Tensor(kplan::v1::DTYPE_BFLOAT16, {m, h}, x);
        *req.mutable_router_logits() =
            Tensor(kplan::v1::DTYPE_FLOAT32, {m, e}, F32(size_t(m) * e, rng));
        req.mutable_routing()->set_top_k(k);
        req.mutable_routing()->set_routing_method("Renormalize");
        req.mutable_parallel()->set_all2all_backend(strategy);
        auto want = single->RunMoE(req);
        auto got = group->RunMoE(req);
        std::string result;
        if (!want.ok() || !got.ok()) {
          result = "ERROR " + (want.ok() ? got.status() : want.status()).ToString();
        } else if (got->output().data() == want->output().data()) {
          result = "bit-identical";
        } else {
          const std::string& a = got->output().data();
          const std::string& b = want->output().data();
          const size_t n = b.size() / 2;
          std::vector<float> fa(n), fb(n);
          double r2 = 0;
          for (size_t i = 0; a.size() == b.size() && i < n; ++i) {
            uint16_t ua, ub;
            std::memcpy(&ua, &a[i * 2], 2);
            std::memcpy(&ub, &b[i * 2], 2);
            fa[i] = Bf16ToFloat(ua);
            fb[i] = Bf16ToFloat(ub);
            r2 += double(fb[i]) * fb[i];
          }
          const double rms = std::sqrt(r2 / std::max<size_t>(n, 1));
          int bad = a.size() == b.size() ? 0 : 1, diff = 0;
          double worst = 0;
          for (size_t i = 0; !bad && i < n; ++i) {
            if (fa[i] == fb[i]) continue;
            ++diff;
            const double d = std::fabs(double(fa[i]) - fb[i]);
            worst = std::max(worst, d / rms);
            if (!(d <= kplan::test_util::MoeLayerElementTolerance(fb[i], rms))) ++bad;
          }
          char buf[96];
          std::snprintf(buf, sizeof(buf), "%d differ, max %.1e rms", diff, worst);
          result = bad ? "MISMATCH " + std::to_string(bad) + " elements" : std::string(buf);
        }
        const bool ok = result.rfind("MISMATCH", 0) != 0 && result.rfind("ERROR", 0) != 0;
        failures += ok ? 0 : 1;
        std::printf("%-24s %5d %2d %-28s %9.0f %9.0f\n", strategy, m, k, result.c_str(),
                    want.ok() ? want->timing().total_us() : 0.0,
                    got.ok() ? got->timing().total_us() : 0.0);
      }
    }
  }
  (void)single->UnloadExperts(header.experts_id());
  (void)group->UnloadExperts(header.experts_id());
  std::printf(failures ? "FAIL: %d mismatches\n" : "OK\n", failures);
  return failures ? 1 : 0;
}
