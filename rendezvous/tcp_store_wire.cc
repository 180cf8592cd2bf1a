#include "rendezvous/tcp_store_wire.h"

#include "rendezvous/net.h"

namespace concord {
namespace store_wire {
namespace {

constexpr uint32_t kMagic = 0x52545343;  // "CSTR" on the wire
constexpr uint8_t kVersion = 1;
constexpr Code kLastCode = Code::kProtocolError;

}  // namespace

std::string Frame(uint8_t type, const std::string& body) {
  std::string out;
  out.reserve(kHeaderSize + body.size());
  net::PutU32(&out, kMagic);
  net::PutU8(&out, kVersion);
  net::PutU8(&out, type);
  net::PutU16(&out, 0);
  net::PutU32(&out, static_cast<uint32_t>(body.size()));
  out.append(body);
  return out;
}

Status ParseHeader(const unsigned char* h, uint8_t* type, uint32_t* length) {
  if (net::LoadU32(h) != kMagic) return ProtocolError("bad magic (not a Concord store frame)");
  if (h[4] != kVersion) {
    return ProtocolError("unsupported store protocol version " + std::to_string(h[4]));
  }
  if (net::LoadU16(h + 6) != 0) return ProtocolError("nonzero reserved flags");
  *type = h[5];
  *length = net::LoadU32(h + 8);
  if (*length > kTcpStoreMaxFrame) {
    return ProtocolError("frame of " + std::to_string(*length) + " bytes exceeds the limit of " +
                         std::to_string(kTcpStoreMaxFrame));
  }
  return Status::Ok();
}

Status NextFrame(const char* data, size_t size, uint8_t* type, const char** body, uint32_t* length,
                 size_t* consumed) {
  *consumed = 0;
  if (size < kHeaderSize) return Status::Ok();
  CONCORD_RETURN_IF_ERROR(ParseHeader(reinterpret_cast<const unsigned char*>(data), type, length));
  if (size - kHeaderSize < *length) return Status::Ok();  // the rest has not arrived yet
  *body = data + kHeaderSize;
  *consumed = kHeaderSize + *length;
  return Status::Ok();
}

std::string EncodeRequest(const Request& r) {
  std::string body;
  switch (r.type) {
    case kSet:
      net::PutBytes(&body, r.key);
      net::PutBytes(&body, r.value);
      break;
    case kGet:
      net::PutU64(&body, r.timeout_ms);
      net::PutBytes(&body, r.key);
      break;
    case kWait:
    case kGetFirst:
      net::PutU64(&body, r.timeout_ms);
      net::PutU32(&body, static_cast<uint32_t>(r.keys.size()));
      for (const std::string& key : r.keys) net::PutBytes(&body, key);
      break;
    case kAdd:
      net::PutBytes(&body, r.key);
      net::PutU64(&body, r.delta);
      break;
    default:
      break;
  }
  return body;
}

Status ParseRequest(uint8_t type, const char* body, size_t size, Request* out) {
  net::Reader r(body, size);
  *out = Request();
  out->type = type;
  bool ok = false;
  switch (type) {
    case kSet:
      ok = r.Bytes(&out->key, kTcpStoreMaxFrame) && r.Bytes(&out->value, kTcpStoreMaxFrame);
      break;
    case kGet:
      ok = r.U64(&out->timeout_ms) && r.Bytes(&out->key, kTcpStoreMaxFrame);
      break;
    case kWait:
    case kGetFirst: {
      uint32_t count = 0;
      ok = r.U64(&out->timeout_ms) && r.U32(&count);
      for (uint32_t i = 0; ok && i < count; ++i) {
        std::string key;
        ok = r.Bytes(&key, kTcpStoreMaxFrame);
        out->keys.push_back(std::move(key));
      }
      break;
    }
    case kAdd:
      ok = r.Bytes(&out->key, kTcpStoreMaxFrame) && r.U64(&out->delta);
      break;
    default:
      return ProtocolError("unknown request type " + std::to_string(type));
  }
  if (!ok || !r.done()) {
    static const char* const kNames[] = {"", "HELLO", "SET", "GET", "WAIT", "ADD", "GET_FIRST"};
    return ProtocolError(std::string("malformed ") + kNames[type] + " request");
  }
  return Status::Ok();
}

std::string EncodeReply(Code code, const std::string& payload) {
  std::string body;
  body.reserve(1 + payload.size());
  net::PutU8(&body, static_cast<uint8_t>(code));
  body.append(payload);
  return body;
}

Status ParseReply(const char* body, size_t size, Status* carried, std::string* payload) {
  if (size < 1) return ProtocolError("empty reply");
  const uint8_t code = static_cast<uint8_t>(body[0]);
  if (code > static_cast<uint8_t>(kLastCode)) {
    return ProtocolError("unknown status code " + std::to_string(code));
  }
  if (code != 0) {
    *carried = Status(static_cast<Code>(code), std::string(body + 1, size - 1));
  } else {
    *carried = Status::Ok();
    payload->assign(body + 1, size - 1);
  }
  return Status::Ok();
}

Status ParseAddPayload(const std::string& payload, int64_t* value) {
  net::Reader r(payload.data(), payload.size());
  uint64_t v = 0;
  if (!r.U64(&v) || !r.done()) return ProtocolError("malformed ADD reply");
  *value = static_cast<int64_t>(v);
  return Status::Ok();
}

std::string EncodeFirstPayload(uint32_t index, const std::string& value) {
  std::string payload;
  payload.reserve(4 + value.size());
  net::PutU32(&payload, index);
  payload.append(value);
  return payload;
}

Status ParseFirstPayload(const std::string& payload, size_t key_count, FoundKey* found) {
  net::Reader r(payload.data(), payload.size());
  uint32_t index = 0;
  if (!r.U32(&index) || index >= key_count) {
    return ProtocolError("malformed GET_FIRST reply (" + std::to_string(payload.size()) +
                         " bytes, for " + std::to_string(key_count) + " keys)");
  }
  found->index = index;
  found->value = payload.substr(4);
  return Status::Ok();
}

}  // namespace store_wire
}  // namespace concord
