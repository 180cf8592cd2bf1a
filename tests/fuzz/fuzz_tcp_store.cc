// libFuzzer target for the TCP store's wire format (rendezvous/tcp_store_wire.h), which the server
// runs on whatever a client sends and the client on whatever comes back. The input is read twice:
//   as the server reads a connection: frames cut by NextFrame, each body parsed by ParseRequest
//   (HELLO's body is the token, compared as bytes); a request that parses must encode back to the
//   very same body (one encoding per request), one that does not is a kProtocolError; a SET's
//   value goes through ParseInt64, as the server's ADD reads stored values;
//   as the client reads replies: header, type, ParseReply, and ParseAddPayload and
//   ParseFirstPayload (a GET_FIRST of 3 keys) on an OK payload; a reply or GET_FIRST payload that
//   parses must encode back to the same bytes.
// A bad header ends the stream, as it ends the connection. The commands are in
// tests/fuzz/README.md.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "rendezvous/net.h"
#include "rendezvous/tcp_store_wire.h"

namespace {

using namespace concord;

void Check(bool ok) {
  if (!ok) std::abort();
}

void AsServer(const char* data, size_t size) {
  size_t pos = 0;
  for (;;) {
    uint8_t type = 0;
    const char* body = nullptr;
    uint32_t length = 0;
    size_t consumed = 0;
    const Status frame =
        store_wire::NextFrame(data + pos, size - pos, &type, &body, &length, &consumed);
    if (!frame.ok()) {
      Check(frame.code() == Code::kProtocolError);
      return;
    }
    if (consumed == 0) return;
    Check(consumed == store_wire::kHeaderSize + length && consumed <= size - pos);
    Check(store_wire::Frame(type, std::string(body, length)) == std::string(data + pos, consumed));
    pos += consumed;
    if (type == store_wire::kHello) continue;
    store_wire::Request request;
    const Status parsed = store_wire::ParseRequest(type, body, length, &request);
    if (!parsed.ok()) {
      Check(parsed.code() == Code::kProtocolError);
      continue;
    }
    Check(store_wire::EncodeRequest(request) == std::string(body, length));
    int64_t value = 0;
    if (type == store_wire::kSet) (void)net::ParseInt64(request.value, &value);
  }
}

void AsClient(const char* data, size_t size) {
  size_t pos = 0;
  while (size - pos >= store_wire::kHeaderSize) {
    uint8_t type = 0;
    uint32_t length = 0;
    const auto* header = reinterpret_cast<const unsigned char*>(data + pos);
    if (!store_wire::ParseHeader(header, &type, &length).ok()) return;
    pos += store_wire::kHeaderSize;
    if (type != store_wire::kReply || length < 1 || size - pos < length) return;
    const char* body = data + pos;
    pos += length;
    Status carried;
    std::string payload;
    const Status parsed = store_wire::ParseReply(body, length, &carried, &payload);
    if (!parsed.ok()) {
      Check(parsed.code() == Code::kProtocolError);
      return;
    }
    const std::string again = carried.ok()
                                  ? store_wire::EncodeReply(Code::kOk, payload)
                                  : store_wire::EncodeReply(carried.code(), carried.message());
    Check(again == std::string(body, length));
    if (!carried.ok()) continue;
    int64_t value = 0;
    (void)store_wire::ParseAddPayload(payload, &value);
    // As a GET_FIRST reply, for a request of 3 keys: an index that parses encodes back the same.
    FoundKey found;
    if (store_wire::ParseFirstPayload(payload, 3, &found).ok()) {
      Check(found.index < 3);
      Check(store_wire::EncodeFirstPayload(static_cast<uint32_t>(found.index), found.value) ==
            payload);
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto* bytes = reinterpret_cast<const char*>(data);
  AsServer(bytes, size);
  AsClient(bytes, size);
  return 0;
}
