#include "core/message.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace concord {
namespace {

// A request exercising every field, with the given op, dtype and reduce op.
TensorRequest FullRequest(OpType op, DType dtype, ReduceOp reduce) {
  TensorRequest r;
  r.name = std::string("layer.") + OpTypeName(op) + "." + DTypeName(dtype);
  r.op = op;
  r.dtype = dtype;
  r.reduce_op = reduce;
  r.shape = {3, 0, 7};
  r.root = 2;
  r.prescale = 0.25;
  r.postscale = -3.5;
  r.device = -1;
  r.group = "g#2";
  r.group_size = 2;
  if (op == OpType::kReducescatter || op == OpType::kAlltoall) r.splits = {1, 0, 2};
  return r;
}

// Expects two responses to be equal field by field (Response has no operator==).
void ExpectSameResponse(const Response& a, const Response& b) {
  EXPECT_EQ(a.request, b.request);
  EXPECT_EQ(a.first_dims, b.first_dims);
  EXPECT_EQ(a.splits, b.splits);
  EXPECT_EQ(a.error, b.error);
  EXPECT_EQ(a.error_message, b.error_message);
  EXPECT_EQ(a.error_ranks, b.error_ranks);
  EXPECT_EQ(a.joined, b.joined);
}

// A request message and a response message that together use every field and variant.
RequestMessage SampleRequestMessage() {
  RequestMessage m;
  m.step = 0x0102030405060708ull;
  m.cache_generation = 0x1112131415161718ull;
  m.cached_mask = {0x1, 0x8000000000000000ull, 0};
  m.requests.push_back(FullRequest(OpType::kAllgather, DType::kBFloat16, ReduceOp::kMax));
  TensorRequest scalar;
  scalar.name = "s";
  m.requests.push_back(scalar);
  m.cached_data[0] = std::string("\x01\x02\x00\x04", 4);
  m.request_data[1] = std::string(4, '\x7f');  // the float32 scalar's inline input
  return m;
}

ResponseMessage SampleResponseMessage() {
  ResponseMessage m;
  ResponseItem cached;
  cached.cached = true;
  cached.bit = 77;
  cached.data = std::string("\x00\x01\x02", 3);
  cached.last_rank = 2;
  cached.last_wait_us = 0xFFFFFFFFu;
  m.items.push_back(cached);
  ResponseItem full;
  full.response.request = FullRequest(OpType::kAllgather, DType::kInt64, ReduceOp::kSum);
  full.response.first_dims = {1, 0, 5};
  full.response.joined = {1};
  m.items.push_back(full);
  ResponseItem error;
  error.response.request = FullRequest(OpType::kAllreduce, DType::kFloat32, ReduceOp::kMin);
  error.response.error = Code::kMismatch;
  error.response.error_message = "tensor 'x': ranks disagree on dtype";
  error.response.error_ranks = {0, 2};
  m.items.push_back(error);
  m.warnings = {"tensor 'y' has waited for rank 1", ""};
  m.evictions = {3, 76, 78, 0xFFFFFFFFu};
  return m;
}

class RequestRoundTrip : public ::testing::TestWithParam<std::tuple<OpType, DType, ReduceOp>> {};

TEST_P(RequestRoundTrip, EveryField) {
  const auto [op, dtype, reduce] = GetParam();
  RequestMessage m;
  m.requests.push_back(FullRequest(op, dtype, reduce));
  TensorRequest plain = FullRequest(op, dtype, reduce);
  plain.name += ".plain";
  plain.shape = {};
  plain.group.clear();
  plain.group_size = 0;
  m.requests.push_back(plain);
  auto parsed = ParseRequestMessage(SerializeRequestMessage(m));
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_TRUE(parsed->cached_mask.empty());
  EXPECT_EQ(parsed->requests, m.requests);

  ResponseMessage rm;
  ResponseItem item;
  item.response.request = m.requests[0];
  item.response.first_dims = {4, 0, 2};
  if (op == OpType::kAlltoall) item.response.splits = {1, 0, 2, 0, 0, 0, 2, 1, 0};
  rm.items.push_back(item);
  auto rparsed = ParseResponseMessage(SerializeResponseMessage(rm));
  ASSERT_TRUE(rparsed.ok()) << rparsed.status().ToString();
  ASSERT_EQ(rparsed->items.size(), 1u);
  EXPECT_FALSE(rparsed->items[0].cached);
  ExpectSameResponse(rparsed->items[0].response, item.response);
}

INSTANTIATE_TEST_SUITE_P(
    AllEnums, RequestRoundTrip,
    ::testing::Combine(::testing::Values(OpType::kAllreduce, OpType::kAllgather, OpType::kBroadcast,
                                         OpType::kBarrier, OpType::kReducescatter,
                                         OpType::kAlltoall, OpType::kReduce, OpType::kGather),
                       ::testing::Values(DType::kUint8, DType::kInt8, DType::kInt32, DType::kInt64,
                                         DType::kFloat16, DType::kBFloat16, DType::kFloat32,
                                         DType::kFloat64),
                       ::testing::Values(ReduceOp::kSum, ReduceOp::kAverage, ReduceOp::kMin,
                                         ReduceOp::kMax, ReduceOp::kProduct)));

TEST(MessageTest, EmptyMessagesRoundTrip) {
  auto req = ParseRequestMessage(SerializeRequestMessage(RequestMessage{}));
  ASSERT_TRUE(req.ok());
  EXPECT_TRUE(req->empty());
  auto resp = ParseResponseMessage(SerializeResponseMessage(ResponseMessage{}));
  ASSERT_TRUE(resp.ok());
  EXPECT_TRUE(resp->items.empty());
  EXPECT_FALSE(resp->abort);
}

TEST(MessageTest, CachedMaskAndRequestsRoundTrip) {
  const RequestMessage m = SampleRequestMessage();
  auto parsed = ParseRequestMessage(SerializeRequestMessage(m));
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_EQ(parsed->step, m.step);
  EXPECT_EQ(parsed->cache_generation, m.cache_generation);
  EXPECT_EQ(parsed->cached_mask, m.cached_mask);
  EXPECT_EQ(parsed->requests, m.requests);
  EXPECT_EQ(parsed->cached_data, m.cached_data);
  EXPECT_EQ(parsed->request_data, m.request_data);
}

// Inline data must name a requested cache bit or a request, and have that request's size; a
// barrier has none.
TEST(MessageTest, InlineDataForNothingOrOfTheWrongSizeIsRejected) {
  auto expect_rejected = [](const RequestMessage& m, const std::string& what) {
    auto parsed = ParseRequestMessage(SerializeRequestMessage(m));
    ASSERT_FALSE(parsed.ok()) << what;
    EXPECT_EQ(parsed.status().code(), Code::kProtocolError) << what;
    EXPECT_NE(parsed.status().message().find("inline data"), std::string::npos)
        << parsed.status().message();
  };
  RequestMessage m = SampleRequestMessage();
  m.cached_data[1] = "x";  // bit 1 is not in the mask
  expect_rejected(m, "unrequested bit");
  m = SampleRequestMessage();
  m.request_data[2] = "xxxx";  // there are two requests
  expect_rejected(m, "request index");
  m = SampleRequestMessage();
  m.request_data[1] = "xxx";  // a float32 scalar has 4 bytes
  expect_rejected(m, "size");
  m = SampleRequestMessage();
  TensorRequest barrier;
  barrier.name = "b";
  barrier.op = OpType::kBarrier;
  barrier.dtype = DType::kUint8;
  m.requests.push_back(barrier);
  m.request_data[2] = "x";  // a barrier has no input, whatever its shape says
  expect_rejected(m, "op");
}

// Inline data is keyed in increasing order, as the serializer writes it: keys out of order or
// repeated would parse into a message that serializes to other bytes (fuzz_messages found it).
TEST(MessageTest, InlineDataKeysOutOfOrderOrRepeatedAreRejected) {
  RequestMessage m;
  m.cached_mask = {0xff};
  m.cached_data[0] = "";
  m.cached_data[2] = "";
  const std::string good = SerializeRequestMessage(m);
  ASSERT_TRUE(ParseRequestMessage(good).ok());
  // The two entries (key u32, empty string: length u32) end the data section before the
  // request data's count; swap their keys, then repeat one.
  const size_t second_key = good.size() - 4 - 8;
  const size_t first_key = second_key - 8;
  for (const auto& [a, b] : {std::pair<char, char>{2, 0}, std::pair<char, char>{2, 2}}) {
    std::string bytes = good;
    ASSERT_EQ(bytes[first_key], 0);
    ASSERT_EQ(bytes[second_key], 2);
    bytes[first_key] = a;
    bytes[second_key] = b;
    auto parsed = ParseRequestMessage(bytes);
    ASSERT_FALSE(parsed.ok()) << int{a} << "," << int{b};
    EXPECT_EQ(parsed.status().code(), Code::kProtocolError);
    EXPECT_NE(parsed.status().message().find("keys must increase"), std::string::npos)
        << parsed.status().message();
  }
}

TEST(MessageTest, ResponseItemsRoundTrip) {
  const ResponseMessage m = SampleResponseMessage();
  auto parsed = ParseResponseMessage(SerializeResponseMessage(m));
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_EQ(parsed->warnings, m.warnings);
  EXPECT_EQ(parsed->evictions, m.evictions);
  ASSERT_EQ(parsed->items.size(), m.items.size());
  for (size_t i = 0; i < m.items.size(); ++i) {
    EXPECT_EQ(parsed->items[i].cached, m.items[i].cached);
    if (m.items[i].cached) {
      EXPECT_EQ(parsed->items[i].bit, m.items[i].bit);
    } else {
      ExpectSameResponse(parsed->items[i].response, m.items[i].response);
    }
    EXPECT_EQ(parsed->items[i].data, m.items[i].data);
    EXPECT_EQ(parsed->items[i].last_rank, m.items[i].last_rank);
    EXPECT_EQ(parsed->items[i].last_wait_us, m.items[i].last_wait_us);
  }
}

TEST(MessageTest, ALastRankBelowMinusOneIsRejected) {
  ResponseMessage m = SampleResponseMessage();
  m.items[1].last_rank = -2;
  auto parsed = ParseResponseMessage(SerializeResponseMessage(m));
  ASSERT_FALSE(parsed.ok());
  EXPECT_EQ(parsed.status().code(), Code::kProtocolError);
  EXPECT_NE(parsed.status().message().find("bad last rank"), std::string::npos)
      << parsed.status().message();
}

// Evictions are strictly increasing (one encoding per message) and never a bit the list runs.
TEST(MessageTest, EvictionsOutOfOrderOrOfABitThatRunsAreRejected) {
  auto expect_rejected = [](const ResponseMessage& m, const std::string& reason) {
    auto parsed = ParseResponseMessage(SerializeResponseMessage(m));
    ASSERT_FALSE(parsed.ok()) << reason;
    EXPECT_EQ(parsed.status().code(), Code::kProtocolError);
    EXPECT_NE(parsed.status().message().find(reason), std::string::npos)
        << parsed.status().message();
  };
  ResponseMessage m = SampleResponseMessage();
  m.evictions = {5, 5};
  expect_rejected(m, "evictions out of order");
  m.evictions = {9, 4};
  expect_rejected(m, "evictions out of order");
  m.evictions = {1, 77};  // item 0 runs cache entry 77
  expect_rejected(m, "cache entry 77 is both run and evicted");
}

// A response's ranks: an error's error_ranks and the joined ranks each name a rank once (a joined
// rank counted twice takes a contributor from an average: Response::Contributors).
TEST(MessageTest, ARankListedTwiceIsRejected) {
  auto expect_rejected = [](const ResponseMessage& m, const std::string& reason) {
    auto parsed = ParseResponseMessage(SerializeResponseMessage(m));
    ASSERT_FALSE(parsed.ok()) << reason;
    EXPECT_EQ(parsed.status().code(), Code::kProtocolError);
    EXPECT_NE(parsed.status().message().find(reason), std::string::npos)
        << parsed.status().message();
  };
  ResponseMessage m = SampleResponseMessage();
  m.items[1].response.joined = {2, 0, 2};
  expect_rejected(m, "a rank listed twice");
  m = SampleResponseMessage();
  m.items[2].response.error_ranks = {0, 1, 0};
  expect_rejected(m, "a rank listed twice");
  // The join's own response lists every rank, in the order they joined.
  m = SampleResponseMessage();
  m.items[1].response.joined = {2, 0, 1};
  EXPECT_TRUE(ParseResponseMessage(SerializeResponseMessage(m)).ok());
}

TEST(MessageTest, AbortRoundTrip) {
  ResponseMessage m;
  m.abort = true;
  m.abort_code = Code::kPeerFailure;
  m.abort_reason = "rank 3 died";
  auto parsed = ParseResponseMessage(SerializeResponseMessage(m));
  ASSERT_TRUE(parsed.ok());
  EXPECT_TRUE(parsed->abort);
  EXPECT_EQ(parsed->abort_code, Code::kPeerFailure);
  EXPECT_EQ(parsed->abort_reason, "rank 3 died");
}

// Expects both parsers to refuse `bytes` with kProtocolError; the parser of the message's own
// kind (by its tag) with a message containing `reason`, when given.
void ExpectRejected(const std::string& bytes, const std::string& what,
                    const std::string& reason = "") {
  auto req = ParseRequestMessage(bytes);
  ASSERT_FALSE(req.ok()) << what;
  EXPECT_EQ(req.status().code(), Code::kProtocolError) << what;
  auto resp = ParseResponseMessage(bytes);
  ASSERT_FALSE(resp.ok()) << what;
  EXPECT_EQ(resp.status().code(), Code::kProtocolError) << what;
  if (reason.empty() || bytes.empty()) return;
  const Status& own = static_cast<uint8_t>(bytes[0]) == 0xC1 ? req.status() : resp.status();
  EXPECT_NE(own.message().find(reason), std::string::npos) << what << ": " << own.message();
}

TEST(MessageTest, EveryTruncatedPrefixIsRejected) {
  const std::string req = SerializeRequestMessage(SampleRequestMessage());
  for (size_t n = 0; n < req.size(); ++n) ExpectRejected(req.substr(0, n), "request prefix");
  ResponseMessage abort;
  abort.abort = true;
  abort.abort_code = Code::kTimeout;
  abort.abort_reason = "late";
  for (const ResponseMessage& m : {SampleResponseMessage(), abort}) {
    const std::string resp = SerializeResponseMessage(m);
    for (size_t n = 0; n < resp.size(); ++n) ExpectRejected(resp.substr(0, n), "response prefix");
  }
}

TEST(MessageTest, BadTagVersionAndTrailingBytesAreRejected) {
  const std::string req = SerializeRequestMessage(SampleRequestMessage());
  const std::string resp = SerializeResponseMessage(SampleResponseMessage());
  for (const std::string& valid : {req, resp}) {
    std::string bad_tag = valid;
    bad_tag[0] = static_cast<char>(bad_tag[0] ^ 0x40);
    ExpectRejected(bad_tag, "tag");
    std::string bad_version = valid;
    bad_version[1] = 4;  // the version before cache evictions
    ExpectRejected(bad_version, "version");
    ExpectRejected(valid + '\0', "trailing byte");
  }
  // A request message is not a response message and vice versa.
  EXPECT_EQ(ParseResponseMessage(req).status().code(), Code::kProtocolError);
  EXPECT_EQ(ParseRequestMessage(resp).status().code(), Code::kProtocolError);
}

// Little-endian bytes of a 32-bit value.
std::string U32Bytes(uint32_t v) {
  std::string s(4, '\0');
  std::memcpy(&s[0], &v, 4);
  return s;
}

TEST(MessageTest, HugeCountsAreRejected) {
  // Tag and current version (so that what is rejected is the count, not the version), then the
  // request message's step and cache generation.
  const std::string req_header = SerializeRequestMessage(RequestMessage()).substr(0, 2 + 8 + 8);
  const std::string resp_header = SerializeResponseMessage(ResponseMessage()).substr(0, 2);
  for (uint32_t count : {0xFFFFFFFFu, 0x80000000u, 1000u}) {
    // Mask word count, then request count.
    ExpectRejected(req_header + U32Bytes(count), "mask count", "count");
    ExpectRejected(req_header + U32Bytes(0) + U32Bytes(count), "request count", "count");
    // Warning count and item count after abort flag, code and empty reason.
    const std::string after_reason = resp_header + '\0' + U32Bytes(0) + U32Bytes(0);
    ExpectRejected(after_reason + U32Bytes(count), "warning count", "count");
    ExpectRejected(after_reason + U32Bytes(0) + U32Bytes(count), "item count", "count");
    ExpectRejected(after_reason + U32Bytes(0) + U32Bytes(0) + U32Bytes(count), "eviction count",
                   "count");
    ExpectRejected(resp_header + '\0' + U32Bytes(0) + U32Bytes(count), "reason length",
                   "string length");
  }
  // A string length beyond the message and a dimension count beyond the limit.
  RequestMessage m;
  TensorRequest r;
  r.name = "abc";
  r.shape.assign(65, 1);
  m.requests.push_back(r);
  ExpectRejected(SerializeRequestMessage(m), "65 dimensions");
  std::string bytes = SerializeRequestMessage(SampleRequestMessage());
  const size_t name_len_at = 2 + 8 + 8 + 4 + 3 * 8 + 4;
  bytes.replace(name_len_at, 4, U32Bytes(0xFFFFFF00u));
  ExpectRejected(bytes, "name length", "string length");
}

// The serialized request message holding only `r`, and the offset of r's op byte in it.
std::string OneRequest(const TensorRequest& r, size_t* op_at) {
  RequestMessage m;
  m.requests.push_back(r);
  *op_at = 2 + 8 + 8 + 4 + 4 + 4 + r.name.size();
  return SerializeRequestMessage(m);
}

TEST(MessageTest, InvalidEnumsAndNegativeValuesAreRejected) {
  TensorRequest r;
  r.name = "t";
  r.shape = {2};
  size_t op_at = 0;
  const std::string valid = OneRequest(r, &op_at);
  ASSERT_TRUE(ParseRequestMessage(valid).ok());
  // Offsets 0, 1, 2 from op_at: op, dtype, reduce op; each with the first invalid value and 0xFF.
  const std::vector<std::pair<size_t, uint8_t>> bad_enums = {
      {0, kNumOpTypes}, {0, 0xFF}, {1, kNumDTypes}, {1, 0xFF}, {2, kNumReduceOps}, {2, 0xFF}};
  for (const auto& [offset, value] : bad_enums) {
    std::string bad = valid;
    bad[op_at + offset] = static_cast<char>(value);
    ExpectRejected(bad, "enum at offset " + std::to_string(offset));
  }
  TensorRequest negative = r;
  negative.shape = {3, -1};
  ExpectRejected(OneRequest(negative, &op_at), "negative dimension");
  // Elements, or their bytes, past int64: NumElements and NumBytes would overflow (undefined).
  TensorRequest huge = r;
  huge.shape = {int64_t{1} << 40, int64_t{1} << 40};
  ExpectRejected(OneRequest(huge, &op_at), "elements past int64");
  huge.shape = {int64_t{1} << 62};  // 2^62 float32 elements: 2^64 bytes
  ExpectRejected(OneRequest(huge, &op_at), "bytes past int64");
  huge.shape = {int64_t{1} << 62, 0};  // no elements at all: a tensor like any other
  EXPECT_TRUE(ParseRequestMessage(OneRequest(huge, &op_at)).ok());
  huge.shape = {0, int64_t{1} << 62, int64_t{1} << 62};
  EXPECT_TRUE(ParseRequestMessage(OneRequest(huge, &op_at)).ok());
  TensorRequest negative_group = r;
  negative_group.group = "g";
  negative_group.group_size = -2;
  ExpectRejected(OneRequest(negative_group, &op_at), "negative group size");
  TensorRequest negative_split = r;
  negative_split.op = OpType::kAlltoall;
  negative_split.splits = {3, -1};
  ExpectRejected(OneRequest(negative_split, &op_at), "negative split");

  // Response-only fields: status codes, flags and first dimensions.
  auto response_with = [](auto mutate) {
    ResponseMessage m;
    ResponseItem item;
    item.response.request.name = "x";
    item.response.first_dims = {1, 2};
    m.items.push_back(item);
    mutate(m);
    return SerializeResponseMessage(m);
  };
  ExpectRejected(response_with([](ResponseMessage& m) { m.items[0].response.error = Code(99); }),
                 "error code");
  ExpectRejected(response_with([](ResponseMessage& m) { m.items[0].response.error = Code(-1); }),
                 "negative error code");
  ExpectRejected(response_with([](ResponseMessage& m) { m.abort_code = Code(14); }), "abort code");
  ExpectRejected(response_with([](ResponseMessage& m) {
                   m.items[0].response.first_dims = {1, -5};
                 }),
                 "negative first dim");
  ExpectRejected(response_with([](ResponseMessage& m) {
                   m.items[0].response.splits = {0, 1, -2, 0};
                 }),
                 "negative split in a response");
  std::string bad_abort = response_with([](ResponseMessage&) {});
  bad_abort[2] = 2;
  ExpectRejected(bad_abort, "abort flag");
  std::string bad_cached = response_with([](ResponseMessage&) {});
  bad_cached[2 + 1 + 4 + 4 + 4 + 4] = 7;
  ExpectRejected(bad_cached, "cached flag");
}

// Parses `bytes` with both parsers: each either refuses with kProtocolError or accepts bytes that
// serialize back to exactly the same string (the format is canonical).
void ExpectParsedSafely(const std::string& bytes) {
  auto req = ParseRequestMessage(bytes);
  if (req.ok()) {
    EXPECT_EQ(SerializeRequestMessage(*req), bytes);
  } else {
    EXPECT_EQ(req.status().code(), Code::kProtocolError);
  }
  auto resp = ParseResponseMessage(bytes);
  if (resp.ok()) {
    EXPECT_EQ(SerializeResponseMessage(*resp), bytes);
  } else {
    EXPECT_EQ(resp.status().code(), Code::kProtocolError);
  }
}

TEST(MessageTest, RandomBytesNeverCrash) {
  std::mt19937 rng(12345);
  const char version = SerializeRequestMessage(RequestMessage())[1];
  for (int i = 0; i < 4000; ++i) {
    std::string bytes(rng() % 160, '\0');
    for (char& c : bytes) c = static_cast<char>(rng() & 0xFF);
    // Half of them start with a valid header so the parsers get past it.
    if (bytes.size() >= 2 && i % 2 == 0) {
      bytes[0] = static_cast<char>(i % 4 == 0 ? 0xC1 : 0xC2);
      bytes[1] = version;
    }
    ExpectParsedSafely(bytes);
  }
}

TEST(MessageTest, RandomMutationsOfValidMessagesNeverCrash) {
  std::mt19937 rng(54321);
  const std::vector<std::string> valid = {SerializeRequestMessage(SampleRequestMessage()),
                                          SerializeResponseMessage(SampleResponseMessage())};
  for (int i = 0; i < 4000; ++i) {
    std::string bytes = valid[i % 2];
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int f = 0; f < flips; ++f) {
      const size_t at = 2 + rng() % (bytes.size() - 2);
      switch (rng() % 3) {
        case 0:
          bytes[at] = static_cast<char>(rng() & 0xFF);
          break;
        case 1:
          bytes.erase(at, 1);
          break;
        default:
          bytes.insert(at, 1, static_cast<char>(rng() & 0xFF));
          break;
      }
    }
    ExpectParsedSafely(bytes);
  }
}

}  // namespace
}  // namespace concord
