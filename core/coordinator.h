// The coordinator: decides, for the whole job, which operations run and in which order.
//
// Protocol (rank 0 hosts the coordinator; every rank, rank 0 included, is a client):
//  1. When a rank's application enqueues operations, its engine sends one RequestMessage to rank 0:
//     for each request equal to a response-cache entry (same name, dtype, shape, op, ...) it sets
//     that entry's bit in a bit vector; every other request travels whole. Nothing is sent while a
//     rank has nothing new, so an idle job exchanges no messages (only the control plane's
//     heartbeats).
//  2. The coordinator ORs each rank's bits into that rank's vector; the bitwise AND of all ranks'
//     vectors is the set of cached operations ready everywhere: they need no parsing, matching or
//     validation. Full requests are counted per name; when every rank has sent a name, the
//     requests are compared field by field and yield either a response or an error that names the
//     tensor, the field and the ranks on each side. A bit that meets a full request for the same
//     name (the ranks diverged) is expanded back into the request it stands for and joins the full
//     path, so a divergence is reported, never left waiting.
//     Small allreduces may carry their (prescaled) input with the request, cached or full. When
//     every rank sent its input for an operation that is ready, the coordinator reduces them in
//     rank order and the response carries the result: the operation costs no backend collective,
//     and every rank receives identical bytes. If any rank sent no input (its threshold differs),
//     the operation runs on the backend as usual. So a message stays far below the control
//     plane's frame limit, it carries at most Engine::kInlineMessageBudgetBytes of inline data: a
//     rank sends the requests past it without their input (and ends a message before a full
//     request that would take it past the budget), and rank 0 drops the inline results past it
//     from its response list (every rank then runs those on the backend).
//  3. Ready operations leave in the order they became ready (cached ones by bit), members of a
//     group only all together, as one ResponseMessage that rank 0 sends to every rank and executes
//     itself. Every rank executes the same list in the same order, so the collectives match, and
//     applies it to its response cache, so bit numbers agree without any exchange. When the list's
//     new responses do not fit, it also names the entries every rank evicts: the least recently
//     executed ones that no bit this coordinator holds stands for (waiting, expanded into a
//     pending request, held for a group as a cached member or expanded into a held member's
//     request, or in the list itself). A bit still in flight to the coordinator may be evicted:
//     it arrives with its sender's older cache generation, is ignored, and its sender, which saw
//     the eviction while the bit was in flight, sends the request again in full
//     (response_cache.h). So a stale bit is never matched to the entry that replaced it.
//  4. Operations that some ranks submitted and others did not are reported after the stall
//     warning time, on every rank (the response message carries the warning), naming the missing
//     ranks and the last tensor each of them submitted. Past the stall shutdown time, if one is
//     set, the job fails on every rank with kTimeout naming the tensor and the missing ranks (a
//     job that lost a tensor cannot stay in step; failing once, clearly, beats failing every
//     step after). The finalize barrier is warned about, never shut down for: each finalizing
//     rank's own timeout bounds its wait. Group members ready and held for the rest of their
//     group stall the same way, from their first submission: the warning and the shutdown name
//     the group, the members it lacks and the ones ready.
//  5. Steps. An application that marks its steps (Engine::EndStep) sends each request with its
//     step number. A name submitted in different steps on different ranks (a rank skipped it in
//     a step, or submitted it twice) would mix the steps' data: the submissions of the older
//     steps fail at once with kMismatch naming the tensor, the ranks and their steps, and the
//     newest wait for their peers, so the job recovers in step. Unmarked steps are all 0.
//  6. A rank that finalizes (its finalize barrier arrives) never submits again: whatever waits for
//     it fails at once on the ranks that submitted it, with kPeerFailure naming the rank. So does
//     every ready member of a group with a member no rank has submitted (it never will be).
//  7. A rank that fails, leaves or sends malformed bytes makes rank 0 send an abort to every rank.
//  8. Join. A rank that ran out of data submits a join (a barrier named JoinName()) and is
//     "joined" until every rank has: an operation then runs once every rank that has not joined
//     submitted it, and its response lists the joined ranks that lack it (Response::joined). They
//     take part in its collective with the reduction's identity (no rows for an allgather), and an
//     average divides by the others (a joined rank never stands in for a join or the finalize
//     barrier: those need its own, and an operation only joined ranks submitted, after they
//     joined, waits for the others' next submission of it). What ranks submitted before the last
//     join arrived runs before that join completes, with the joined ranks standing in (a join
//     ends its sender's request message, so the coordinator knows what came after it). Bits of
//     the fast path are expanded into full requests while a rank is joined (a joined rank's at
//     once), and such responses are never cached. A broadcast whose root joined, or a CUDA
//     tensor (a joined rank has no device buffer for it), fails on the ranks that submitted it.
//     The join's own response lists every rank in the order they joined. Joins, and what only
//     joined ranks submitted since, are exempt from step checks and stall handling (until the
//     join completes): a joined rank may wait for the others' whole epoch. After a
//     join every rank's steps count from its step at the join (a joined rank's already), so
//     epochs of different lengths do not look like skipped tensors (point 5). A join that fails
//     (a rank finalized instead) ends its ranks' join.
//
//  9. Stragglers. Every ready operation's wait, from its previous submission's arrival to its last
//     one's, is charged to the rank that submitted last (core/straggler.h); StragglerReport names
//     the rank the others waited for most, each period, when worth a line. Each response item
//     names that rank and the wait (ResponseItem::last_rank), for every rank's timeline.
//
// This class is the pure decision logic of steps 2-6 (no I/O, no threads): the engine feeds it
// messages and sends what it returns. Not thread-safe; owned by rank 0's engine and used by the
// thread running its step.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "base/clock.h"
#include "core/message.h"
#include "core/response_cache.h"
#include "core/straggler.h"

