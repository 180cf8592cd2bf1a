// Random mixes of every collective and point to point, submitted asynchronously from two threads
// per rank in a different order on every rank, and checked exactly: negotiation, fusion, the
// response cache, lanes and groups under interleavings no hand-written case chooses. C API only.
//
//   concordrun -np N ./mp_random_mix [--seed S] [--rounds R] [--ops K] [--max-rows M]
//                                    [--hosts-interleaved H] [--mismatch-percent P]
//                                    [--split | --join | --kill V [--kill-round K]]
//
// Every rank draws the same program from the seed. Each round has K operations in three parts:
// - static: the same K/2 operations every round (names, dtypes and shapes; the values change), so
//   the response cache serves them;
// - varying: 4 names that get a new random operation each round, so the cache must replace them;
// - fresh: the rest, under names used once.
// Operations: allreduce (every op; in place or not; prescale and postscale on floating tensors;
// fp16 and bf16 compression of float32 and float64 sums and averages), allgather and gather
// (rows differing by rank, into a buffer or owned by the request), broadcast, reduce (the other
// ranks' outputs checked untouched), reducescatter (even or given splits, in place or not),
// alltoall (per-rank splits or even, owned or not), a send/recv between two ranks (the shape
// expected or the sender's), barrier; every dtype; 0 to M rows of 1 to 8 columns; some in groups
// that every rank enqueues alike. Each rank submits the round's operations (a group as one unit)
// in its own random order from two threads, some with a callback (one in ten, alike on every
// rank, enqueues an allreduce from its callback, as a framework's hook may), some after a sleep,
// waits for them in another order (concord_wait, or polling concord_test), and checks every
// result against a value computed here. Inputs are small integers, so results are exact except
// where an average divides (the dtype's tolerance). With --mismatch-percent P, P% of the
// ungrouped operations have one rank give a field differently (dtype, rows, reduction or root,
// each still valid on its own): each must fail with MISMATCH naming it on every rank (a
// send/recv: on the receiver), and every other operation of the round must still come out right,
// the response cache serving the same names again next round. With --join every rank runs out
// of data after its own number of rounds (one runs them all) and calls concord_join: later
// rounds are drawn for the ranks left (no reduce-scatter or all-to-all, which joined ranks
// refuse; roots and send/recv ends among them), and their reductions must come out as the left
// ranks' alone (the joined ones add the identity; an average divides by the ranks left), their
// allgathers without rows from joined ranks; concord_join must return a rank that ran every
// round. With --kill V rank V SIGKILLs itself in round K (default: half the rounds) after a
// random number of its submissions: every survivor's operation of that round must come out right
// or fail naming rank V (at enqueue or within CONCORD_TIMEOUT_S + 5 s), a later allreduce must
// fail at once naming it, and finalize must return within 5 s; each survivor then prints
// "random_mix: rank R survived rank V's death ...". Every round ends with concord_end_step.
// --split runs a second mix on a sub-communicator (the ranks of this rank's parity, in reverse
// order) at the same time, submitted from two more threads. A failure names the communicator,
// seed, round and operation: rerun with that seed to see it again. Prints one summary line per
// rank.
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstring>
#include <functional>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "mp_common.h"
#include "random_mix_plan.h"
#include "tests/common/check.h"
#include "tests/common/tensors.h"

