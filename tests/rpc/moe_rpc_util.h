// Helpers for the MoE RPC tests (moe_rpc_test, ep_server_test,
// ep_multihost_test, operate_test): fresh random float32 data, its raw bytes,
// API tensors and whole-tensor LoadExperts chunks.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "kplan/v1/service.pb.h"

namespace kplan::rpc::testing {

inline std::string Bytes(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * 4);
}

inline std::vector<float> Random(size_t n, std::mt19937& rng, float scale) {
  std::normal_distribution<float> d(0.f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

inline v1::Tensor MakeTensor(v1::DType dtype, std::vector<int64_t> shape, std::string data) {
  v1::Tensor t;
  t.set_dtype(dtype);
  for (int64_t d : shape) t.add_shape(d);
  t.set_data(std::move(data));
  return t;
}

// A RunMoE tensor reference into registered region `region`.
inline v1::SharedMemoryRef Ref(const std::string& region, int64_t offset, int64_t bytes) {
  v1::SharedMemoryRef r;
  r.set_region(region);
  r.set_offset(offset);
  r.set_byte_size(bytes);
  return r;
}

// The LoadExperts header of float32 silu experts [E, 2I, H] / [E, H, I].
inline v1::ExpertsHeader Float32Header(const std::string& id, int e, int h, int i) {
  v1::ExpertsHeader header;
  header.set_experts_id(id);
  header.set_num_experts(e);
  header.set_hidden_size(h);
  header.set_intermediate_size(i);
  header.set_activation("silu");
  header.set_dtype(v1::DTYPE_FLOAT32);
  return header;
}

// A LoadExperts chunk holding all of float32 tensor `name`.
inline v1::TensorChunk Chunk(const std::string& name, std::vector<int64_t> shape,
                             std::string data) {
  v1::TensorChunk c;
  c.set_name(name);
  c.set_dtype(v1::DTYPE_FLOAT32);
  for (int64_t d : shape) c.add_shape(d);
  c.set_data(std::move(data));
  return c;
}

}  // namespace kplan::rpc::testing
