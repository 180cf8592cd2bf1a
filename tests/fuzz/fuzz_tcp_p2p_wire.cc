// libFuzzer target for the TCP point-to-point stream's frames (backends/tcp_p2p_wire.h), which a
// rank's progress thread parses from whatever its peer writes. The input is read as a receiver
// reads a link: a receipt (its magic) goes through DecodeReceipt, a goodbye through DecodeGoodbye
// (and ends the stream, as it ends the link), anything else through DecodeFixed, then CheckShape
// once the whole header is there, then a payload of the header's size (none for a directly read
// one) is skipped. A receipt or goodbye that decodes must be EncodeReceipt()'s or EncodeGoodbye()'s
// bytes; a header that decodes must have a tag of 0 or more, a shape whose elements times its
// dtype's size are its bytes, and encode back to the very same bytes. Anything that does not
// decode is a kProtocolError and ends the stream, as it fails the link. The commands are in
// tests/fuzz/README.md.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "backends/tcp_p2p_wire.h"
#include "rendezvous/net.h"

namespace {

using namespace concord;

void Check(bool ok) {
  if (!ok) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  size_t pos = 0;
  while (size - pos >= tcp_p2p::kFixedHead) {
    const unsigned char* p = data + pos;
    const std::string bytes(reinterpret_cast<const char*>(p), size - pos);
    if (net::LoadU32(p) == tcp_p2p::kGoodbyeMagic) {
      const Status goodbye = tcp_p2p::DecodeGoodbye(p);
      Check(goodbye.ok() ? bytes.compare(0, tcp_p2p::kFixedHead, tcp_p2p::EncodeGoodbye()) == 0
                         : goodbye.code() == Code::kProtocolError);
      return 0;
    }
    if (net::LoadU32(p) == tcp_p2p::kReceiptMagic) {
      const Status receipt = tcp_p2p::DecodeReceipt(p);
      if (!receipt.ok()) {
        Check(receipt.code() == Code::kProtocolError);
        return 0;
      }
      Check(bytes.compare(0, tcp_p2p::kFixedHead, tcp_p2p::EncodeReceipt()) == 0);
      pos += tcp_p2p::kFixedHead;
      continue;
    }
    int64_t tag = 0;
    P2pMeta meta;
    uint32_t flags = 0;
    size_t head = 0;
    Status s = tcp_p2p::DecodeFixed(p, &tag, &meta, &flags, &head);
    if (s.ok() && size - pos < head) return 0;  // the rest of the header has not arrived
    if (s.ok()) s = tcp_p2p::CheckShape(&meta, p + tcp_p2p::kFixedHead);
    if (!s.ok()) {
      Check(s.code() == Code::kProtocolError);
      return 0;
    }
    Check(tag >= 0 && meta.shape.size() <= kP2pMaxDims);
    uint64_t n = 1;
    for (int64_t d : meta.shape) {
      Check(d >= 0 && !__builtin_mul_overflow(n, static_cast<uint64_t>(d), &n));
    }
    Check(!__builtin_mul_overflow(n, DTypeSize(meta.dtype), &n) && n == meta.bytes);
    const bool direct = (flags & tcp_p2p::kDirectRead) != 0;
    const tcp_p2p::DirectSource source =
        direct ? tcp_p2p::DecodeDirect(p, meta.shape.size()) : tcp_p2p::DirectSource{};
    Check(bytes.compare(0, head, tcp_p2p::EncodeHead(tag, meta, direct ? &source : nullptr)) == 0);
    pos += head;
    if (!direct) pos += static_cast<size_t>(std::min<uint64_t>(meta.bytes, size - pos));
  }
  return 0;
}