namespace {

using concord::harness::CombineValues;
using concord::harness::IsFloat;
using concord::harness::LoadElement;
using concord::harness::StoreElement;

using mp_mix::DrawRound;
using mp_mix::InputValue;
using mp_mix::Kind;
using mp_mix::KindName;
using mp_mix::Mine;
using mp_mix::Perturb;
using mp_mix::PerturbName;
using mp_mix::Plan;
using mp_mix::Rng;
using mp_mix::Spec;

// A tensor's bytes and shape.
struct Buffer {
  std::vector<unsigned char> bytes;
  int64_t shape[2] = {0, 1};
  int ndim = 1;
  concord_dtype_t dtype = CONCORD_FLOAT32;
  concord_tensor_t Tensor() {
    return concord_tensor_t{bytes.empty() ? nullptr : bytes.data(), dtype, ndim, shape,
                            CONCORD_DEVICE_CPU};
  }
  int64_t Elements() const { return shape[0] * (ndim == 2 ? shape[1] : 1); }
};

Buffer MakeBuffer(const Spec& s, int64_t rows, unsigned char fill = 0xA5) {
  Buffer b;
  b.dtype = s.dtype;
  b.ndim = s.cols == 1 ? 1 : 2;
  b.shape[0] = rows;
  b.shape[1] = s.cols;
  b.bytes.assign(static_cast<size_t>(rows * s.cols) * ElementSize(s.dtype), fill);
  return b;
}

void FillInput(const Spec& s, int rank, Buffer* b) {
  for (int64_t j = 0; j < b->Elements(); ++j) {
    StoreElement(s.dtype, b->bytes.data(), static_cast<size_t>(j), InputValue(s, rank, j));
  }
}

// What one rank holds of one operation while it runs.
struct Slot {
  Spec spec;               // this rank's view (Mine)
  bool takes_part = true;  // false: a send/recv between two other ranks
  bool expect_mismatch = false;
  Buffer input, output;
  concord_allreduce_opts_t ar_opts;
  concord_reducescatter_opts_t rs_opts;
  concord_alltoall_opts_t a2a_opts;
  concord_reduce_opts_t rd_opts;
  concord_request_t request = nullptr;
  concord_status_t submitted = CONCORD_SUCCESS;
  std::string submit_error;
  bool with_callback = false;
  std::atomic<int> callbacks{0};
  std::atomic<int> callback_status{-1};
  // spec.then: the allreduce its callback enqueued (on the thread that completed it).
  concord_comm_t comm = nullptr;
  int rank = 0;
  std::vector<float> then_data;
  concord_request_t then_request = nullptr;
  concord_status_t then_submitted = CONCORD_SUCCESS;
};

void OnComplete(concord_request_t, concord_status_t status, void* user_data) {
  auto* slot = static_cast<Slot*>(user_data);
  slot->callback_status.store(static_cast<int>(status));
  if (slot->spec.then && status == CONCORD_SUCCESS) {
    // An operation enqueued from a completion callback, as a framework's hook may.
    slot->then_data.assign(7, static_cast<float>(slot->rank + 1));
    static const int64_t kShape[1] = {7};
    const concord_tensor_t t{slot->then_data.data(), CONCORD_FLOAT32, 1, kShape,
                             CONCORD_DEVICE_CPU};
    slot->then_submitted =
        concord_allreduce_async(slot->comm, (slot->spec.name + ".then").c_str(), &t, nullptr,
                                nullptr, nullptr, nullptr, &slot->then_request);
  }
  slot->callbacks.fetch_add(1);  // last: the waiter reads what the callback wrote after it
}

class Round {
 public:
  Round(concord_comm_t comm, const char* comm_name, int rank, const Plan& plan, int round)
      : comm_(comm),
        comm_name_(comm_name),
        rank_(rank),
        size_(plan.size),
        seed_(plan.seed),
        round_(round),
        active_(plan.ActiveRanks(round)) {}

  void Prepare(const std::vector<Spec>& specs) {
    slots_ = std::vector<Slot>(specs.size());
    Rng rng((seed_ * 31 + static_cast<uint64_t>(round_)) * 131 + static_cast<uint64_t>(rank_));
    for (size_t i = 0; i < specs.size(); ++i) {
      Prepare(specs[i], &slots_[i]);
      slots_[i].with_callback = specs[i].then || rng.Chance(0.3);
      slots_[i].comm = comm_;
      slots_[i].rank = rank_;
    }
    // Units: a group or one operation; this rank's own order.
    for (size_t i = 0; i < specs.size();) {
      size_t end = i + 1;
      while (specs[i].group >= 0 && end < specs.size() && specs[end].group == specs[i].group) ++end;
      units_.push_back({i, end});
      i = end;
    }
    std::shuffle(units_.begin(), units_.end(), rng.gen());
    for (size_t i = 0; i < specs.size(); ++i) wait_order_.push_back(i);
    std::shuffle(wait_order_.begin(), wait_order_.end(), rng.gen());
    for (size_t i = 0; i < units_.size(); ++i) sleeps_.push_back(rng.Chance(0.05));
    for (size_t i = 0; i < specs.size(); ++i) polls_.push_back(rng.Chance(0.3));
  }

  // Two threads take the units in this rank's order.
  void Submit() {
    std::atomic<size_t> next{0};
    auto work = [&] {
      for (size_t u; (u = next.fetch_add(1)) < units_.size();) {
        if (rank_ == dead_ && u == kill_after_) Die();
        if (sleeps_[u]) std::this_thread::sleep_for(std::chrono::milliseconds(1));
        const auto [begin, end] = units_[u];
        const bool grouped = end - begin > 1;
        if (grouped && concord_group_start(comm_) != CONCORD_SUCCESS) {
          slots_[begin].submitted = CONCORD_ERR_INTERNAL;
          slots_[begin].submit_error =
              std::string("group_start: ") + concord_comm_last_error(comm_);
        }
        for (size_t i = begin; i < end; ++i) SubmitOne(&slots_[i]);
        if (grouped) {
          const concord_status_t s = concord_group_end(comm_);
          if (s != CONCORD_SUCCESS) {
            slots_[begin].submitted = s;
            slots_[begin].submit_error =
                std::string("group_end: ") + concord_comm_last_error(comm_);
          }
        }
      }
    };
    std::thread other(work);
    work();
    other.join();
    if (rank_ == dead_) Die();
  }

  long mismatches() const { return mismatches_; }

  // This round rank `victim` SIGKILLs itself partway through its submissions (after a random
  // number of units, from either submitting thread); the others expect each operation to come
  // out right or fail naming it.
  void SetDeath(int victim) {
    dead_ = victim;
    Rng rng(seed_ * 977 + static_cast<uint64_t>(round_));
    kill_after_ = static_cast<size_t>(rng.Below(static_cast<int64_t>(units_.size()) + 1));
  }
  long survived_failures() const { return survived_failures_; }

  // Waits for every operation in this rank's order and checks it. Returns the checks made.
  long WaitAndCheck() {
    long checks = 0;
    for (size_t i : wait_order_) checks += WaitAndCheck(&slots_[i], polls_[i]);
    return checks;
  }

