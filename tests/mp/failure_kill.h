// mp_failure_modes --mode kill --victim V [--mid-bytes B]: after a few good steps rank V
// SIGKILLs itself while the others have one operation of every kind in flight:
//   pending in negotiation (names V never submits): an allreduce, an allgather, a broadcast from
//     V and one from a survivor, an even and an uneven reduce-scatter, an even all-to-all and an
//     alltoallv, a barrier; and with V itself: a recv from V and an 8 MiB send to V; and a
//     concord_join (blocking, on a thread of its own, from about when V dies);
//   running on the backend: a reduce-scatter and an all-to-all of B bytes (default 16 MiB) that V
//     enqueued too; V dies 3 ms after a 64 KiB allreduce (a backend one) it enqueued just before
//     them completes, so inside them (they may succeed, whole, when V finished its part first).
// Every survivor's requests end with an error naming rank V within the deadline
// (CONCORD_TIMEOUT_S + 2 s); the send to V may instead succeed when V had taken the whole message
// before dying (Gloo keeps unexpected messages). Later operations of every kind fail at enqueue or
// promptly after, finalize is clean and quick; each survivor prints one line per request and
// "SURVIVOR_OK ..." and exits 0. concordrun itself exits non-zero naming rank V (checked by
// run_expect.sh); under mpirun the job is torn down instead (see tests/mp/CMakeLists.txt).
#pragma once

#include <cstdint>

int Kill(int victim, int64_t mid_bytes);
