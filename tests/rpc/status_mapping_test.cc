#include "server/rpc/status_mapping.h"

#include "google/rpc/error_details.pb.h"
#include "google/rpc/status.pb.h"
#include "gtest/gtest.h"
#include "base/status.h"

namespace kplan::rpc {
namespace {

TEST(StatusMappingTest, EveryCodeMapsToItsGrpcTwin) {
  for (int c = 0; c <= 16; ++c) {
    EXPECT_EQ(static_cast<int>(ToGrpcCode(static_cast<absl::StatusCode>(c))), c);
  }
  EXPECT_EQ(ToGrpcCode(static_cast<absl::StatusCode>(99)), grpc::StatusCode::UNKNOWN);
}

TEST(StatusMappingTest, FieldBecomesBadRequest) {
  grpc::Status s = ToGrpcStatus(InvalidField("parallel.tp_size", "too small"));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(s.error_message(), "too small");
  google::rpc::Status details;
  ASSERT_TRUE(details.ParseFromString(s.error_details()));
  google::rpc::BadRequest bad;
  ASSERT_TRUE(details.details(0).UnpackTo(&bad));
  EXPECT_EQ(bad.field_violations(0).field(), "parallel.tp_size");
}

TEST(StatusMappingTest, NoFieldNoDetails) {
  grpc::Status s = ToGrpcStatus(absl::FailedPreconditionError("no GPU"));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_TRUE(s.error_details().empty());
  EXPECT_TRUE(ToGrpcStatus(absl::OkStatus()).ok());
}

}  // namespace
}  // namespace kplan::rpc