 private:
  void Prepare(const Spec& common, Slot* slot) {
    slot->spec = Mine(common, rank_, size_);
    const Spec& s = slot->spec;
    slot->expect_mismatch =
        common.perturb != Perturb::kNone && (common.kind != Kind::kSendRecv || rank_ == common.dst);
    switch (s.kind) {
      case Kind::kAllreduce:
      case Kind::kBroadcast:
      case Kind::kReduce:
        slot->input = MakeBuffer(s, s.rows);
        FillInput(s, rank_, &slot->input);
        if (!s.in_place) slot->output = MakeBuffer(s, s.rows, 0x5A);
        break;
      case Kind::kAllgather:
      case Kind::kGather: {
        slot->input = MakeBuffer(s, s.rank_rows[static_cast<size_t>(rank_)]);
        FillInput(s, rank_, &slot->input);
        int64_t total = 0;
        for (int64_t r : s.rank_rows) total += r;
        if (!s.owned) slot->output = MakeBuffer(s, total, 0x5A);
        break;
      }
      case Kind::kReducescatter:
        slot->input = MakeBuffer(s, s.rows);
        FillInput(s, rank_, &slot->input);
        if (!s.in_place) slot->output = MakeBuffer(s, RecvRows(s), 0x5A);
        break;
      case Kind::kAlltoall: {
        int64_t sent = s.rows;
        if (!s.a2a.empty()) {
          sent = 0;
          for (int64_t r : s.a2a[static_cast<size_t>(rank_)]) sent += r;
        }
        slot->input = MakeBuffer(s, sent);
        FillInput(s, rank_, &slot->input);
        if (!s.owned) slot->output = MakeBuffer(s, AlltoallRecvTotal(s), 0x5A);
        break;
      }
      case Kind::kSendRecv:
        slot->takes_part = rank_ == s.src || rank_ == s.dst;
        if (rank_ == s.src) {
          slot->input = MakeBuffer(s, s.rows);
          FillInput(s, rank_, &slot->input);
        } else if (rank_ == s.dst && s.recv_expected) {
          slot->output = MakeBuffer(s, s.rows, 0x5A);
        }
        break;
      case Kind::kBarrier:
        break;
    }
  }

  // Reducescatter: the rows this rank receives, and the first of them in the full result.
  int64_t RecvRows(const Spec& s) const { return RecvRange(s).second; }
  std::pair<int64_t, int64_t> RecvRange(const Spec& s) const {
    int64_t first = 0;
    for (int r = 0; r < size_; ++r) {
      const int64_t n = s.splits.empty() ? s.rows / size_ + (r < s.rows % size_ ? 1 : 0)
                                         : s.splits[static_cast<size_t>(r)];
      if (r == rank_) return {first, n};
      first += n;
    }
    return {first, 0};
  }
  // Alltoall: rows rank `from` sends rank `to`, and the first of them in `from`'s input.
  std::pair<int64_t, int64_t> AlltoallPart(const Spec& s, int from, int to) const {
    if (s.a2a.empty()) return {to * (s.rows / size_), s.rows / size_};
    const auto& row = s.a2a[static_cast<size_t>(from)];
    int64_t first = 0;
    for (int d = 0; d < to; ++d) first += row[static_cast<size_t>(d)];
    return {first, row[static_cast<size_t>(to)]};
  }
  int64_t AlltoallRecvTotal(const Spec& s) const {
    int64_t total = 0;
    for (int r = 0; r < size_; ++r) total += AlltoallPart(s, r, rank_).second;
    return total;
  }

