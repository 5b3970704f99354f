// A resident set of expert weights: what LoadExperts built and RunMoE reads.
// ExpertsSpec says what the tensors must be (ExpectedTensors lists name,
// dtype and shape of each); ExpertSet owns the bytes and hands the CPU
// reference a MoeWeights view of them.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/cpu/moe/moe_reference.h"

namespace kplan {

struct ExpertsQuantSpec {
  // "" | fp8_per_tensor | fp8_per_channel | fp8_block | int8_group | int4_group
  std::string scheme;
  int block_n = 128, block_k = 128;
  int group_size = 128;
  bool has_zero_points = false;
  std::string activation_scale = "per_token";  // fp8: per_token | per_tensor
  std::optional<float> a1_scale, a2_scale;
};

struct ExpertsSpec {
  std::string experts_id;
  int num_experts = 0;
  int64_t hidden = 0;
  int64_t intermediate = 0;
  std::string activation = "silu";
  kernels::DType dtype = kernels::DType::kBFloat16;
  ExpertsQuantSpec quant;
  bool has_bias = false;
};

// No set is larger than this (1 PiB): a bound for checked size arithmetic,
// far above any budget; the store's byte budget refuses real sets first.
inline constexpr int64_t kMaxExpertSetBytes = int64_t{1} << 50;
inline constexpr size_t kMaxExpertsIdBytes = 128;

// Checks the spec itself (sizes, names, dtype/scheme agreement, tensor sizes
// that fit kMaxExpertSetBytes); errors are INVALID_ARGUMENT naming the header
// field.
absl::Status ValidateExpertsSpec(const ExpertsSpec& spec);

// Wire names of element types, as the API's DType spells them in lower case:
// float32, float16, bfloat16, float8_e4m3, int8, uint8 (int4 travels packed
// as uint8, zero points as uint8).
struct TensorSpec {
  std::string name;  // w13, w2, w13_scale, w2_scale, w13_bias, w2_bias, w13_zero, w2_zero
  kernels::DType dtype;
  std::vector<int64_t> shape;  // int4: bytes along the packed last dim
  std::string wire_dtype;
  int64_t bytes() const;
};

// The wire name of a weight dtype ("bfloat16", "float8_e4m3", "uint8" for int4).
std::string WireDTypeName(kernels::DType dtype);

// The tensors a spec needs, in a fixed order.
std::vector<TensorSpec> ExpectedTensors(const ExpertsSpec& spec);
// The bytes of all ExpectedTensors(spec), overflow-checked (the header sizes
// them, so a client chooses them): INVALID_ARGUMENT naming num_experts when
// a tensor or their sum exceeds kMaxExpertSetBytes.
absl::StatusOr<int64_t> ExpectedBytes(const ExpertsSpec& spec);

struct ExpertsPlacement {
  std::string device;  // "cpu", "cuda:0"
  int first_expert = 0;
  int num_experts = 0;
  int64_t bytes = 0;
};

struct MoeRunInput;   // moe_runner.h
struct MoeRunOutput;  // moe_runner.h

// A copy of a set's weights on a device, made by a device backend
// (GpuExperts, or an expert-parallel placement); the set owns it for as long
// as the set is resident. What runs on the copy is asked through this
// interface, so nothing outside server/moe needs the device types.
class DeviceExperts {
 public:
  virtual ~DeviceExperts() = default;
  virtual std::string device_name() const = 0;  // "cuda:0"
  virtual int64_t device_bytes() const = 0;
  // True when activations of `act_dtype` run on this copy's fast kernels
  // (GpuExperts: kplan's CUDA kernels); false by default.
  virtual bool FastPathFor(kernels::DType act_dtype) const;
  // Runs one layer on this copy on `stream` (a cudaStream_t for GpuExperts;
  // null = the default stream), as RunMoeOnCpu runs it on the host copy.
  // The default (a copy that runs only through its own group, such as an
  // expert-parallel placement) is FAILED_PRECONDITION.
  virtual absl::StatusOr<MoeRunOutput> Run(const MoeRunInput& input, void* stream) const;
};

class ExpertSet {
 public:
  ExpertSet(ExpertsSpec spec, std::map<std::string, std::string> tensors);

  const ExpertsSpec& spec() const { return spec_; }
  int64_t bytes() const { return bytes_; }
  const std::vector<ExpertsPlacement>& placement() const { return placement_; }
  // The view the CPU reference reads (pointers into this set).
  moe::MoeWeights Weights() const;
  moe::MoeActivation activation() const { return activation_; }
  // The host copy's tensors by name (w13, w2, ...): what a multi-process
  // expert-parallel group forwards to its peer servers.
  const std::map<std::string, std::string>& tensors() const { return tensors_; }

  // Adds the device copy (before the set is shared); placement then lists it
  // after the host copy, which stays for the CPU reference path.
  void AttachDeviceCopy(std::unique_ptr<DeviceExperts> copy);
  const DeviceExperts* device_copy() const { return device_copy_.get(); }

 private:
  ExpertsSpec spec_;
  std::map<std::string, std::string> tensors_;  // name -> raw bytes
  int64_t bytes_ = 0;
  moe::MoeActivation activation_;
  std::vector<ExpertsPlacement> placement_;
  std::unique_ptr<DeviceExperts> device_copy_;
};

}  // namespace kplan