namespace concord {

struct StallOptions {
  std::chrono::milliseconds warning{60000};
  std::chrono::milliseconds shutdown{0};  // 0: never
};

class Coordinator {
 public:
  // `cache` is the engine's response cache (rank 0's copy), read here, updated by the engine.
  // `straggler_period`: how often StragglerReport may report (zero: never).
  Coordinator(int size, const ResponseCache* cache, StallOptions stall,
              std::chrono::milliseconds straggler_period = std::chrono::milliseconds(0));

  // Adds what `rank` sent, ignoring its bits evicted since its cache generation. kProtocolError
  // for a cache generation ahead of the coordinator's, a cache mask longer than the cache, bits
  // that name no cache entry, a name `rank` already has pending, an allgather of a scalar (no
  // engine sends one), a root that is no rank, splits that do not fit their request (a
  // reducescatter's or alltoall's: one per rank, summing to the first dimension; none for other
  // operations), or inline data that is not the input of its request (of that size; a
  // broadcast's only from its root; a barrier has none).
  Status Add(int rank, RequestMessage message, Clock::time_point now);

  // Everything that can run now, in execution order (may be empty), with the errors of operations
  // that can never run (older steps, ranks that finalized). kTimeout when an operation has waited
  // past the stall shutdown time: the job must fail.
  StatusOr<ResponseMessage> TakeReady(Clock::time_point now);

  // Stall warnings due at `now` (each reported once), and the time of the next stall check.
  std::vector<std::string> StallWarnings(Clock::time_point now);
  std::optional<Clock::time_point> NextStallCheck() const;

  // The straggler line due at `now`, if any (StragglerTracker: which rank the others waited for
  // in the period that ended, when worth saying). Joins and the finalize barrier are not counted.
  std::optional<std::string> StragglerReport(Clock::time_point now);
  const StragglerTotals& straggler_totals() const { return stragglers_.totals(); }

  // Number of operations waiting for some rank.
  size_t pending() const;

 private:
  // The steps in which ranks submitted one name. While they agree only `first` is kept, so the
  // common case allocates nothing; once two differ, `by_rank` holds every rank's.
  struct Steps {
    bool any = false;
    bool mixed = false;
    uint64_t first = 0;
    std::vector<uint64_t> by_rank;
    void Set(int rank, int size, uint64_t step);
    uint64_t Of(int rank) const { return mixed ? by_rank[rank] : first; }
  };
  struct Pending {
    std::vector<std::optional<TensorRequest>> by_rank;
    std::vector<std::optional<std::string>> data_by_rank;  // inline inputs (empty: none yet)
    int count = 0;
    Clock::time_point first_seen;
    bool warned = false;
    Steps steps;
    std::vector<uint32_t> bits;  // cache bits expanded into it (never evicted while it waits)
    Arrivals arrivals;
    // By rank (empty: none): submitted while the rank was joined, in the join not yet complete.
    std::vector<bool> after_join;
  };
  struct BitWait {
    Clock::time_point first_seen;
    bool warned = false;
    std::vector<std::optional<std::string>> data;  // inline inputs by rank (empty: none yet)
    Steps steps;
    Arrivals arrivals;
  };
  // An operation that can run (or fails) and the cache bits it stands for: a cached item's own,
  // the bits expanded into its request. While it is held for its group, none of them is evicted:
  // a rank that sent one would be told to send its request again (ResponseCache::Apply) though
  // the held item runs it, and that second request would wait here forever. `first_seen`: when
  // its first submission arrived; a held member stalls from then on, like any operation.
  // `warned`: its group's stall warning was given.
  struct ReadyItem {
    ResponseItem item;
    std::vector<uint32_t> bits;
    Clock::time_point first_seen;
    bool warned = false;
  };
  // A group some of whose members are held (point 4): its member count, its held members by
  // name, its oldest held member's first submission, and whether its warning was given.
  struct HeldGroup {
    int64_t size = 0;
    std::set<std::string> ready;
    Clock::time_point first_seen = Clock::time_point::max();
    bool warned = false;
  };
  // The name a rank submitted last (for stall messages).
  struct LastSubmission {
    bool any = false;
    std::string name;
    Clock::time_point at;
  };

