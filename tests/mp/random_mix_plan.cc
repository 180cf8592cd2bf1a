#include "random_mix_plan.h"

#include <algorithm>

#include "mp_common.h"
#include "tests/common/tensors.h"

namespace mp_mix {
namespace {

using concord::harness::IsFloat;
using mp::kDTypes;
using mp::kOps;

const double kScales[] = {1.0, 1.0, 0.5, 2.0};

int64_t DrawRows(Rng& rng, int64_t max_rows) {
  const int64_t roll = rng.Below(100);
  if (roll < 10) return 0;
  if (roll < 25) return 1;
  if (roll < 65) return 2 + rng.Below(30);
  if (roll < 90) return 32 + rng.Below(1000);
  return std::max<int64_t>(1, rng.Below(max_rows + 1));
}

// `total` rows split among `parts` at random (some parts 0).
std::vector<int64_t> RandomSplits(Rng& rng, int64_t total, int parts) {
  std::vector<int64_t> cuts{0, total};
  for (int i = 1; i < parts; ++i) cuts.push_back(rng.Below(total + 1));
  std::sort(cuts.begin(), cuts.end());
  std::vector<int64_t> splits;
  for (int i = 0; i < parts; ++i) splits.push_back(cuts[i + 1] - cuts[i]);
  return splits;
}

Spec DrawSpec(Rng& rng, int size, int64_t max_rows) {
  Spec s;
  const int64_t roll = rng.Below(100);
  s.kind = roll < 30   ? Kind::kAllreduce
           : roll < 40 ? Kind::kAllgather
           : roll < 46 ? Kind::kGather
           : roll < 55 ? Kind::kBroadcast
           : roll < 63 ? Kind::kReduce
           : roll < 75 ? Kind::kReducescatter
           : roll < 86 ? Kind::kAlltoall
           : roll < 97 ? Kind::kSendRecv
                       : Kind::kBarrier;
  if (s.kind == Kind::kSendRecv && size < 2) s.kind = Kind::kAllreduce;
  s.dtype = kDTypes[rng.Below(8)];
  s.op = kOps[rng.Below(5)];
  s.cols = std::vector<int64_t>{1, 1, 3, 8}[static_cast<size_t>(rng.Below(4))];
  s.rows = DrawRows(rng, max_rows / s.cols);
  s.root = static_cast<int>(rng.Below(size));
  s.in_place = rng.Chance(0.4);
  s.owned = rng.Chance(0.4);
  if (IsFloat(s.dtype)) {
    s.prescale = kScales[rng.Below(4)];
    s.postscale = kScales[rng.Below(4)];
  }
  switch (s.kind) {
    case Kind::kAllreduce:
      if ((s.dtype == CONCORD_FLOAT32 || s.dtype == CONCORD_FLOAT64) &&
          (s.op == CONCORD_SUM || s.op == CONCORD_AVERAGE) && rng.Chance(0.3)) {
        s.compression = rng.Chance(0.5) ? "fp16" : "bf16";
      }
      break;
    case Kind::kAllgather:
    case Kind::kGather:
      for (int r = 0; r < size; ++r) {
        s.rank_rows.push_back(rng.Chance(0.2) ? 0 : DrawRows(rng, max_rows / s.cols / size));
      }
      break;
    case Kind::kReducescatter:
      if (rng.Chance(0.5)) s.splits = RandomSplits(rng, s.rows, size);
      break;
    case Kind::kAlltoall:
      if (rng.Chance(0.3)) {
        s.rows = size * DrawRows(rng, max_rows / s.cols / size);
      } else {
        for (int r = 0; r < size; ++r) {
          s.a2a.push_back(RandomSplits(rng, DrawRows(rng, max_rows / s.cols / size), size));
        }
      }
      break;
    case Kind::kSendRecv:
      s.src = static_cast<int>(rng.Below(size));
      s.dst = static_cast<int>((s.src + 1 + rng.Below(size - 1)) % size);
      s.recv_expected = rng.Chance(0.7);
      break;
    default:
      break;
  }
  return s;
}

// A field one rank gives differently, such that its own enqueue stays valid: a dtype of the same
// kind (an integer for an integer, a floating type for a floating one: scales apply to floating
// types only; float32 or float64 under compression), one more row where no split depends on the
// rows, another reduction, another root.
void DrawMismatch(Rng& rng, int size, Spec* s) {
  std::vector<Perturb> can{Perturb::kDType};
  if (s->kind == Kind::kAllreduce || s->kind == Kind::kBroadcast || s->kind == Kind::kReduce) {
    can.push_back(Perturb::kRows);
  }
  if ((s->kind == Kind::kAllreduce && s->compression == nullptr) || s->kind == Kind::kReduce) {
    can.push_back(Perturb::kOp);
  }
  if (s->kind == Kind::kBroadcast || s->kind == Kind::kReduce || s->kind == Kind::kGather) {
    can.push_back(Perturb::kRoot);
  }
  if (s->kind == Kind::kSendRecv && !s->recv_expected) return;  // the recv takes any shape
  s->perturb = can[static_cast<size_t>(rng.Below(static_cast<int64_t>(can.size())))];
  s->odd_rank = s->kind == Kind::kSendRecv ? s->dst : static_cast<int>(rng.Below(size));
}

// Fits `s` to a round in which only `active` ranks submit, the others having joined: a
// reduce-scatter or all-to-all (refused then) becomes an allreduce, roots and send/recv ends are
// active ranks, and joined ranks contribute no rows to an allgather or gather.
void FitToJoined(const std::vector<int>& active, int size, Spec* s) {
  if (static_cast<int>(active.size()) == size) return;
  const int n = static_cast<int>(active.size());
  if (s->kind == Kind::kReducescatter || s->kind == Kind::kAlltoall ||
      (s->kind == Kind::kSendRecv && n < 2)) {
    s->kind = Kind::kAllreduce;
    s->compression = nullptr;
  }
  s->root = active[static_cast<size_t>(s->root % n)];
  if (s->kind == Kind::kSendRecv) {
    const int from = s->src % n;
    s->src = active[static_cast<size_t>(from)];
    s->dst = active[static_cast<size_t>((from + 1 + s->dst % (n - 1)) % n)];
  }
  for (int r = 0; r < static_cast<int>(s->rank_rows.size()); ++r) {
    if (std::find(active.begin(), active.end(), r) == active.end()) {
      s->rank_rows[static_cast<size_t>(r)] = 0;
    }
  }
}

}  // namespace

const char* KindName(Kind k) {
  static const char* const kNames[] = {"allreduce", "allgather", "gather",
                                       "broadcast", "reduce",    "reducescatter",
                                       "alltoall",  "send/recv", "barrier"};
  return kNames[static_cast<int>(k)];
}

const char* PerturbName(Perturb p) {
  static const char* const kNames[] = {"nothing", "the dtype", "the rows", "the reduction",
                                       "the root"};
  return kNames[static_cast<int>(p)];
}

Spec Mine(const Spec& s, int rank, int size) {
  Spec mine = s;
  if (rank != s.odd_rank) return mine;
  static const concord_dtype_t kInts[] = {CONCORD_UINT8, CONCORD_INT8, CONCORD_INT32,
                                          CONCORD_INT64};
  static const concord_dtype_t kFloats[] = {CONCORD_FLOAT16, CONCORD_BFLOAT16, CONCORD_FLOAT32,
                                            CONCORD_FLOAT64};
  switch (s.perturb) {
    case Perturb::kDType: {
      const concord_dtype_t* kind = IsFloat(s.dtype) ? kFloats : kInts;
      const int from = s.compression != nullptr ? 2 : 0;  // compression: float32, float64
      for (int i = from; i < 4; ++i) {
        if (kind[i] != s.dtype) {
          mine.dtype = kind[i];
          break;
        }
      }
      break;
    }
    case Perturb::kRows:
      mine.rows = s.rows + 1;
      break;
    case Perturb::kOp:
      mine.op = s.op == CONCORD_SUM ? CONCORD_MAX : CONCORD_SUM;
      break;
    case Perturb::kRoot:
      mine.root = (s.root + 1) % size;
      break;
    case Perturb::kNone:
      break;
  }
  return mine;
}

std::vector<Spec> DrawRound(const Plan& plan, int round) {
  const uint64_t seed = plan.seed;
  const int ops = plan.ops, size = plan.size;
  const int64_t max_rows = plan.max_rows;
  const std::vector<int> active = plan.ActiveRanks(round);
  std::vector<Spec> specs;
  Rng statics(seed * 7919 + 1);  // the same every round
  Rng rng(seed * 7919 + 2 + static_cast<uint64_t>(round));
  const int n_static = ops / 2, n_varying = std::min(4, ops - n_static);
  for (int i = 0; i < ops; ++i) {
    const bool is_static = i < n_static;
    Rng& from = is_static ? statics : rng;
    Spec s = DrawSpec(from, size, max_rows);
    s.name = is_static ? "static." + std::to_string(i)
             : i < n_static + n_varying
                 ? "varying." + std::to_string(i - n_static)
                 : "r" + std::to_string(round) + ".fresh." + std::to_string(i);
    s.id = round * ops + i;
    FitToJoined(active, size, &s);
    specs.push_back(std::move(s));
  }
  // Groups: runs of 2 to 4 collectives, drawn within each part alike on every rank.
  for (size_t i = 0; i + 1 < specs.size();) {
    const bool same_part = specs[i].name.substr(0, 3) == specs[i + 1].name.substr(0, 3);
    Rng& from = i < static_cast<size_t>(n_static) ? statics : rng;
    if (!same_part || !from.Chance(0.15)) {
      ++i;
      continue;
    }
    const size_t want = 2 + static_cast<size_t>(from.Below(3));
    size_t end = i;
    while (end < specs.size() && end - i < want && specs[end].kind != Kind::kSendRecv &&
           specs[end].kind != Kind::kBarrier &&
           specs[end].name.substr(0, 3) == specs[i].name.substr(0, 3)) {
      ++end;
    }
    if (end - i >= 2) {
      for (size_t k = i; k < end; ++k) specs[k].group = static_cast<int>(i);
    }
    i = std::max(end, i + 1);
  }
  Rng then(seed * 7919 + 200003 + static_cast<uint64_t>(round));
  for (Spec& s : specs) s.then = s.kind != Kind::kSendRecv && then.Chance(0.1);
  Rng odd(seed * 7919 + 100003 + static_cast<uint64_t>(round));
  for (Spec& s : specs) {
    if (size > 1 && static_cast<int>(active.size()) == size && s.group < 0 &&
        s.kind != Kind::kBarrier && odd.Chance(plan.mismatch_rate)) {
      DrawMismatch(odd, size, &s);
      s.then = false;  // a mismatch has no callback of success to follow
    }
  }
  return specs;
}

double InputValue(const Spec& s, int r, int64_t j) {
  const int64_t mix = (static_cast<int64_t>(s.id) * 131 + r * 29 + j * 7) & 0x7fffffff;
  const bool reduction =
      s.kind == Kind::kAllreduce || s.kind == Kind::kReduce || s.kind == Kind::kReducescatter;
  const bool is_signed = s.dtype != CONCORD_UINT8;
  if (reduction && (s.op == CONCORD_SUM || s.op == CONCORD_AVERAGE)) {
    return is_signed ? static_cast<double>(mix % 8 - 4) : static_cast<double>(mix % 8);
  }
  if (reduction && s.op == CONCORD_PRODUCT) {
    const double v = static_cast<double>(1 + mix % 2);
    return is_signed && (mix / 2) % 3 == 0 ? -v : v;
  }
  switch (s.dtype) {  // min, max and the data movers: wider, so a misplaced row shows
    case CONCORD_UINT8:
      return static_cast<double>(mix % 251);
    case CONCORD_INT8:
    case CONCORD_BFLOAT16:
      return static_cast<double>(mix % 251 - 125);
    case CONCORD_FLOAT16:
      return static_cast<double>(mix % 2039 - 1019);
    default:
      return static_cast<double>(mix % 100003 - 50001);
  }
}

}  // namespace mp_mix
