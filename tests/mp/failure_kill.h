// mp_failure_modes --mode kill --victim V [--mid-bytes B] [--mid-ops K,...]: after a few good
// steps rank V SIGKILLs itself while the others have one operation of every kind in flight:
//   pending in negotiation (names V never submits): an allreduce, an allgather, a broadcast from
//     V and one from a survivor, an even and an uneven reduce-scatter, an even all-to-all and an
//     alltoallv, a reduce to V and one to a survivor, a gather to a survivor, a barrier; and with V
//     itself: a recv from V and an 8 MiB send to V; and a concord_join (blocking, on a thread of
//     its own, from about when V dies);
//   running on the backend: the large operations of B bytes (default 16 MiB) that V enqueued too,
//     in the order given (default reducescatter,alltoall,allgather,broadcast: a reduce-scatter,
//     an all-to-all, an allgather with B bytes out and a broadcast from a survivor), in one group
//     after a 64 KiB allreduce (a backend one): V dies as that allreduce completes, on lane 0,
//     while the first large one runs on lane 1 (they may succeed, whole, where V's part was not
//     needed, e.g. on a broadcast's root). `allreduce` (not in the default) is a large allreduce
//     of B bytes, which the lanes share: the small one runs after one share, so V dies while the
//     other share may still run, or after both (then the survivors' large allreduce succeeds).
//     Each survivor prints
//     "MID_FAILED rank R: ... <the first of them that failed, or none>".
// Every survivor's requests end with an error naming rank V within the deadline
// (CONCORD_TIMEOUT_S + 2 s); the send to V may instead succeed when V had taken the whole message
// before dying (Gloo keeps unexpected messages). Later operations of every kind fail at enqueue or
// promptly after, finalize is clean and quick, and /dev/shm holds no segment any rank created
// (the victim's included); each survivor prints one line per request and "SURVIVOR_OK ..." and
// exits 0. concordrun itself exits non-zero naming rank V (checked by run_expect.sh); under mpirun
// the job is torn down instead (see tests/mp/CMakeLists.txt).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

// The kinds of large operation Kill can run (--mid-ops): every kind but "allreduce" by default.
inline const std::vector<std::string> kMidOpKinds = {"reducescatter", "alltoall", "allgather",
                                                     "broadcast", "allreduce"};

int Kill(int victim, int64_t mid_bytes, const std::vector<std::string>& mid_ops);