  void SubmitOne(Slot* slot) {
    const Spec& s = slot->spec;
    if (!slot->takes_part) return;
    const char* name = s.name.c_str();
    concord_callback_t cb = slot->with_callback ? OnComplete : nullptr;
    void* ud = slot->with_callback ? slot : nullptr;
    concord_tensor_t in = slot->input.Tensor();
    concord_tensor_t out = slot->output.Tensor();
    const concord_tensor_t* out_or_null = s.in_place ? nullptr : &out;
    concord_status_t st = CONCORD_SUCCESS;
    switch (s.kind) {
      case Kind::kAllreduce:
        concord_allreduce_opts_init(&slot->ar_opts);
        slot->ar_opts.op = s.op;
        slot->ar_opts.prescale = s.prescale;
        slot->ar_opts.postscale = s.postscale;
        slot->ar_opts.compression = s.compression;
        st = concord_allreduce_async(comm_, name, &in, out_or_null, &slot->ar_opts, cb, ud,
                                     &slot->request);
        break;
      case Kind::kBroadcast:
        st = concord_broadcast_async(comm_, name, &in, out_or_null, s.root, cb, ud, &slot->request);
        break;
      case Kind::kReduce:
        concord_reduce_opts_init(&slot->rd_opts);
        slot->rd_opts.op = s.op;
        slot->rd_opts.prescale = s.prescale;
        slot->rd_opts.postscale = s.postscale;
        st = concord_reduce_async(comm_, name, &in, out_or_null, s.root, &slot->rd_opts, cb, ud,
                                  &slot->request);
        break;
      case Kind::kAllgather:
        st = concord_allgather_async(comm_, name, &in, s.owned ? nullptr : out.data,
                                     slot->output.bytes.size(), cb, ud, &slot->request);
        break;
      case Kind::kGather:
        st = concord_gather_async(comm_, name, &in, s.owned ? nullptr : out.data,
                                  slot->output.bytes.size(), s.root, cb, ud, &slot->request);
        break;
      case Kind::kReducescatter: {
        concord_reducescatter_opts_init(&slot->rs_opts);
        slot->rs_opts.op = s.op;
        slot->rs_opts.prescale = s.prescale;
        slot->rs_opts.postscale = s.postscale;
        if (!s.splits.empty()) {
          slot->rs_opts.recv_splits = s.splits.data();
          slot->rs_opts.nsplits = size_;
        }
        concord_tensor_t rs_out = out;
        if (s.in_place) {
          slot->output = MakeBuffer(s, RecvRows(s));  // only for its shape
          rs_out = slot->output.Tensor();
          rs_out.data = in.data;
        }
        st = concord_reducescatter_async(comm_, name, &in, &rs_out, &slot->rs_opts, cb, ud,
                                         &slot->request);
        break;
      }
      case Kind::kAlltoall:
        concord_alltoall_opts_init(&slot->a2a_opts);
        if (!s.a2a.empty()) {
          slot->a2a_opts.splits = s.a2a[static_cast<size_t>(rank_)].data();
          slot->a2a_opts.nsplits = size_;
        }
        st = concord_alltoall_async(comm_, name, &in, s.owned ? nullptr : out.data,
                                    slot->output.bytes.size(), &slot->a2a_opts, cb, ud,
                                    &slot->request);
        break;
      case Kind::kSendRecv:
        if (rank_ == s.src) {
          st = concord_send_async(comm_, &in, s.dst, s.id, cb, ud, &slot->request);
        } else {
          st = concord_recv_async(comm_, s.recv_expected ? &out : nullptr, s.src, s.id, cb, ud,
                                  &slot->request);
        }
        break;
      case Kind::kBarrier:
        st = concord_barrier_async(comm_, cb, ud, &slot->request);
        break;
    }
    slot->submitted = st;
    if (st != CONCORD_SUCCESS) slot->submit_error = concord_comm_last_error(comm_);
  }

  // A survivor's operation of the round rank dead_ died in: refused at enqueue or failed, naming
  // it, within the deadline; or done and right.
  long WaitAfterDeath(Slot* slot) {
    concord_status_t st = slot->submitted;
    std::string error = slot->submit_error;
    if (st == CONCORD_SUCCESS) {
      const char* timeout = std::getenv("CONCORD_TIMEOUT_S");
      st = concord_wait(slot->request, (timeout != nullptr ? std::atof(timeout) : 30) + 5);
      error = concord_request_error(slot->request);
    }
    long checks = 1;
    if (slot->with_callback && slot->submitted == CONCORD_SUCCESS && st != CONCORD_IN_PROGRESS) {
      CHECKF(slot->callbacks.load() == 1, "%s: %d callbacks after rank %d died",
             What(*slot).c_str(), slot->callbacks.load(), dead_);
    }
    if (st == CONCORD_SUCCESS && !slot->expect_mismatch) {
      checks = CheckResult(slot);
    } else if (st == CONCORD_IN_PROGRESS) {
      FAILF("%s: still running after rank %d died, past the deadline", What(*slot).c_str(), dead_);
    } else if (!(slot->expect_mismatch && st == CONCORD_ERR_MISMATCH)) {
      CHECKF(NamesTheDead(error), "%s: after rank %d died: %s: %s", What(*slot).c_str(), dead_,
             concord_status_string(st), error.c_str());
      ++survived_failures_;
    }
    if (slot->request != nullptr) concord_request_free(slot->request);
    slot->request = nullptr;
    if (slot->then_request != nullptr) concord_request_free(slot->then_request);
    slot->then_request = nullptr;
    return checks;
  }

  // Describes the operation in a failure line.
  std::string What(const Slot& slot) const {
    const Spec& s = slot.spec;
    return std::string(comm_name_) + " seed " + std::to_string(seed_) + " round " +
           std::to_string(round_) + " " + KindName(s.kind) + " '" + s.name + "' (" +
           mp::DTypeName(s.dtype) + ", " + std::to_string(s.rows) + "x" + std::to_string(s.cols) +
           (s.kind == Kind::kSendRecv
                ? ", rank " + std::to_string(s.src) + " to rank " + std::to_string(s.dst)
                : ", root " + std::to_string(s.root)) +
           (s.in_place ? ", in place" : "") + (s.owned ? ", owned" : "") +
           (s.group >= 0 ? ", grouped" : "") + ")";
  }

  // SIGKILL, with what this rank submitted still in flight.
  static void Die() {
    std::fflush(nullptr);
    raise(SIGKILL);
  }

  // Whether `error` names rank dead_ ("rank 2", not "rank 21").
  bool NamesTheDead(const std::string& error) const {
    const std::string rank = "rank " + std::to_string(dead_);
    for (size_t at = error.find(rank); at != std::string::npos; at = error.find(rank, at + 1)) {
      const size_t after = at + rank.size();
      if (after == error.size() || !std::isdigit(static_cast<unsigned char>(error[after]))) {
        return true;
      }
    }
    return false;
  }

