// The TCP point-to-point stream's frames (backends/tcp_p2p_wire.h): headers with and without a
// directly read payload round-trip, receipts are 32 bytes, and malformed headers (magic, ndim,
// dtype, an unknown flag, a size that is not the shape's, a bad dimension, a negative tag) and
// receipts and goodbyes (a non-zero padding byte) are kProtocolError.
#include "backends/tcp_p2p_wire.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "rendezvous/net.h"

namespace concord {
namespace tcp_p2p {
namespace {

const unsigned char* Bytes(const std::string& s) {
  return reinterpret_cast<const unsigned char*>(s.data());
}

// Decodes a whole header: its fixed part, then its shape.
Status Decode(const std::string& head, int64_t* tag, P2pMeta* meta, uint32_t* flags, size_t* size) {
  if (head.size() < kFixedHead) return ProtocolError("short");
  CONCORD_RETURN_IF_ERROR(DecodeFixed(Bytes(head), tag, meta, flags, size));
  if (head.size() < *size) return ProtocolError("short");
  return CheckShape(meta, Bytes(head) + kFixedHead);
}

P2pMeta Meta(DType dtype, std::vector<int64_t> shape) {
  P2pMeta m;
  m.dtype = dtype;
  m.shape = std::move(shape);
  m.bytes = DTypeSize(dtype);
  for (int64_t d : m.shape) m.bytes *= static_cast<uint64_t>(d);
  return m;
}

TEST(TcpP2pWireTest, HeadersRoundTripWithAndWithoutADirectSource) {
  for (const P2pMeta& meta :
       {Meta(DType::kFloat32, {3, 5}), Meta(DType::kUint8, {}), Meta(DType::kBFloat16, {0}),
        Meta(DType::kInt64, {1, 2, 3, 4, 5, 6, 7, 8})}) {
    for (const bool direct : {false, true}) {
      const DirectSource source{0x7f00'1234'5678ull, 0x5600'0000'0010ull, 0x0123'4567'89ab'cdefull};
      const std::string head = EncodeHead(5, meta, direct ? &source : nullptr);
      int64_t tag = 0;
      P2pMeta got;
      uint32_t flags = 7;
      size_t size = 0;
      ASSERT_TRUE(Decode(head, &tag, &got, &flags, &size).ok());
      EXPECT_EQ(size, head.size());
      EXPECT_EQ(tag, 5);
      EXPECT_EQ(got.dtype, meta.dtype);
      EXPECT_EQ(got.shape, meta.shape);
      EXPECT_EQ(got.bytes, meta.bytes);
      EXPECT_EQ(flags, direct ? kDirectRead : 0u);
      if (direct) {
        const DirectSource back = DecodeDirect(Bytes(head), meta.shape.size());
        EXPECT_EQ(back.data, source.data);
        EXPECT_EQ(back.state, source.state);
        EXPECT_EQ(back.open, source.open);
      }
    }
  }
}

TEST(TcpP2pWireTest, AReceiptIsAFixedHeadWithItsMagic) {
  const std::string r = EncodeReceipt();
  ASSERT_EQ(r.size(), kFixedHead);
  EXPECT_EQ(net::LoadU32(Bytes(r)), kReceiptMagic);
  int64_t tag = 0;
  P2pMeta meta;
  uint32_t flags = 0;
  size_t size = 0;
  EXPECT_EQ(DecodeFixed(Bytes(r), &tag, &meta, &flags, &size).code(), Code::kProtocolError)
      << "a receipt is not a message";
  EXPECT_TRUE(DecodeReceipt(Bytes(r)).ok());
}

TEST(TcpP2pWireTest, AReceiptWithANonZeroPaddingByteIsAProtocolError) {
  for (size_t i = 4; i < kFixedHead; ++i) {
    std::string r = EncodeReceipt();
    r[i] = 1;
    EXPECT_EQ(DecodeReceipt(Bytes(r)).code(), Code::kProtocolError) << "byte " << i;
  }
  const std::string head = EncodeHead(1, Meta(DType::kUint8, {}));
  EXPECT_EQ(DecodeReceipt(Bytes(head)).code(), Code::kProtocolError) << "a message is no receipt";
}

TEST(TcpP2pWireTest, AGoodbyeIsAFixedHeadWithItsMagicAndOnlyThat) {
  const std::string g = EncodeGoodbye();
  ASSERT_EQ(g.size(), kFixedHead);
  EXPECT_EQ(net::LoadU32(Bytes(g)), kGoodbyeMagic);
  EXPECT_TRUE(DecodeGoodbye(Bytes(g)).ok());
  EXPECT_EQ(DecodeReceipt(Bytes(g)).code(), Code::kProtocolError) << "a goodbye is no receipt";
  EXPECT_EQ(DecodeGoodbye(Bytes(EncodeReceipt())).code(), Code::kProtocolError);
  for (size_t i = 4; i < kFixedHead; ++i) {
    std::string bad = g;
    bad[i] = 1;
    EXPECT_EQ(DecodeGoodbye(Bytes(bad)).code(), Code::kProtocolError) << "byte " << i;
  }
}

TEST(TcpP2pWireTest, MalformedHeadersAreProtocolErrors) {
  const std::string good = EncodeHead(1, Meta(DType::kFloat32, {4}));
  // Each corrupts one field of the fixed part (offsets as tcp_p2p_wire.h lays them out).
  struct Corruption {
    const char* what;
    size_t offset;
    uint32_t value;
  };
  for (const Corruption& c :
       {Corruption{"magic", 0, 0x12345678}, Corruption{"ndim", 4, 9}, Corruption{"dtype", 16, 99},
        Corruption{"flag", 20, 2}, Corruption{"bytes", 24, 15}}) {
    std::string head = good;
    std::memcpy(&head[c.offset], &c.value, sizeof(c.value));
    int64_t tag = 0;
    P2pMeta meta;
    uint32_t flags = 0;
    size_t size = 0;
    EXPECT_EQ(Decode(head, &tag, &meta, &flags, &size).code(), Code::kProtocolError) << c.what;
  }
  std::string negative = good;
  const int64_t minus_one = -1;
  std::memcpy(&negative[kFixedHead], &minus_one, sizeof(minus_one));
  int64_t tag = 0;
  P2pMeta meta;
  uint32_t flags = 0;
  size_t size = 0;
  EXPECT_EQ(Decode(negative, &tag, &meta, &flags, &size).code(), Code::kProtocolError);
  // A sender never sends a negative tag (PointToPoint refuses one).
  EXPECT_EQ(Decode(EncodeHead(-1, Meta(DType::kFloat32, {4})), &tag, &meta, &flags, &size).code(),
            Code::kProtocolError);
}

}  // namespace
}  // namespace tcp_p2p
}  // namespace concord
