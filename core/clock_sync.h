// The offset of each rank's system clock from rank 0's, estimated at start by NTP's method over the
// communicator's point-to-point transport, for the timeline (core/timeline.h): its files record
// it, and `perf/concord-timeline merge` aligns the ranks on rank 0's clock with it instead of
// trusting the hosts' clock synchronisation.
//
// NTP's method: rank 0 reads its clock (t0), sends to rank r, which replies with its own reading
// (remote), and rank 0 reads its clock when the reply arrives (t1). The remote reading happened
// between t0 and t1 on rank 0's clock, so offset = remote - (t0 + t1) / 2 is within
// (t1 - t0) / 2 of the true offset, whatever the delays each way (as long as neither clock
// drifts during the round trip). Of several rounds, the shortest round trip gives the tightest
// bound. Measured once: a clock that drifts during the run (NTP slewing it, a second host's
// oscillator) moves away from the offset measured at start.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "backends/p2p_transport.h"
#include "base/clock.h"
#include "base/status.h"

namespace concord {

// A rank's system clock minus rank 0's, and the bound on the error of that estimate.
struct ClockOffset {
  double offset_us = 0;
  double error_us = 0;
};

// One round trip as rank 0 saw it: t0 and t1 on its clock, remote on the peer's (nanoseconds).
struct ClockRound {
  int64_t t0_ns = 0;
  int64_t remote_ns = 0;
  int64_t t1_ns = 0;
};

// The estimate from the round with the shortest round trip (a pure function of the readings);
// none when no round has t1 >= t0.
std::optional<ClockOffset> EstimateClockOffset(const std::vector<ClockRound>& rounds);

// The system clock, in nanoseconds since the epoch.
int64_t SystemClockNs();

struct ClockSyncOptions {
  int rounds = 8;  // round trips per rank
  // Every send and recv of the sync ends by then (kTimeout): a rank that does not take part
  // delays the others' start by at most this long.
  Deadline deadline = Deadline::After(std::chrono::seconds(10));
  // The clock measured (thread-safe; read on the transport's progress thread too).
  std::function<int64_t()> clock = SystemClockNs;
};

struct ClockSyncResult {
  std::optional<ClockOffset> offset;  // this rank's; none when the sync failed for it
  Status status;                      // what failed (rank 0: the ranks it could not measure)
};

// Collective over every rank of `transport`: rank 0 measures each other rank in turn, rank by
// rank, options.rounds round trips each, and sends each its offset and error bound; rank 0's is 0
// exactly. The messages use the transport's largest tag: call it before the application can send
// anything on the transport (the communicator's init does, before it returns), so that no message
// of the application is in flight on that tag. A failure (a peer that does not answer by the
// deadline, a broken connection) is reported, never thrown: the ranks measured still get their
// offsets. A sync that failed mid-way may leave one of its messages, or one of its recvs (until
// the deadline), on that tag.
ClockSyncResult SyncClock(P2pTransport& transport, const ClockSyncOptions& options);

}  // namespace concord