  long WaitAndCheck(Slot* slot, bool poll) {
    if (!slot->takes_part) return 0;
    if (dead_ >= 0) return WaitAfterDeath(slot);
    if (slot->submitted != CONCORD_SUCCESS) {
      FAILF("%s: submit: %s: %s", What(*slot).c_str(), concord_status_string(slot->submitted),
            slot->submit_error.c_str());
      if (slot->request != nullptr) concord_request_free(slot->request);
      return 0;
    }
    concord_status_t st;
    if (poll) {
      const double deadline = mp::Now() + 60;
      while ((st = concord_test(slot->request)) == CONCORD_IN_PROGRESS && mp::Now() < deadline) {
        std::this_thread::yield();
      }
    } else {
      st = concord_wait(slot->request, 60);
    }
    long checks = 0;
    if (slot->expect_mismatch) {
      // Every rank fails, naming the tensor (a recv: its tag); the other operations are not
      // disturbed.
      const std::string error = concord_request_error(slot->request);
      const std::string named = slot->spec.kind == Kind::kSendRecv
                                    ? "with tag " + std::to_string(slot->spec.id) + ":"
                                    : "'" + slot->spec.name + "'";
      CHECKF(st == CONCORD_ERR_MISMATCH && mp::Contains(error, named),
             "%s: %s given differently by rank %d: %s: %s", What(*slot).c_str(),
             PerturbName(slot->spec.perturb), slot->spec.odd_rank, concord_status_string(st),
             error.c_str());
      ++mismatches_;
      checks = 1;
    } else if (st != CONCORD_SUCCESS) {
      FAILF("%s: %s: %s", What(*slot).c_str(), concord_status_string(st),
            concord_request_error(slot->request));
    } else {
      checks = CheckResult(slot);
    }
    if (slot->with_callback) {
      // The callback runs before the request completes for its waiters.
      CHECKF(slot->callbacks.load() == 1 && slot->callback_status.load() == static_cast<int>(st),
             "%s: %d callbacks, the last with status %d, for a request that ended with %d",
             What(*slot).c_str(), slot->callbacks.load(), slot->callback_status.load(),
             static_cast<int>(st));
    }
    if (slot->spec.then && st == CONCORD_SUCCESS) checks += CheckThen(slot);
    concord_request_free(slot->request);
    slot->request = nullptr;
    return checks;
  }

  // The allreduce the callback enqueued: every submitting rank's (rank + 1), summed.
  long CheckThen(Slot* slot) {
    if (slot->then_submitted != CONCORD_SUCCESS || slot->then_request == nullptr) {
      FAILF("%s: the allreduce its callback enqueued: %s", What(*slot).c_str(),
            concord_status_string(slot->then_submitted));
      return 0;
    }
    const concord_status_t st = concord_wait(slot->then_request, 60);
    float want = 0;
    for (int r : active_) want += static_cast<float>(r + 1);
    const bool ok =
        st == CONCORD_SUCCESS && std::all_of(slot->then_data.begin(), slot->then_data.end(),
                                             [want](float v) { return v == want; });
    CHECKF(ok, "%s: the allreduce its callback enqueued: %s: %s, first element %g, want %g",
           What(*slot).c_str(), concord_status_string(st),
           concord_request_error(slot->then_request), slot->then_data.at(0), want);
    concord_request_free(slot->then_request);
    slot->then_request = nullptr;
    return 1;
  }

  // Compares `count` elements of `data` from `first` on against want(j); one failure line per
  // operation at most.
  long Compare(const Slot& slot, const void* data, int64_t count, const char* what,
               concord_dtype_t tolerance_of, const std::function<double(int64_t)>& want) {
    const Spec& s = slot.spec;
    for (int64_t j = 0; j < count; ++j) {
      const double got = LoadElement(s.dtype, data, static_cast<size_t>(j));
      const double w = want(j);
      if (!mp::Close(got, w, tolerance_of)) {
        FAILF("%s: %s element %lld of %lld is %g, want %g", What(slot).c_str(), what,
              static_cast<long long>(j), static_cast<long long>(count), got, w);
        return j;
      }
    }
    return count;
  }

  // The owned or given output of an allgather, gather or alltoall: its data, checked for size.
  const void* Output(Slot* slot, int64_t rows, bool* ok) {
    const Spec& s = slot->spec;
    void* data = nullptr;
    size_t bytes = 0;
    int64_t first = -1;
    const concord_status_t st = concord_request_output(slot->request, &data, &bytes, &first);
    const size_t want_bytes = static_cast<size_t>(rows * s.cols) * ElementSize(s.dtype);
    *ok = st == CONCORD_SUCCESS && bytes == want_bytes && first == rows &&
          (s.owned || data == slot->output.bytes.data() || rows == 0);
    CHECKF(*ok, "%s: output: %s, %zu bytes (want %zu), first dimension %lld (want %lld)",
           What(*slot).c_str(), concord_status_string(st), bytes, want_bytes,
           static_cast<long long>(first), static_cast<long long>(rows));
    return data;
  }

