// The program of tests/mp/random_mix.cc: what every rank draws alike from the seed (the operations
// of a round, the mismatches and joins among them) and the inputs, which the ranks compute
// alike to check each other's results.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "concord/concord.h"

namespace mp_mix {

enum class Kind {
  kAllreduce,
  kAllgather,
  kGather,
  kBroadcast,
  kReduce,
  kReducescatter,
  kAlltoall,
  kSendRecv,
  kBarrier
};
const char* KindName(Kind k);

enum class Perturb { kNone, kDType, kRows, kOp, kRoot };
const char* PerturbName(Perturb p);

// One operation of the program, the same on every rank.
struct Spec {
  Kind kind = Kind::kBarrier;
  std::string name;
  int id = 0;  // unique in the round: the values' seed and the send/recv tag
  concord_dtype_t dtype = CONCORD_FLOAT32;
  concord_reduce_op_t op = CONCORD_SUM;
  int64_t rows = 0;                // the input's first dimension (per-rank kinds: rank_rows)
  std::vector<int64_t> rank_rows;  // allgather, gather: each rank's rows
  int64_t cols = 1;                // the other dimension (1: a 1-d tensor)
  int root = 0;
  bool in_place = false;
  bool owned = false;  // allgather, gather, alltoall: output owned by the request
  double prescale = 1, postscale = 1;
  const char* compression = nullptr;      // allreduce: "fp16" or "bf16"
  std::vector<int64_t> splits;            // reducescatter: rows each rank receives (empty: even)
  std::vector<std::vector<int64_t>> a2a;  // alltoall: a2a[s][d] rows s sends d (empty: even)
  int src = 0, dst = 0;                   // send/recv
  bool recv_expected = true;              // the recv names the shape
  bool then = false;  // its callback enqueues an allreduce "<name>.then" (on every rank)
  int group = -1;     // members of one group are consecutive
  // A mismatch: rank `odd_rank` gives this field differently (its enqueue is still valid), so
  // every rank's request fails with MISMATCH (a send/recv: the receiver's only).
  Perturb perturb = Perturb::kNone;
  int odd_rank = -1;
};

class Rng {
 public:
  explicit Rng(uint64_t seed) : gen_(seed) {}
  int64_t Below(int64_t n) { return static_cast<int64_t>(gen_() % static_cast<uint64_t>(n)); }
  bool Chance(double p) { return std::uniform_real_distribution<double>(0, 1)(gen_) < p; }
  std::mt19937_64& gen() { return gen_; }

 private:
  std::mt19937_64 gen_;
};

// What every rank draws the rounds of one communicator from.
struct Plan {
  uint64_t seed = 1;
  int size = 1;
  int ops = 48;
  int64_t max_rows = 40000;
  double mismatch_rate = 0;
  // --join: rank r takes part in rounds [0, last_round[r]) and then joins; empty: every round.
  std::vector<int> last_round;
  bool Active(int rank, int round) const {
    return last_round.empty() || round < last_round[static_cast<size_t>(rank)];
  }
  std::vector<int> ActiveRanks(int round) const {
    std::vector<int> active;
    for (int r = 0; r < size; ++r) {
      if (Active(r, round)) active.push_back(r);
    }
    return active;
  }
};

// The operations of round `round` of `plan`; every rank draws the same.
std::vector<Spec> DrawRound(const Plan& plan, int round);

// Rank `rank`'s view of `s` among `size` ranks: the odd rank's field changed (Spec::perturb).
Spec Mine(const Spec& s, int rank, int size);

// Element j of rank r's input of operation s: small enough that every reduction is exact.
double InputValue(const Spec& s, int r, int64_t j);

}  // namespace mp_mix
