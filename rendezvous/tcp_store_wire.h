// The TCP store's wire format (the protocol is described in tcp_store.h): frames, the request
// bodies and the reply body, as pure functions over bytes, so that the server, the client and the
// fuzz target (tests/fuzz/fuzz_tcp_store.cc) share one parser. Nothing here trusts its input:
// bytes that do not parse give kProtocolError, never a read past the end. Thread-safe (no state).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"
#include "rendezvous/store.h"

namespace concord {

constexpr uint32_t kTcpStoreMaxFrame = 64u << 20;
// The longest token (HELLO body): until a client has presented the token the server accepts no
// larger frame, so an unauthenticated connection never costs it more than this.
constexpr uint32_t kTcpStoreMaxToken = 1024;

namespace store_wire {

constexpr size_t kHeaderSize = 12;
constexpr uint8_t kHello = 1;
constexpr uint8_t kSet = 2;
constexpr uint8_t kGet = 3;
constexpr uint8_t kWait = 4;
constexpr uint8_t kAdd = 5;
constexpr uint8_t kGetFirst = 6;
constexpr uint8_t kReply = 0x80;
constexpr uint64_t kNoTimeout = ~uint64_t{0};

// A whole frame: header, then body.
std::string Frame(uint8_t type, const std::string& body);
// Validates the kHeaderSize bytes at h (magic, version, flags, length limit); on success sets
// *type and *length (the body's).
Status ParseHeader(const unsigned char* h, uint8_t* type, uint32_t* length);

// The first frame of data[0, size): on success *consumed is its whole size and *type, *body,
// *length describe it (body points into data); *consumed is 0 when the frame is not all there
// yet. A bad header is kProtocolError (the stream cannot be resynchronised).
Status NextFrame(const char* data, size_t size, uint8_t* type, const char** body, uint32_t* length,
                 size_t* consumed);

// A SET, GET, WAIT, ADD or GET_FIRST request (HELLO's body is the token itself).
struct Request {
  uint8_t type = 0;
  std::string key;                // SET, GET, ADD
  std::string value;              // SET
  uint64_t timeout_ms = 0;        // GET, WAIT, GET_FIRST: kNoTimeout for none
  std::vector<std::string> keys;  // WAIT, GET_FIRST
  uint64_t delta = 0;             // ADD: an int64 in two's complement
};
// The body of r (not the frame).
std::string EncodeRequest(const Request& r);
// Parses a body of the given type; kProtocolError for another type or a malformed body.
Status ParseRequest(uint8_t type, const char* body, size_t size, Request* out);

// A REPLY body: the status code, then the payload (OK) or the message (an error).
std::string EncodeReply(Code code, const std::string& payload);
// Parses a REPLY body into the status it carries (*carried: OK, or the error with its message)
// and, when OK, its payload. kProtocolError when the body is empty or the code unknown.
Status ParseReply(const char* body, size_t size, Status* carried, std::string* payload);
// An ADD reply's payload: the new value; kProtocolError when it is not exactly a u64.
Status ParseAddPayload(const std::string& payload, int64_t* value);
// A GET_FIRST reply's payload: u32 index of the key found (in the request's list), then its
// value. Parsing checks the index against the request's `key_count` (kProtocolError).
std::string EncodeFirstPayload(uint32_t index, const std::string& value);
Status ParseFirstPayload(const std::string& payload, size_t key_count, FoundKey* found);

}  // namespace store_wire
}  // namespace concord