  long CheckResult(Slot* slot) {
    const Spec& s = slot->spec;
    const int64_t row_elems = s.cols;
    const concord_dtype_t tol = s.compression == nullptr                  ? s.dtype
                                : std::strcmp(s.compression, "fp16") == 0 ? CONCORD_FLOAT16
                                                                          : CONCORD_BFLOAT16;
    auto reduced = [&](int64_t j) {  // the active ranks' inputs: joined ones add the identity
      double acc = 0;
      int n = 0;
      for (int r : active_) {
        const double v = s.prescale * InputValue(s, r, j);
        acc = n++ == 0 ? v : CombineValues(s.op, acc, v);
      }
      if (s.op == CONCORD_AVERAGE) acc = IsFloat(s.dtype) ? acc / n : std::trunc(acc / n);
      return acc * s.postscale;
    };
    switch (s.kind) {
      case Kind::kAllreduce: {
        const Buffer& b = s.in_place ? slot->input : slot->output;
        return Compare(*slot, b.bytes.data(), b.Elements(), "result", tol, reduced);
      }
      case Kind::kBroadcast: {
        const Buffer& b = s.in_place ? slot->input : slot->output;
        return Compare(*slot, b.bytes.data(), b.Elements(), "result", s.dtype,
                       [&](int64_t j) { return InputValue(s, s.root, j); });
      }
      case Kind::kReduce: {
        if (rank_ == s.root) {
          const Buffer& b = s.in_place ? slot->input : slot->output;
          return Compare(*slot, b.bytes.data(), b.Elements(), "result", s.dtype, reduced);
        }
        long n =
            Compare(*slot, slot->input.bytes.data(), slot->input.Elements(), "non-root's input",
                    s.dtype, [&](int64_t j) { return InputValue(s, rank_, j); });
        const bool untouched = std::all_of(slot->output.bytes.begin(), slot->output.bytes.end(),
                                           [](unsigned char c) { return c == 0x5A; });
        CHECKF(untouched, "%s: a non-root's output was written", What(*slot).c_str());
        return n + 1;
      }
      case Kind::kAllgather:
      case Kind::kGather: {
        if (s.kind == Kind::kGather && rank_ != s.root) {
          void* data = nullptr;
          size_t bytes = 1;
          int64_t first = 1;
          concord_request_output(slot->request, &data, &bytes, &first);
          CHECKF(data == nullptr && bytes == 0 && first == 0,
                 "%s: a non-root's gather output: %p, %zu bytes, first dimension %lld",
                 What(*slot).c_str(), data, bytes, static_cast<long long>(first));
          return 1;
        }
        int64_t total = 0;
        for (int64_t r : s.rank_rows) total += r;
        bool ok = false;
        const void* data = Output(slot, total, &ok);
        if (!ok) return 0;
        std::vector<std::pair<int, int64_t>> origin;  // output row -> (rank, its row)
        for (int r = 0; r < size_; ++r) {
          for (int64_t k = 0; k < s.rank_rows[static_cast<size_t>(r)]; ++k)
            origin.push_back({r, k});
        }
        return Compare(*slot, data, total * row_elems, "result", s.dtype, [&](int64_t j) {
          const auto& [r, k] = origin[static_cast<size_t>(j / row_elems)];
          return InputValue(s, r, k * row_elems + j % row_elems);
        });
      }
      case Kind::kReducescatter: {
        const std::pair<int64_t, int64_t> range = RecvRange(s);
        const int64_t first = range.first, rows = range.second;
        const void* data = s.in_place ? slot->input.bytes.data() : slot->output.bytes.data();
        return Compare(*slot, data, rows * row_elems, "result", tol,
                       [&](int64_t j) { return reduced(first * row_elems + j); });
      }
      case Kind::kAlltoall: {
        const int64_t total = AlltoallRecvTotal(s);
        bool ok = false;
        const void* data = Output(slot, total, &ok);
        std::vector<int64_t> received(static_cast<size_t>(size_), -1);
        const concord_status_t st =
            concord_request_received_splits(slot->request, received.data(), size_);
        for (int r = 0; r < size_; ++r) {
          CHECKF(st == CONCORD_SUCCESS &&
                     received[static_cast<size_t>(r)] == AlltoallPart(s, r, rank_).second,
                 "%s: received splits: %s, from rank %d: %lld rows, want %lld", What(*slot).c_str(),
                 concord_status_string(st), r,
                 static_cast<long long>(received[static_cast<size_t>(r)]),
                 static_cast<long long>(AlltoallPart(s, r, rank_).second));
        }
        if (!ok) return 0;
        std::vector<std::pair<int, int64_t>> origin;  // output row -> (rank, its input row)
        for (int r = 0; r < size_; ++r) {
          const auto [from, n] = AlltoallPart(s, r, rank_);
          for (int64_t k = 0; k < n; ++k) origin.push_back({r, from + k});
        }
        return Compare(*slot, data, total * row_elems, "result", s.dtype, [&](int64_t j) {
          const auto& [r, k] = origin[static_cast<size_t>(j / row_elems)];
          return InputValue(s, r, k * row_elems + j % row_elems);
        });
      }
      case Kind::kSendRecv: {
        if (rank_ == s.src) return 0;
        const void* data = slot->output.bytes.data();
        if (!s.recv_expected) {
          void* owned = nullptr;
          size_t bytes = 0;
          int64_t first = -1;
          concord_dtype_t dtype = CONCORD_UINT8;
          int ndim = -1;
          int64_t shape[CONCORD_MAX_DIMS] = {};
          concord_request_output(slot->request, &owned, &bytes, &first);
          concord_request_output_shape(slot->request, &dtype, &ndim, shape);
          const int want_ndim = s.cols == 1 ? 1 : 2;
          const bool ok = dtype == s.dtype && ndim == want_ndim && shape[0] == s.rows &&
                          (ndim == 1 || shape[1] == s.cols) &&
                          bytes == static_cast<size_t>(s.rows * s.cols) * ElementSize(s.dtype);
          CHECKF(ok, "%s: received %s, %d dims, first %lld, %zu bytes", What(*slot).c_str(),
                 mp::DTypeName(dtype), ndim, static_cast<long long>(shape[0]), bytes);
          if (!ok) return 0;
          data = owned;
        }
        return Compare(*slot, data, s.rows * s.cols, "received", s.dtype,
                       [&](int64_t j) { return InputValue(s, s.src, j); });
      }
      case Kind::kBarrier:
        return 1;
    }
    return 0;
  }

