// The negotiation wire format (see coordinator.h for the protocol). Two messages:
//   RequestMessage   any rank -> coordinator: a bit vector of the response-cache entries it has
//   newly
//                    requested again, and full requests for everything else.
//   ResponseMessage  coordinator -> every rank: the ordered list to execute (cache bits or full
//                    responses), or an abort that fails the job on every rank.
// Little-endian, length-prefixed, versioned. Parse() never trusts its input: any truncation,
// unknown tag, oversized count or invalid enum value gives kProtocolError, never a crash.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"
#include "core/request.h"

namespace concord {

struct RequestMessage {
  std::vector<uint64_t> cached_mask;    // bit b set: a request equal to cache entry b is ready
  std::vector<TensorRequest> requests;  // everything else
  bool empty() const { return cached_mask.empty() && requests.empty(); }
};

struct ResponseItem {
  bool cached = false;  // true: `bit` names a response-cache entry; false: `response` is full
  uint32_t bit = 0;
  Response response;
};

struct ResponseMessage {
  std::vector<ResponseItem> items;
  bool abort = false;  // the job failed: every rank fails with abort_code / abort_reason
  Code abort_code = Code::kOk;
  std::string abort_reason;
};

std::string SerializeRequestMessage(const RequestMessage& m);
StatusOr<RequestMessage> ParseRequestMessage(const std::string& bytes);
std::string SerializeResponseMessage(const ResponseMessage& m);
StatusOr<ResponseMessage> ParseResponseMessage(const std::string& bytes);

}  // namespace concord
