// RunMoE's shared-memory references as the request conversion resolves them
// (server/rpc/moe_convert.h): hidden states and router logits in a POSIX
// region are read in place, a given top-k is copied into the request, and
// the output window is written in place unless it overlaps an input's bytes,
// through the same registration or another one of the object.
#include <cstring>
#include <string>
#include <vector>

#include "base/status.h"
#include "gtest/gtest.h"
#include "server/rpc/moe_convert.h"
#include "tests/moe/test_shm_object.h"

namespace kplan::rpc {
namespace {

v1::SharedMemoryRef Ref(const std::string& region, int64_t offset, int64_t size) {
  v1::SharedMemoryRef r;
  r.set_region(region);
  r.set_offset(offset);
  r.set_byte_size(size);
  return r;
}

TEST(MoeShmConvertTest, HiddenStatesInPlaceOutputInPlaceUnlessItOverlapsThem) {
  TestShmObject object("moe-shm-convert-test", 8192);
  char* const mem = object.data();
  ASSERT_NE(mem, nullptr);
  for (int i = 0; i < 8192; ++i) mem[i] = static_cast<char>(i % 251);
  ShmRegistry regions;
  ASSERT_TRUE(regions.Register(ShmRegionInfo{"a", object.key(), 0, 8192, "", 0}).ok());
  ASSERT_TRUE(regions.Register(ShmRegionInfo{"b", object.key(), 4096, 4096, "", 0}).ok());

  constexpr int64_t kX = 2 * 8 * 2;  // [2, 8] bf16
  struct Case {
    std::string name;
    v1::SharedMemoryRef output;
    bool in_place;
  };
  const Case cases[] = {
      {"disjoint", Ref("a", 1024, kX), true},
      {"another registration, disjoint", Ref("b", 64, kX), true},
      {"the same window", Ref("a", 0, kX), false},
      {"overlapping its end", Ref("a", kX - 1, kX), false},
      {"another registration of the same bytes", Ref("b", 0, kX), false},
      {"overlapping the logits", Ref("a", 512 + 8, kX), false},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    v1::RunMoERequest p;
    p.mutable_hidden_states()->set_dtype(v1::DTYPE_BFLOAT16);
    *p.mutable_hidden_states()->mutable_shm() =
        c.name.find("same bytes") != std::string::npos ? Ref("a", 4096, kX) : Ref("a", 0, kX);
    p.mutable_router_logits()->set_dtype(v1::DTYPE_FLOAT32);
    *p.mutable_router_logits()->mutable_shm() = Ref("a", 512, 2 * 4 * 4);
    *p.mutable_output_shm() = c.output;
    MoeDeviceTensors device;
    absl::StatusOr<RunMoeShm> shm = ResolveRunMoeShm(&regions, p, &device);
    ASSERT_TRUE(shm.ok()) << shm.status();
    EXPECT_FALSE(device.any());
    // Neither input is copied into the request.
    EXPECT_FALSE(p.router_logits().has_shm());
    EXPECT_TRUE(p.router_logits().data().empty());
    EXPECT_FALSE(p.hidden_states().has_shm());
    EXPECT_TRUE(p.hidden_states().data().empty());
    MoeRunInput in;
    bool asked = false;
    AttachRunMoeShm(
        *shm,
        [&asked] {
          asked = true;
          return false;
        },
        &in);
    ASSERT_TRUE(in.hidden_states.in_place());
    EXPECT_EQ(in.hidden_states.data(), shm->hidden_states->data);
    EXPECT_EQ(in.hidden_states.size(), static_cast<size_t>(kX));
    ASSERT_TRUE(in.router_logits.in_place());
    EXPECT_EQ(in.router_logits.data(), shm->router_logits->data);
    EXPECT_EQ(in.router_logits.bytes(), std::string(mem + 512, 2 * 4 * 4));
    EXPECT_EQ(in.router_logits.size(), 2u * 4 * 4);
    EXPECT_TRUE(in.CheckIntact().ok());
    EXPECT_EQ(in.host_output.any(), c.in_place);
    if (c.in_place) {
      EXPECT_EQ(in.host_output.view.data, shm->output->data);
      EXPECT_TRUE(in.host_output.Writable(kX).ok());
      EXPECT_TRUE(asked);
    }
  }
}

// A given top-k indexes memory once checked: its bytes are copied into the
// request, so a client writing its window later cannot change them.
TEST(MoeShmConvertTest, GivenTopKIsCopied) {
  TestShmObject object("moe-shm-convert-topk-test", 4096);
  char* const mem = object.data();
  ASSERT_NE(mem, nullptr);
  for (int i = 0; i < 4096; ++i) mem[i] = static_cast<char>(i % 13);
  ShmRegistry regions;
  ASSERT_TRUE(regions.Register(ShmRegionInfo{"a", object.key(), 0, 4096, "", 0}).ok());
  v1::RunMoERequest p;
  p.mutable_topk_ids()->set_dtype(v1::DTYPE_INT32);
  p.mutable_topk_weights()->set_dtype(v1::DTYPE_FLOAT32);
  for (v1::Tensor* t : {p.mutable_topk_ids(), p.mutable_topk_weights()}) {
    t->add_shape(2);
    t->add_shape(4);
  }
  *p.mutable_topk_ids()->mutable_shm() = Ref("a", 256, 2 * 4 * 4);
  *p.mutable_topk_weights()->mutable_shm() = Ref("a", 512, 2 * 4 * 4);
  MoeDeviceTensors device;
  absl::StatusOr<RunMoeShm> shm = ResolveRunMoeShm(&regions, p, &device);
  ASSERT_TRUE(shm.ok()) << shm.status();
  const std::string ids(mem + 256, 2 * 4 * 4), weights(mem + 512, 2 * 4 * 4);
  std::memset(mem, 0x7f, 4096);  // the client writes its window afterwards
  EXPECT_EQ(p.topk_ids().data(), ids);
  EXPECT_EQ(p.topk_weights().data(), weights);
  EXPECT_FALSE(p.topk_ids().has_shm());
}

// A given top-k is copied only as the bytes its shape says, at most
// kMaxTopKShmBytes: a small request naming a large (perhaps sparse) region
// cannot make the server copy it. Refused before anything is copied, with
// the field named.
TEST(MoeShmConvertTest, GivenTopKTakesTheBytesOfItsShape) {
  TestShmObject object("moe-shm-convert-topk-size-test", 1 << 20);
  ASSERT_NE(object.data(), nullptr);
  ShmRegistry regions;
  ASSERT_TRUE(regions.Register(ShmRegionInfo{"a", object.key(), 0, 1 << 20, "", 0}).ok());
  auto resolve = [&](std::vector<int64_t> shape, int64_t byte_size, const char* which) {
    v1::RunMoERequest p;
    const bool ids = std::string(which) == "topk_ids";
    v1::Tensor* t = ids ? p.mutable_topk_ids() : p.mutable_topk_weights();
    t->set_dtype(ids ? v1::DTYPE_INT32 : v1::DTYPE_FLOAT32);
    for (int64_t d : shape) t->add_shape(d);
    *t->mutable_shm() = Ref("a", 0, byte_size);
    MoeDeviceTensors device;
    return ResolveRunMoeShm(&regions, p, &device).status();
  };
  // The whole region for a [2, 4] top-k, with either tensor.
  for (const char* which : {"topk_ids", "topk_weights"}) {
    const absl::Status st = resolve({2, 4}, 1 << 20, which);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
    EXPECT_EQ(FieldOf(st), std::string(which) + ".shm.byte_size") << st;
  }
  // No shape (a scalar's 4 bytes), and a shape past the cap.
  EXPECT_EQ(FieldOf(resolve({}, 1 << 20, "topk_ids")), "topk_ids.shm.byte_size");
  const int64_t slots = kMaxTopKShmBytes / 4;
  EXPECT_EQ(FieldOf(resolve({slots / 8 + 1, 8}, 1 << 20, "topk_ids")), "topk_ids.shape");
  // Exactly its bytes: taken.
  EXPECT_TRUE(resolve({1 << 10, 8}, (1 << 10) * 8 * 4, "topk_ids").ok());
  // The wrong dtype is named as such, not as a size.
  v1::RunMoERequest p;
  p.mutable_topk_weights()->set_dtype(v1::DTYPE_BFLOAT16);
  p.mutable_topk_weights()->add_shape(2);
  p.mutable_topk_weights()->add_shape(4);
  *p.mutable_topk_weights()->mutable_shm() = Ref("a", 0, 2 * 4 * 2);
  MoeDeviceTensors device;
  EXPECT_EQ(FieldOf(ResolveRunMoeShm(&regions, p, &device).status()), "topk_weights.dtype");
}

}  // namespace
}  // namespace kplan::rpc