  // A request from `rank` (its `step` as sent, its inline input, the cache bit it came as):
  // pending until every rank sent its name.
  Status AddRequest(int rank, TensorRequest request, std::optional<std::string> data, uint64_t step,
                    Clock::time_point now, std::optional<uint32_t> bit);
  // The full path: takes into `ready` every pending name that can run, joins last.
  void TakeFullPath(Clock::time_point now, std::vector<ReadyItem>* ready);
  // Takes `name` into `ready` if it can run (Ready), with its response.
  bool TakeIfReady(const std::string& name, Clock::time_point now, std::vector<ReadyItem>* ready);
  void ExpandDivergedBits();
  // Sets item's last rank and its wait (ResponseItem) from the operation's arrivals.
  static void NoteLast(const Arrivals& arrivals, ResponseItem* item);
  // Names in `out` the cache entries to evict for its new responses to fit (see point 3).
  void ChooseEvictions(ResponseMessage& out) const;
  // Fails the submissions of older steps of names submitted in different steps; the newest stall
  // from `now` on.
  void FailOlderSteps(Clock::time_point now, std::vector<ReadyItem>* errors);
  // Fails what waits for a rank that finalized; a failed join's ranks are joined no longer.
  void FailWaitingForFinalized(std::vector<ReadyItem>* errors);
  // The groups of `candidates` (ready members, held or not) that can never complete: a rank
  // finalized, and a member no rank submitted never will be. Their members leave, failed
  // (FailMemberOfBrokenGroup).
  std::set<std::string> BrokenGroups(const std::vector<ReadyItem>& candidates) const;
  void FailMemberOfBrokenGroup(ReadyItem& member) const;
  // The held groups, by name.
  std::map<std::string, HeldGroup> HeldGroups() const;
  // The group members some rank submitted that are not ready (pending or bit-waiting): their
  // names, by group.
  std::map<std::string, std::set<std::string>> WaitingMembers() const;
  // Which members a held group lacks and which are ready, for stall messages.
  std::string DescribeGroup(const std::string& group, const HeldGroup& held) const;
  // A ready item's response: the cache entry of a cached item (held bits are never evicted).
  const Response& ResponseOf(const ResponseItem& item) const {
    return item.cached ? *cache_->Get(item.bit) : item.response;
  }
  // Describes who is missing for an operation: the ranks and what each last submitted.
  std::string DescribeMissing(const std::vector<bool>& present, Clock::time_point now) const;
  // The inline result of a ready operation (core/engine_inline.cc): every rank's input reduced
  // in rank order (allreduce, reducescatter) or concatenated (allgather, alltoall), the root's
  // (broadcast); nothing unless each rank that must sent one, or when ranks joined.
  std::optional<std::string> CombineInline(const Response& response,
                                           std::vector<std::optional<std::string>>& data) const;
  // kProtocolError unless `bytes` of inline data fit `request` from `rank`.
  Status CheckInlineData(int rank, const TensorRequest& request, size_t bytes) const;
  Response Validate(const Pending& p) const;
  // kProtocolError unless request.splits fit request (see Add).
  Status CheckSplits(int rank, const TensorRequest& request) const;
  // kTimeout naming the oldest operation past the stall shutdown time, if any.
  Status CheckStallShutdown(Clock::time_point now) const;
  std::vector<bool> PresentForBit(uint32_t bit) const;
  std::vector<bool> PresentFor(const Pending& p) const;
  // Whether every rank submitted the name or has joined (point 8).
  bool Ready(const std::string& name, const Pending& p) const;
  // A ready operation's response with joined ranks (point 8): which lack it, or why it fails.
  // A join's ends the join at `now`.
  void ApplyJoined(const Pending& p, Response& response, Clock::time_point now);
  // Whether only joined ranks submitted `p`, after they joined: it waits for the others' next
  // epoch, exempt from stall handling until the join completes (point 8).
  static bool OnlyAfterJoin(const Pending& p);

  int size_;
  const ResponseCache* cache_;
  StallOptions stall_;
  std::vector<std::vector<uint64_t>> bits_by_rank_;  // per rank: cached entries it asked for
  std::map<uint32_t, BitWait> bit_waits_;            // bits set on some rank, not all
  std::map<std::string, Pending> pending_;           // full requests by name
  std::vector<std::string> arrival_;                 // names in order of first arrival
  std::vector<ReadyItem> held_;                      // ready group members waiting for the rest
  std::vector<LastSubmission> last_;                 // per rank
  std::vector<bool> finalized_;                      // per rank: its finalize barrier arrived
  bool any_finalized_ = false;
  std::vector<bool> joined_;         // per rank: its join arrived, and not every rank's yet
  std::vector<int32_t> join_order_;  // the joined ranks, in the order they joined
  std::vector<uint64_t> join_step_;  // per rank: its step when it joined last
  // Per rank: its step at the last join every rank completed; steps count from there.
  std::vector<uint64_t> step_base_;
  bool steps_mixed_ = false;  // some Pending or BitWait has mixed steps
  StragglerTracker stragglers_;
};

}  // namespace concord
