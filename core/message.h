// The negotiation wire format (see coordinator.h for the protocol). Two messages:
//   RequestMessage   any rank -> coordinator: a bit vector of the response-cache entries it has
//                    newly requested again, full requests for everything else, and the input bytes
//                    of small operations that the coordinator may complete itself (inline data:
//                    core/engine_inline.cc).
//   ResponseMessage  coordinator -> every rank: the ordered list to execute (cache bits or full
//                    responses, each with its inline result when it was completed inline), or an
//                    abort that fails the job on every rank; and the response-cache entries every
//                    rank evicts once it executed the list (response_cache.h).
// Little-endian, length-prefixed, versioned; one encoding per message (keyed entries in increasing
// key order). Parse() never trusts its input: any truncation, unknown tag, oversized count,
// invalid enum value, keys out of order, or a response's rank listed twice gives kProtocolError,
// never a crash.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "base/status.h"
#include "core/request.h"

namespace concord {

struct RequestMessage {
  // The sender's step (Engine::EndStep) when these operations were enqueued; 0 when the
  // application never marks steps. One message never mixes steps.
  uint64_t step = 0;
  // The sender's ResponseCache::generation() when it looked its bits up: a bit evicted since is
  // stale (it meant another entry).
  uint64_t cache_generation = 0;
  std::vector<uint64_t> cached_mask;    // bit b set: a request equal to cache entry b is ready
  std::vector<TensorRequest> requests;  // everything else
  // Inline data: a small operation's input (prescaled for a reduction; a broadcast's from its root
  // only), by cache bit (for bits set in cached_mask) and by index into `requests`. Each holds
  // exactly the request's NumBytes().
  std::map<uint32_t, std::string> cached_data;
  std::map<uint32_t, std::string> request_data;
  bool empty() const { return cached_mask.empty() && requests.empty(); }
};

struct ResponseItem {
  bool cached = false;  // true: `bit` names a response-cache entry; false: `response` is full
  uint32_t bit = 0;
  Response response;
  // Set when the coordinator combined the ranks' inline data (Coordinator::CombineInline): the
  // reduction (before any division or postscale), the inputs in rank order (allgather, alltoall)
  // or the root's (broadcast). The operation then needs no backend call.
  std::optional<std::string> data;
  // The rank whose submission reached the coordinator last, the one every other rank waited for
  // (-1: none counted: joins, the finalize barrier, an error before every rank submitted), and how
  // long after the submission before it, in microseconds (saturating). The straggler report's
  // figures for one operation, which each rank's timeline shows on its negotiation.
  int32_t last_rank = -1;
  uint32_t last_wait_us = 0;
};

struct ResponseMessage {
  std::vector<ResponseItem> items;
  bool abort = false;  // the job failed: every rank fails with abort_code / abort_reason
  Code abort_code = Code::kOk;
  std::string abort_reason;
  // The coordinator's stall warnings, which every rank logs (so each rank's log says which rank
  // it is waiting for). A message may carry warnings and no items.
  std::vector<std::string> warnings;
  // Cache bits every rank evicts after executing `items`, before inserting their new responses;
  // strictly increasing. Never a bit of `items`.
  std::vector<uint32_t> evictions;
};

// A failure report: a ResponseMessage that only aborts (abort_code, abort_reason), sent the other
// way, by a rank that failed to rank 0 just before it closes its connections (Engine::Fail). Rank 0
// aborts the job with it (PEER_FAILURE, "rank N failed: ..."), so that the culprit such a rank saw
// die (shared memory sees a killed peer before its connections close) is named, not the reporting
// rank, whose closed connection would otherwise be the first failure rank 0 sees. Tells one apart
// from a RequestMessage by its first byte.
bool IsFailureReport(const std::string& bytes);

std::string SerializeRequestMessage(const RequestMessage& m);
// At most the bytes a full request (RequestMessage::requests) adds to its serialized message, its
// inline data aside: mostly its name. The engine ends a message before one that would take it past
// its budget.
size_t RequestWireBytes(const TensorRequest& r);
StatusOr<RequestMessage> ParseRequestMessage(const std::string& bytes);
std::string SerializeResponseMessage(const ResponseMessage& m);
StatusOr<ResponseMessage> ParseResponseMessage(const std::string& bytes);

}  // namespace concord