  concord_comm_t comm_;
  const char* const comm_name_;  // "world" or "split"
  const int rank_, size_;
  const uint64_t seed_;
  const int round_;
  const std::vector<int> active_;  // the ranks that submit this round (the others joined)
  std::vector<Slot> slots_;
  std::vector<std::pair<size_t, size_t>> units_;  // [begin, end) of slots
  std::vector<size_t> wait_order_;
  std::vector<bool> sleeps_, polls_;
  long mismatches_ = 0;
  int dead_ = -1;  // the rank that dies this round (SetDeath), or -1
  size_t kill_after_ = 0;
  long survived_failures_ = 0;
};

bool HasFlag(int argc, char** argv, const char* flag) {
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], flag) == 0) return true;
  }
  return false;
}

int64_t Arg(int argc, char** argv, const char* flag, int64_t fallback) {
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], flag) == 0) return std::atoll(argv[i + 1]);
  }
  return fallback;
}

int Run(int argc, char** argv) {
  const uint64_t seed = static_cast<uint64_t>(Arg(argc, argv, "--seed", 1));
  const int rounds = static_cast<int>(Arg(argc, argv, "--rounds", 12));
  Plan plan;
  plan.seed = seed;
  plan.ops = static_cast<int>(Arg(argc, argv, "--ops", 48));
  plan.max_rows = Arg(argc, argv, "--max-rows", 40000);
  plan.mismatch_rate = static_cast<double>(Arg(argc, argv, "--mismatch-percent", 0)) / 100;
  const bool join = HasFlag(argc, argv, "--join");
  const int victim = static_cast<int>(Arg(argc, argv, "--kill", -1));
  const int kill_round = static_cast<int>(Arg(argc, argv, "--kill-round", rounds / 2));
  if ((join ? 1 : 0) + (HasFlag(argc, argv, "--split") ? 1 : 0) + (victim >= 0 ? 1 : 0) > 1) {
    std::fprintf(stderr, "--join, --split and --kill do not go together\n");
    return 2;
  }
  // Pretend the ranks run on K hosts, rank r on host r % K (CONCORD_HOST_ID), so that with
  // CONCORD_HIERARCHICAL=on the hierarchical backend runs.
  if (const int64_t hosts = Arg(argc, argv, "--hosts-interleaved", 0); hosts > 0) {
    const char* r = std::getenv("CONCORD_RANK");
    if (r == nullptr) {
      std::fprintf(stderr, "--hosts-interleaved needs CONCORD_RANK (run under concordrun)\n");
      return 2;
    }
    setenv("CONCORD_HOST_ID", ("random-mix-host-" + std::to_string(std::atoi(r) % hosts)).c_str(),
           1);
  }
  int rank = 0, size = 1;
  concord_comm_t comm = mp::InitOrExit(&rank, &size);
  plan.size = size;
  // --join: every rank runs out of data after its own number of rounds (one at least runs them
  // all) and calls concord_join, which returns the last of those that ran the most.
  int last_rounds = rounds;
  if (join) {
    Rng rng(seed * 7919 + 5);
    for (int r = 0; r < size; ++r) {
      plan.last_round.push_back(r == static_cast<int>(seed % static_cast<uint64_t>(size))
                                    ? rounds
                                    : rounds - static_cast<int>(rng.Below(rounds / 2 + 1)));
    }
    last_rounds = plan.last_round[static_cast<size_t>(rank)];
  }
  // --split: a sub-communicator of this rank's parity, in reverse rank order, runs its own mix
  // beside the world's: both rounds are submitted at once (four threads), then checked here.
  concord_comm_t sub = nullptr;
  int sub_rank = 0, sub_size = 0;
  if (HasFlag(argc, argv, "--split")) {
    const concord_status_t s = concord_comm_split(comm, rank % 2, size - rank, &sub);
    if (s != CONCORD_SUCCESS || sub == nullptr) {
      FAILF("concord_comm_split: %s: %s", concord_status_string(s), concord_comm_last_error(comm));
      return 1;
    }
    concord_comm_rank(sub, &sub_rank);
    concord_comm_size(sub, &sub_size);
  }
  const double t0 = mp::Now();
  long checks = 0, operations = 0, mismatches = 0, survived_failures = -1;
  for (int round = 0; round < last_rounds; ++round) {
    const std::vector<Spec> specs = DrawRound(plan, round);
    Round r(comm, "world", rank, plan, round);
    r.Prepare(specs);
    if (victim >= 0 && round == kill_round) r.SetDeath(victim);
    std::vector<Spec> sub_specs;
    std::optional<Round> on_sub;
    if (sub != nullptr) {
      Plan sub_plan = plan;
      sub_plan.seed = seed * 2 + 1 + static_cast<uint64_t>(rank % 2);
      sub_plan.size = sub_size;
      sub_specs = DrawRound(sub_plan, round);
      on_sub.emplace(sub, "split", sub_rank, sub_plan, round);
      on_sub->Prepare(sub_specs);
    }
    std::thread sub_submitter([&] {
      if (on_sub) on_sub->Submit();
    });
    r.Submit();
    sub_submitter.join();
    checks += r.WaitAndCheck();
    mismatches += r.mismatches();
    operations += static_cast<long>(specs.size());
    if (victim >= 0 && round == kill_round) {
      survived_failures = r.survived_failures();
      last_rounds = round + 1;
      break;
    }
    CHECK_STATUS(concord_end_step(comm), CONCORD_SUCCESS);
    if (on_sub) {
      checks += on_sub->WaitAndCheck();
      mismatches += on_sub->mismatches();
      operations += static_cast<long>(sub_specs.size());
      CHECK_STATUS(concord_end_step(sub), CONCORD_SUCCESS);
    }
  }
  if (survived_failures >= 0) {
    // Later operations fail at once (at enqueue or their first wait), naming the dead rank.
    std::vector<float> x(5, 1.0f);
    int64_t shape[1] = {5};
    concord_tensor_t t{x.data(), CONCORD_FLOAT32, 1, shape, CONCORD_DEVICE_CPU};
    concord_request_t request = nullptr;
    const double t_later = mp::Now();
    concord_status_t st = concord_allreduce_async(comm, "after.death", &t, nullptr, nullptr,
                                                  nullptr, nullptr, &request);
    std::string error = concord_comm_last_error(comm);
    if (st == CONCORD_SUCCESS) {
      st = concord_wait(request, 2.0);
      error = concord_request_error(request);
      concord_request_free(request);
    }
    CHECKF(st != CONCORD_SUCCESS && st != CONCORD_IN_PROGRESS &&
               mp::Contains(error, "rank " + std::to_string(victim)),
           "an allreduce after rank %d died: %s after %.3f s: %s", victim,
           concord_status_string(st), mp::Now() - t_later, error.c_str());
  }
  if (join) {
    int last = -1;
    const concord_status_t s = concord_join(comm, &last);
    const int most = *std::max_element(plan.last_round.begin(), plan.last_round.end());
    CHECKF(s == CONCORD_SUCCESS && last >= 0 && last < size &&
               plan.last_round[static_cast<size_t>(last)] == most,
           "concord_join after %d of %d rounds: %s (%s), last rank %d", last_rounds, rounds,
           concord_status_string(s), concord_comm_last_error(comm), last);
  }
  if (sub != nullptr) {
    const concord_status_t s = concord_finalize(sub);
    CHECKF(s == CONCORD_SUCCESS, "finalize the split: %s", concord_status_string(s));
  }
  concord_stats_t stats;
  std::memset(&stats, 0, sizeof(stats));
  stats.struct_size = sizeof(stats);
  concord_comm_stats(comm, &stats);
  const double t_finalize = mp::Now();
  const concord_status_t s = concord_finalize(comm);
  // After a death finalize reports it, promptly.
  CHECKF(survived_failures >= 0 ? mp::Now() - t_finalize < 5 : s == CONCORD_SUCCESS,
         "finalize: %s after %.3f s", concord_status_string(s), mp::Now() - t_finalize);
  const int failures = CheckFailures();
  std::printf(
      "random_mix: rank %d of %d: seed %llu, %d of %d rounds, %ld operations (%ld mismatched), %ld "
      "checks, %llu cached and %llu full negotiations, %llu fused tensors, %d failures, %.2f s: "
      "%s\n",
      rank, size, static_cast<unsigned long long>(seed), last_rounds, rounds, operations,
      mismatches, checks, static_cast<unsigned long long>(stats.responses_cached),
      static_cast<unsigned long long>(stats.responses_full),
      static_cast<unsigned long long>(stats.fused_tensors), failures, mp::Now() - t0,
      failures == 0 ? "PASS" : "FAIL");
  if (survived_failures >= 0) {
    std::printf(
        "random_mix: rank %d survived rank %d's death in round %d: %ld operations failed "
        "naming it, the others came out right: %s\n",
        rank, victim, kill_round, survived_failures, failures == 0 ? "PASS" : "FAIL");
  }
  return failures == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  return Run(argc, argv);
}
