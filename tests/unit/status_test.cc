// Status and StatusOr (base/status.h): codes equal the C API's, context, and the loud failure of
// reading the value of an error.
#include "base/status.h"

#include <gtest/gtest.h>

#include <string>

#include "base/dtype.h"

namespace concord {
namespace {

TEST(StatusTest, CodesAreTheCApisStatuses) {
  EXPECT_EQ(static_cast<int>(Code::kOk), CONCORD_SUCCESS);
  EXPECT_EQ(static_cast<int>(Code::kProtocolError), CONCORD_ERR_PROTOCOL);
  EXPECT_EQ(static_cast<int>(DType::kBFloat16), CONCORD_BFLOAT16);
  EXPECT_EQ(static_cast<int>(ReduceOp::kProduct), CONCORD_PRODUCT);
  EXPECT_STREQ(CodeName(Code::kPeerFailure), "PEER_FAILURE");
}

TEST(StatusTest, ContextPrefixesErrorsOnly) {
  EXPECT_TRUE(Status::Ok().WithContext("x").ok());
  const Status s = InvalidArgument("bad").WithContext("tensor 'a'");
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_EQ(s.ToString(), "INVALID_ARGUMENT: tensor 'a': bad");
}

TEST(StatusOrTest, HoldsAValueOrAnError) {
  StatusOr<std::string> v(std::string("x"));
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(*v, "x");
  EXPECT_EQ(v->size(), 1u);
  StatusOr<int> e(TimeoutError("late"));
  EXPECT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), Code::kTimeout);
}

TEST(StatusOrTest, AnOkStatusIsNoValue) {
  // A function that returns Status::Ok() where a value belongs has a bug: it must not read as a
  // default-constructed value.
  StatusOr<int> e(Status::Ok());
  EXPECT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), Code::kInternal);
}

TEST(StatusOrDeathTest, ValueOfAnErrorAborts) {
  StatusOr<int> e(Status(Code::kPeerFailure, "rank 3 died"));
  EXPECT_DEATH((void)e.value(), "StatusOr::value\\(\\) of an error: PEER_FAILURE: rank 3 died");
  EXPECT_DEATH((void)*e, "StatusOr::value");
}

}  // namespace
}  // namespace concord
