#include "core/clock_sync.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <initializer_list>
#include <memory>
#include <string>

#include "base/mutex.h"

namespace concord {
namespace {

// The messages, arrays of int64: rank 0 sends {kPing, round}, then {kResult, offset_ns, error_ns}
// or {kFailed}; the other rank answers each ping with {its clock}.
constexpr int64_t kPing = 1;
constexpr int64_t kResult = 2;
constexpr int64_t kFailed = 3;
constexpr size_t kMaxWords = 3;

// One send or recv in flight: its words and its completion, shared with the transport's callbacks,
// which may outlive a wait that gave up.
struct Op {
  Mutex mu;
  CondVar cv;
  bool done GUARDED_BY(mu) = false;
  Status status GUARDED_BY(mu);
  int64_t done_ns GUARDED_BY(mu) = 0;  // the clock when it completed
  int64_t words[kMaxWords] = {};       // written before `done` (by place and the payload)
  size_t count = 0;                    // the words a recv received; 0: refused or none

  void Complete(const Status& s, int64_t now_ns) EXCLUDES(mu) {
    {
      MutexLock lock(mu);
      done = true;
      status = s;
      done_ns = now_ns;
    }
    cv.NotifyAll();
  }
  // Waits until done (the transport completes every operation by its deadline: this deadline only
  // guards against one that would not); the status, and the clock at completion in `*at_ns`.
  Status Wait(Deadline deadline, int64_t* at_ns = nullptr) EXCLUDES(mu) {
    MutexLock lock(mu);
    while (!done) {
      if (!cv.WaitUntil(mu, deadline) && !done) return TimeoutError("no answer by the deadline");
    }
    if (at_ns != nullptr) *at_ns = done_ns;
    return status;
  }
};

Status SendWords(P2pTransport& t, int peer, int64_t tag, std::initializer_list<int64_t> words,
                 Deadline deadline) {
  auto op = std::make_shared<Op>();
  std::copy(words.begin(), words.end(), op->words);
  P2pMeta meta;
  meta.dtype = DType::kInt64;
  meta.shape = {static_cast<int64_t>(words.size())};
  meta.bytes = words.size() * sizeof(int64_t);
  t.Send(peer, tag, meta, op->words, deadline, [op](const Status& s) { op->Complete(s, 0); });
  return op->Wait(deadline);
}

// Posts a recv of up to kMaxWords int64s from `peer`; its completion reads `clock`.
std::shared_ptr<Op> PostRecv(P2pTransport& t, int peer, int64_t tag,
                             const ClockSyncOptions& options) {
  auto op = std::make_shared<Op>();
  auto place = [op](const P2pMeta& meta) -> void* {
    if (meta.dtype != DType::kInt64 || meta.bytes == 0 || meta.bytes % sizeof(int64_t) != 0 ||
        meta.bytes > sizeof(op->words)) {
      return nullptr;  // not a message of the sync: dropped, count stays 0
    }
    op->count = meta.bytes / sizeof(int64_t);
    return op->words;
  };
  t.Recv(peer, tag, options.deadline, place,
         [op, clock = options.clock](const Status& s) { op->Complete(s, clock()); });
  return op;
}

// `us` in whole nanoseconds, as a result message carries them; none when that is past int64.
std::optional<int64_t> Nanoseconds(double us) {
  const double ns = std::round(us * 1e3);
  // 2^63 is exactly a double; every double below it in magnitude fits int64.
  if (!(std::fabs(ns) < 9223372036854775808.0)) return std::nullopt;
  return static_cast<int64_t>(ns);
}

// Rank 0's side with rank `peer`: the rounds, then the result sent to it.
StatusOr<ClockOffset> Measure(P2pTransport& t, int peer, int64_t tag,
                              const ClockSyncOptions& options) {
  std::vector<ClockRound> rounds;
  for (int k = 0; k < options.rounds; ++k) {
    // Posted before the ping: the reply's completion reads the clock as soon as it arrives.
    std::shared_ptr<Op> reply = PostRecv(t, peer, tag, options);
    ClockRound round;
    round.t0_ns = options.clock();
    CONCORD_RETURN_IF_ERROR(SendWords(t, peer, tag, {kPing, k}, options.deadline));
    CONCORD_RETURN_IF_ERROR(reply->Wait(options.deadline, &round.t1_ns));
    if (reply->count != 1) return ProtocolError("an answer that is not a clock reading");
    round.remote_ns = reply->words[0];
    rounds.push_back(round);
  }
  const std::optional<ClockOffset> estimate = EstimateClockOffset(rounds);
  if (!estimate) return ProtocolError("no round trip took a non-negative time");
  const std::optional<int64_t> offset_ns = Nanoseconds(estimate->offset_us);
  const std::optional<int64_t> error_ns = Nanoseconds(estimate->error_us);
  if (!offset_ns || !error_ns) {
    return ProtocolError("a clock reading " + FormatSeconds(estimate->offset_us / 1e6) +
                         " off rank 0's, past what the offset's int64 nanoseconds hold");
  }
  CONCORD_RETURN_IF_ERROR(
      SendWords(t, peer, tag, {kResult, *offset_ns, *error_ns}, options.deadline));
  return *estimate;
}

// Another rank's side: answers rank 0's pings until its result comes.
ClockSyncResult Follow(P2pTransport& t, int64_t tag, const ClockSyncOptions& options) {
  ClockSyncResult result;
  for (int pings = 0;;) {
    std::shared_ptr<Op> message = PostRecv(t, 0, tag, options);
    result.status = message->Wait(options.deadline);
    if (!result.status.ok()) break;
    const int64_t kind = message->count > 0 ? message->words[0] : 0;
    if (kind == kPing && message->count == 2 && pings++ < options.rounds) {
      result.status = SendWords(t, 0, tag, {options.clock()}, options.deadline);
      if (!result.status.ok()) break;
      continue;
    }
    if (kind == kResult && message->count == 3) {
      result.offset = ClockOffset{static_cast<double>(message->words[1]) / 1e3,
                                  static_cast<double>(message->words[2]) / 1e3};
      return result;
    }
    result.status = kind == kFailed && message->count == 1
                        ? Status(Code::kUnavailable, "rank 0 could not complete the measurement")
                        : ProtocolError("an unexpected message from rank 0");
    break;
  }
  result.status = result.status.WithContext("measuring this rank's clock offset from rank 0's");
  return result;
}

}  // namespace

std::optional<ClockOffset> EstimateClockOffset(const std::vector<ClockRound>& rounds) {
  // In unsigned arithmetic: t1 - t0 of any two readings with t1 >= t0 fits 64 bits unsigned, not
  // always signed, and a reading is any int64 (a peer's clock may answer anything).
  const ClockRound* best = nullptr;
  uint64_t best_ns = 0;  // its round trip
  for (const ClockRound& r : rounds) {
    if (r.t1_ns < r.t0_ns) continue;
    const uint64_t round_trip_ns = static_cast<uint64_t>(r.t1_ns) - static_cast<uint64_t>(r.t0_ns);
    if (best == nullptr || round_trip_ns < best_ns) {
      best = &r;
      best_ns = round_trip_ns;
    }
  }
  if (best == nullptr) return std::nullopt;
  // Between t0 and t1, so an int64 again.
  const int64_t middle_ns = static_cast<int64_t>(static_cast<uint64_t>(best->t0_ns) + best_ns / 2);
  // A round trip of an odd number of nanoseconds: the midpoint is half a nanosecond early, which
  // the error bound covers by rounding up.
  const uint64_t error_ns = best_ns - best_ns / 2;
  // remote - middle exactly where it fits int64; past that (a clock centuries off) in double.
  int64_t offset_ns = 0;
  const double offset_us =
      __builtin_sub_overflow(best->remote_ns, middle_ns, &offset_ns)
          ? (static_cast<double>(best->remote_ns) - static_cast<double>(middle_ns)) / 1e3
          : static_cast<double>(offset_ns) / 1e3;
  return ClockOffset{offset_us, static_cast<double>(error_ns) / 1e3};
}

int64_t SystemClockNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

ClockSyncResult SyncClock(P2pTransport& transport, const ClockSyncOptions& options) {
  const int64_t tag = transport.max_tag();
  if (transport.rank() != 0) return Follow(transport, tag, options);
  ClockSyncResult result;
  result.offset = ClockOffset{};
  std::string failed;
  for (int peer = 1; peer < transport.size(); ++peer) {
    const StatusOr<ClockOffset> measured = Measure(transport, peer, tag, options);
    if (measured.ok()) continue;
    // Best effort: the peer stops waiting at once when this gets through.
    (void)SendWords(transport, peer, tag, {kFailed}, options.deadline);
    failed += (failed.empty() ? "" : "; ") + std::string("rank ") + std::to_string(peer) + ": " +
              measured.status().message();
  }
  if (!failed.empty()) {
    result.status = Status(Code::kUnavailable,
                           "the clock offsets of some ranks could not be "
                           "measured (" +
                               failed + ")");
  }
  return result;
}

}  // namespace concord
