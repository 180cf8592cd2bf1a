#include "backends/tcp_p2p_wire.h"

#include <poll.h>

#include "rendezvous/store.h"

namespace concord {
namespace tcp_p2p {
namespace {

void PutI64(std::string* out, int64_t v) {
  net::PutU64(out, static_cast<uint64_t>(v));
}
uint64_t LoadU64(const unsigned char* p) {
  return uint64_t{net::LoadU32(p)} | (uint64_t{net::LoadU32(p + 4)} << 32);
}

}  // namespace

std::string EncodeHead(int64_t tag, const P2pMeta& meta, const DirectSource* direct) {
  std::string h;
  h.reserve(kFixedHead + 8 * meta.shape.size() + 24);
  net::PutU32(&h, kMessageMagic);
  net::PutU32(&h, static_cast<uint32_t>(meta.shape.size()));
  PutI64(&h, tag);
  net::PutU32(&h, static_cast<uint32_t>(meta.dtype));
  net::PutU32(&h, direct != nullptr ? kDirectRead : 0);
  net::PutU64(&h, meta.bytes);
  for (int64_t d : meta.shape) PutI64(&h, d);
  if (direct != nullptr) {
    net::PutU64(&h, direct->data);
    net::PutU64(&h, direct->state);
    net::PutU64(&h, direct->open);
  }
  return h;
}

namespace {

// A frame of its magic and zero bytes up to kFixedHead (a receipt, a goodbye).
std::string EncodeMark(uint32_t magic) {
  std::string r;
  net::PutU32(&r, magic);
  r.resize(kFixedHead, '\0');
  return r;
}

Status DecodeMark(const unsigned char* p, uint32_t magic, const char* what) {
  if (net::LoadU32(p) != magic)
    return ProtocolError(std::string("malformed point-to-point ") + what);
  for (size_t i = 4; i < kFixedHead; ++i) {
    if (p[i] != 0)
      return ProtocolError(std::string("point-to-point ") + what + " with non-zero padding");
  }
  return Status::Ok();
}

}  // namespace

std::string EncodeReceipt() {
  return EncodeMark(kReceiptMagic);
}

Status DecodeReceipt(const unsigned char* p) {
  return DecodeMark(p, kReceiptMagic, "receipt");
}

std::string EncodeGoodbye() {
  return EncodeMark(kGoodbyeMagic);
}

Status DecodeGoodbye(const unsigned char* p) {
  return DecodeMark(p, kGoodbyeMagic, "goodbye");
}

Status DecodeFixed(const unsigned char* p, int64_t* tag, P2pMeta* meta, uint32_t* flags,
                   size_t* head_size) {
  const uint32_t ndim = net::LoadU32(p + 4);
  const uint32_t dtype = net::LoadU32(p + 16);
  *flags = net::LoadU32(p + 20);
  if (net::LoadU32(p) != kMessageMagic || ndim > kP2pMaxDims ||
      !IsValidDType(static_cast<int>(dtype)) || (*flags & ~kDirectRead) != 0) {
    return ProtocolError("malformed point-to-point message header");
  }
  *tag = static_cast<int64_t>(LoadU64(p + 8));
  if (*tag < 0) return ProtocolError("point-to-point message with a negative tag");
  meta->dtype = static_cast<DType>(dtype);
  meta->bytes = LoadU64(p + 24);
  meta->shape.assign(ndim, 0);
  *head_size = kFixedHead + 8 * size_t{ndim} + ((*flags & kDirectRead) != 0 ? 24 : 0);
  return Status::Ok();
}

DirectSource DecodeDirect(const unsigned char* head, size_t ndim) {
  const unsigned char* at = head + kFixedHead + 8 * ndim;
  return DirectSource{LoadU64(at), LoadU64(at + 8), LoadU64(at + 16)};
}

Status CheckShape(P2pMeta* meta, const unsigned char* shape) {
  uint64_t n = 1;
  for (size_t i = 0; i < meta->shape.size(); ++i) {
    meta->shape[i] = static_cast<int64_t>(LoadU64(shape + 8 * i));
    if (meta->shape[i] < 0 ||
        __builtin_mul_overflow(n, static_cast<uint64_t>(meta->shape[i]), &n)) {
      return ProtocolError("point-to-point message with a bad shape");
    }
  }
  if (__builtin_mul_overflow(n, DTypeSize(meta->dtype), &n) || n != meta->bytes) {
    return ProtocolError("point-to-point message whose size is not its shape's");
  }
  return Status::Ok();
}

namespace {

// The HELLO a connecting rank sends.
std::string Hello(int rank, const std::string& nonce) {
  std::string h;
  net::PutU32(&h, 0x48325043);  // "CP2H"
  net::PutU32(&h, static_cast<uint32_t>(rank));
  return h + nonce;
}

constexpr uint32_t kAckMagic = 0x41325043;  // "CP2A"
constexpr size_t kNonceHex = 32;

}  // namespace

StatusOr<std::vector<net::Fd>> ConnectMesh(const BackendOptions& o, Store* store) {
  const Deadline deadline = Deadline::After(o.timeout);
  std::vector<net::Fd> links(static_cast<size_t>(o.size));
  if (o.size > 1) {
    CONCORD_ASSIGN_OR_RETURN(const std::string nonce, net::RandomHex(kNonceHex / 2));
    int port = 0;
    const std::string host = o.host.empty() ? "127.0.0.1" : o.host;
    CONCORD_ASSIGN_OR_RETURN(net::Fd listener, net::Listen(host, 0, &port));
    const std::string me = "/" + std::to_string(o.rank);
    CONCORD_RETURN_IF_ERROR(store->Set(o.prefix + "/nonce" + me, nonce));
    CONCORD_RETURN_IF_ERROR(store->Set(o.prefix + "/addr" + me, net::JoinHostPort(host, port)));
    for (int peer = 0; peer < o.rank; ++peer) {
      const std::string key = "/" + std::to_string(peer);
      CONCORD_ASSIGN_OR_RETURN(const std::string addr,
                               store->Get(o.prefix + "/addr" + key, deadline));
      CONCORD_ASSIGN_OR_RETURN(const std::string theirs,
                               store->Get(o.prefix + "/nonce" + key, deadline));
      std::string h;
      int p = 0;
      CONCORD_RETURN_IF_ERROR(net::SplitHostPort(addr, &h, &p));
      const std::string what = "point-to-point connection to rank " + std::to_string(peer);
      // Named: a peer whose start failed has closed its listener (connection refused).
      StatusOr<net::Fd> connected = net::Connect(h, p, deadline);
      if (!connected.ok()) return connected.status().WithContext(what);
      net::Fd fd = std::move(*connected);
      const std::string hello = Hello(o.rank, theirs);
      CONCORD_RETURN_IF_ERROR(net::WriteAll(fd.get(), hello.data(), hello.size(), deadline, what));
      unsigned char ack[4];
      CONCORD_RETURN_IF_ERROR(net::ReadFull(fd.get(), ack, sizeof(ack), deadline, what));
      if (net::LoadU32(ack) != kAckMagic) return ProtocolError(what + ": refused");
      links[peer] = std::move(fd);
    }
    for (int accepted = 0; accepted < o.size - 1 - o.rank;) {
      if (o.give_up) CONCORD_RETURN_IF_ERROR(o.give_up());
      pollfd pfd{listener.get(), POLLIN, 0};
      const Deadline slice =
          o.give_up ? deadline.Earlier(Deadline::After(BackendOptions::kGiveUpCheck)) : deadline;
      const int rc = ::poll(&pfd, 1, slice.PollTimeoutMs());
      if (rc == 0 && !deadline.passed()) continue;
      if (rc == 0) {
        return TimeoutError(
            "point-to-point setup: " + std::to_string(o.size - 1 - o.rank - accepted) +
            " higher rank(s) did not connect within the timeout");
      }
      CONCORD_ASSIGN_OR_RETURN(net::Fd fd, net::Accept(listener.get()));
      if (!fd.valid()) continue;
      unsigned char hello[8 + kNonceHex];
      if (!net::ReadFull(fd.get(), hello, sizeof(hello), deadline, "point-to-point hello").ok()) {
        continue;  // not one of ours
      }
      const int from = static_cast<int>(net::LoadU32(hello + 4));
      const std::string got(reinterpret_cast<char*>(hello + 8), kNonceHex);
      if (net::LoadU32(hello) != 0x48325043 || from <= o.rank || from >= o.size ||
          links[from].valid() || !net::ConstantTimeEquals(got, nonce)) {
        continue;  // closes it
      }
      std::string ack;
      net::PutU32(&ack, kAckMagic);
      CONCORD_RETURN_IF_ERROR(net::WriteAll(fd.get(), ack.data(), ack.size(), deadline,
                                            "point-to-point ack to rank " + std::to_string(from)));
      links[from] = std::move(fd);
      ++accepted;
    }
  }
  return links;
}

}  // namespace tcp_p2p
}  // namespace concord
