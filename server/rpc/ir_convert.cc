#include "server/rpc/ir_convert.h"

#include "absl/strings/str_cat.h"
#include "base/status.h"

namespace kplan::rpc {
namespace {

constexpr std::pair<v1::DType, kernels::DType> kIrDTypes[] = {
    {v1::DTYPE_FLOAT32, kernels::DType::kFloat32},
    {v1::DTYPE_FLOAT16, kernels::DType::kFloat16},
    {v1::DTYPE_BFLOAT16, kernels::DType::kBFloat16},
};

}  // namespace

absl::StatusOr<IrOpRequest> IrOpRequestFromProto(v1::RunIrOpRequest& p) {
  IrOpRequest r;
  r.op = p.op();
  for (int i = 0; i < p.inputs_size(); ++i) {
    v1::NamedTensor& in = *p.mutable_inputs(i);
    IrNamedTensor t;
    t.name = in.name();
    bool known = false;
    for (const auto& [proto_dtype, dtype] : kIrDTypes) {
      if (proto_dtype == in.tensor().dtype()) {
        t.tensor.dtype = dtype;
        known = true;
      }
    }
    if (!known) {
      return InvalidField(absl::StrCat("inputs[", i, "].tensor.dtype"),
                          absl::StrCat("IR ops take float32, float16 or bfloat16 tensors; input '",
                                       in.name(), "' is ", v1::DType_Name(in.tensor().dtype())));
    }
    t.tensor.shape.assign(in.tensor().shape().begin(), in.tensor().shape().end());
    t.tensor.data = std::move(*in.mutable_tensor()->mutable_data());
    r.tensors.push_back(std::move(t));
  }
  if (p.has_epsilon()) r.epsilon = p.epsilon();
  if (p.has_variance_size()) r.variance_size = p.variance_size();
  if (p.has_std_multiplier()) r.std_multiplier = p.std_multiplier();
  if (p.has_approximate()) r.approximate = p.approximate();
  if (p.priority_size() > 0) r.priority.emplace(p.priority().begin(), p.priority().end());
  return r;
}

void IrOpResultToProto(IrOpResult& r, v1::RunIrOpResponse* p) {
  for (IrNamedTensor& out : r.outputs) {
    v1::NamedTensor* t = p->add_outputs();
    t->set_name(out.name);
    for (const auto& [proto_dtype, dtype] : kIrDTypes) {
      if (dtype == out.tensor.dtype) t->mutable_tensor()->set_dtype(proto_dtype);
    }
    for (int64_t d : out.tensor.shape) t->mutable_tensor()->add_shape(d);
    *t->mutable_tensor()->mutable_data() = std::move(out.tensor.data);
  }
  p->set_provider(r.provider);
  p->set_provider_uuid(r.provider_uuid);
  for (const std::string& s : r.priority) p->add_priority(s);
  for (const std::string& w : r.warnings) p->add_warnings(w);
}

}  // namespace kplan::rpc
