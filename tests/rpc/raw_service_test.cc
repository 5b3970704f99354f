// SerializeRunMoeResponse: the bytes gRPC sends parse back to the response
// it was given, with the output's bytes as their own slice (no copy) for
// large outputs and plainly for small ones and empty batches.
#include "server/rpc/raw_service.h"

#include <grpcpp/support/proto_buffer_reader.h>

#include <random>
#include <string>

#include "gtest/gtest.h"

namespace kplan::rpc {
namespace {

v1::RunMoEResponse Response(size_t output_bytes, std::mt19937& rng) {
  v1::RunMoEResponse r;
  v1::Tensor* o = r.mutable_output();
  o->set_dtype(v1::DTYPE_BFLOAT16);
  o->add_shape(static_cast<int64_t>(output_bytes / 64));
  o->add_shape(32);
  std::string data(output_bytes, '\0');
  for (char& c : data) c = static_cast<char>(rng());
  o->set_data(std::move(data));
  r.mutable_plan()->set_backend("kplan");
  r.mutable_plan()->add_devices("cuda:0");
  r.mutable_timing()->set_total_us(12.5);
  r.mutable_topk_ids()->set_dtype(v1::DTYPE_INT32);
  r.mutable_topk_ids()->set_data(std::string(16, '\x01'));
  return r;
}

TEST(SerializeRunMoeResponseTest, ParsesBackToTheResponse) {
  std::mt19937 rng(std::random_device{}());
  for (size_t bytes : {size_t{0}, size_t{4096}, kZeroCopyOutputBytes, size_t{3} << 20}) {
    SCOPED_TRACE(bytes);
    v1::RunMoEResponse response = Response(bytes, rng);
    const v1::RunMoEResponse expected = response;
    grpc::ByteBuffer buffer;
    ASSERT_TRUE(SerializeRunMoeResponse(response, &buffer).ok());
    std::vector<grpc::Slice> slices;
    ASSERT_TRUE(buffer.Dump(&slices).ok());
    EXPECT_EQ(slices.size() >= 2, bytes >= kZeroCopyOutputBytes) << slices.size();
    v1::RunMoEResponse parsed;
    ASSERT_TRUE(grpc::SerializationTraits<v1::RunMoEResponse>::Deserialize(&buffer, &parsed).ok());
    EXPECT_EQ(parsed.output().data().size(), bytes);
    EXPECT_EQ(parsed.output().data(), expected.output().data());
    EXPECT_EQ(parsed.SerializeAsString(), expected.SerializeAsString());
  }
}

}  // namespace
}  // namespace kplan::rpc
