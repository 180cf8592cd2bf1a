#include "core/coordinator.h"

#include <algorithm>
#include <functional>
#include <limits>
#include <locale>
#include <set>
#include <sstream>

#include "core/coordinator_internal.h"
#include "core/entry_validation.h"

namespace concord {

using coordinator_internal::ClearBit;
using coordinator_internal::RankList;
using coordinator_internal::SetBit;
using coordinator_internal::TestBit;

namespace {

std::string ShapeString(const std::vector<int64_t>& shape, size_t from) {
  std::string s = "[";
  for (size_t i = from; i < shape.size(); ++i) {
    s += (i > from ? ", " : "") + std::to_string(shape[i]);
  }
  return s + "]";
}

// 17 significant digits: reads back as the same double, so equal text means equal values. In the
// C locale's format ("1234.5"), whatever the application made the global C++ locale.
std::string ExactDouble(double v) {
  std::ostringstream os;
  os.imbue(std::locale::classic());
  os.precision(17);
  os << v;
  return os.str();
}

}  // namespace

Coordinator::Coordinator(int size, const ResponseCache* cache, StallOptions stall,
                         std::chrono::milliseconds straggler_period)
    : size_(size),
      cache_(cache),
      stall_(stall),
      bits_by_rank_(size),
      last_(size),
      finalized_(size, false),
      joined_(size, false),
      join_step_(size, 0),
      step_base_(size, 0),
      stragglers_(size, straggler_period, Clock::now()) {}

std::optional<std::string> Coordinator::StragglerReport(Clock::time_point now) {
  return stragglers_.Report(now);
}

size_t Coordinator::pending() const {
  return pending_.size() + bit_waits_.size() + held_.size();
}

Status Coordinator::Add(int rank, RequestMessage message, Clock::time_point now) {
  if (rank < 0 || rank >= size_)
    return ProtocolError("message from unknown rank " + std::to_string(rank));
  if (message.cache_generation > cache_->generation()) {
    return ProtocolError("rank " + std::to_string(rank) + " sent response-cache generation " +
                         std::to_string(message.cache_generation) +
                         ", ahead of the coordinator's " + std::to_string(cache_->generation()));
  }
  // Every bit is below the capacity: a longer mask is malformed, and its bits past 2^32 would
  // wrap around to entries it does not name.
  if (message.cached_mask.size() > (cache_->capacity() + 63) / 64) {
    return ProtocolError("rank " + std::to_string(rank) + " sent a response-cache mask of " +
                         std::to_string(message.cached_mask.size()) + " words, for a cache of " +
                         std::to_string(cache_->capacity()) + " entries");
  }
  // Steps count from the rank's last completed join (point 8): epochs of different lengths.
  const uint64_t step =
      message.step >= step_base_[rank] ? message.step - step_base_[rank] : uint64_t{0};
  const Response* last_cached = nullptr;
  for (size_t w = 0; w < message.cached_mask.size(); ++w) {
    for (uint64_t word = message.cached_mask[w]; word != 0; word &= word - 1) {
      const auto bit = static_cast<uint32_t>(w * 64 + __builtin_ctzll(word));
      // Evicted while the message was on its way: its sender sends the request again in full.
      if (cache_->EvictedAfter(bit, message.cache_generation)) continue;
      const Response* entry = cache_->Get(bit);
      if (entry == nullptr) {
        return ProtocolError("rank " + std::to_string(rank) + " named response-cache entry " +
                             std::to_string(bit) + ", which does not exist");
      }
      last_cached = entry;
      auto data = message.cached_data.find(bit);
      if (data != message.cached_data.end()) {
        CONCORD_RETURN_IF_ERROR(CheckInlineData(rank, entry->RequestOf(rank), data->second.size()));
      }
      if (joined_[rank]) {
        // Expanded at once, like every bit while a rank is joined (ExpandDivergedBits), so the
        // request is known to have come after the join.
        std::optional<std::string> input;
        if (data != message.cached_data.end()) input = std::move(data->second);
        CONCORD_RETURN_IF_ERROR(
            AddRequest(rank, entry->RequestOf(rank), std::move(input), message.step, now, bit));
        continue;
      }
      SetBit(bits_by_rank_[rank], bit);
      auto [wait, fresh] = bit_waits_.try_emplace(bit);
      if (fresh) wait->second.first_seen = now;
      wait->second.arrivals.Note(rank, now);
      wait->second.steps.Set(rank, size_, step);
      steps_mixed_ = steps_mixed_ || wait->second.steps.mixed;
      if (data == message.cached_data.end()) continue;
      wait->second.data.resize(size_);
      wait->second.data[rank] = std::move(data->second);
    }
  }
  // The requests are moved into the coordinator's state below.
  std::string last_request = message.requests.empty() ? "" : message.requests.back().name;
  for (uint32_t index = 0; index < message.requests.size(); ++index) {
    TensorRequest& request = message.requests[index];
    int64_t elements = 1;
    for (int64_t d : request.shape) {
      if (__builtin_mul_overflow(elements, d, &elements) || elements > kMaxTensorSize) {
        return ProtocolError("rank " + std::to_string(rank) + " sent tensor '" + request.name +
                             "' with a shape too large to exist");
      }
    }
    if (GathersRows(request.op) && request.shape.empty()) {
      return ProtocolError("rank " + std::to_string(rank) + " sent a" +
                           (request.op == OpType::kGather ? " gather" : "n allgather") +
                           " of a scalar ('" + request.name + "')");
    }
    CONCORD_RETURN_IF_ERROR(CheckSplits(rank, request));
    // With ranks joined, one rank's request alone can make an operation ready: its root is
    // compared with no other before it indexes the ranks.
    if (HasRoot(request.op) && (request.root < 0 || request.root >= size_)) {
      return ProtocolError("rank " + std::to_string(rank) + " sent tensor '" + request.name +
                           "' (" + OpTypeName(request.op) + ") with root " +
                           std::to_string(request.root) + ", not a rank of " +
                           std::to_string(size_));
    }
    std::optional<std::string> input;
    auto data = message.request_data.find(index);
    if (data != message.request_data.end()) {
      CONCORD_RETURN_IF_ERROR(CheckInlineData(rank, request, data->second.size()));
      input = std::move(data->second);
    }
    CONCORD_RETURN_IF_ERROR(
        AddRequest(rank, std::move(request), std::move(input), message.step, now, std::nullopt));
  }
  if (!message.requests.empty()) {
    last_[rank].name = std::move(last_request);
  } else if (last_cached != nullptr) {
    last_[rank].name = last_cached->request.name;
  }
  if (last_cached != nullptr || !message.requests.empty()) {
    last_[rank].any = true;
    last_[rank].at = now;
  }
  return Status::Ok();
}

Status Coordinator::AddRequest(int rank, TensorRequest request, std::optional<std::string> data,
                               uint64_t step, Clock::time_point now, std::optional<uint32_t> bit) {
  auto [it, inserted] = pending_.try_emplace(request.name);
  Pending& p = it->second;
  if (inserted) {
    p.by_rank.resize(size_);
    p.first_seen = now;
    arrival_.push_back(request.name);
  }
  if (p.by_rank[rank]) {
    return ProtocolError("rank " + std::to_string(rank) + " sent tensor '" + request.name +
                         "' twice before it completed");
  }
  if (request.name == FinalizeName()) {
    finalized_[rank] = true;
    any_finalized_ = true;
  } else if (IsJoinName(request.name)) {
    if (request.op != OpType::kBarrier) {
      return ProtocolError("rank " + std::to_string(rank) + " sent join '" + request.name +
                           "' as " + OpTypeName(request.op) + ", not a barrier");
    }
    if (!joined_[rank]) join_order_.push_back(rank);
    joined_[rank] = true;
    join_step_[rank] = step;
  } else {
    // Steps count from the rank's last completed join (point 8), or from its join when it is
    // joined: that is where they count from once every rank has joined.
    const uint64_t base = joined_[rank] ? join_step_[rank] : step_base_[rank];
    p.steps.Set(rank, size_, step >= base ? step - base : uint64_t{0});
    steps_mixed_ = steps_mixed_ || p.steps.mixed;
    if (joined_[rank] || !p.after_join.empty()) {
      p.after_join.resize(size_);
      p.after_join[rank] = joined_[rank];
    }
  }
  p.by_rank[rank] = std::move(request);
  ++p.count;
  p.arrivals.Note(rank, now);
  if (bit) p.bits.push_back(*bit);
  if (data) {
    p.data_by_rank.resize(size_);
    p.data_by_rank[rank] = std::move(data);
  }
  return Status::Ok();
}

Status Coordinator::CheckInlineData(int rank, const TensorRequest& request, size_t bytes) const {
  if (request.op == OpType::kBarrier || bytes != request.NumBytes() ||
      (request.op == OpType::kBroadcast && request.root != rank)) {
    return ProtocolError("rank " + std::to_string(rank) + " sent inline data for tensor '" +
                         request.name + "' (" + OpTypeName(request.op) +
                         ") that is not its input of its size");
  }
  return Status::Ok();
}

Status Coordinator::CheckSplits(int rank, const TensorRequest& request) const {
  const bool split = request.op == OpType::kReducescatter || request.op == OpType::kAlltoall;
  int64_t sum = 0;
  for (int64_t c : request.splits) {
    if (__builtin_add_overflow(sum, c, &sum)) sum = -1;
  }
  if (split ? (request.shape.empty() || request.splits.size() != static_cast<size_t>(size_) ||
               sum != request.shape[0])
            : !request.splits.empty()) {
    return ProtocolError("rank " + std::to_string(rank) + " sent tensor '" + request.name + "' (" +
                         OpTypeName(request.op) + ") with splits that do not fit it");
  }
  return Status::Ok();
}

std::optional<std::string> Coordinator::CombineInline(
    const Response& response, std::vector<std::optional<std::string>>& data) const {
  const TensorRequest& request = response.request;
  if (data.size() != static_cast<size_t>(size_) || !response.joined.empty()) return {};
  if (request.op == OpType::kBroadcast) {
    if (!data[request.root]) return {};
    return std::move(*data[request.root]);
  }
  for (const auto& d : data) {
    if (!d) return {};
  }
  std::string out = std::move(*data[0]);
  if (GathersRows(request.op) || request.op == OpType::kAlltoall) {
    for (int r = 1; r < size_; ++r) out += *data[r];  // each rank's input, in rank order
    return out;
  }
  const size_t count = static_cast<size_t>(request.NumElements());
  for (int r = 1; r < size_; ++r) {
    ReduceElements(out.data(), out.data(), data[r]->data(), count, request.dtype,
                   request.reduce_op);
  }
  return out;
}

void Coordinator::ExpandDivergedBits() {
  // Names whose waiting bits cannot complete on the fast path: a full request for the same name
  // exists, or different ranks wait on different entries of one name. One waiting bit and no
  // full request (the steady state of a small allreduce) is neither.
  // While a rank is joined, every bit is expanded: a joined rank sets none (point 8).
  const bool joined = !join_order_.empty();
  if (bit_waits_.empty() ||
      (bit_waits_.size() == 1 && pending_.empty() && !steps_mixed_ && !joined)) {
    return;
  }
  std::map<std::string, std::vector<uint32_t>> bits_by_name;
  for (const auto& [bit, wait] : bit_waits_) {
    bits_by_name[cache_->Get(bit)->request.name].push_back(bit);
  }
  for (const auto& [name, bits] : bits_by_name) {
    if (bits.size() < 2 && pending_.count(name) == 0 && !bit_waits_.at(bits[0]).steps.mixed &&
        !joined) {
      continue;
    }
    auto [it, inserted] = pending_.try_emplace(name);
    Pending& p = it->second;
    if (inserted) {
      p.by_rank.resize(size_);
      p.first_seen = bit_waits_.at(bits.front()).first_seen;
      arrival_.push_back(name);
    }
    for (uint32_t bit : bits) {
      BitWait& wait = bit_waits_.at(bit);
      for (int r = 0; r < size_; ++r) {
        if (!TestBit(bits_by_rank_[r], bit)) continue;
        ClearBit(bits_by_rank_[r], bit);
        if (!p.by_rank[r]) {
          p.by_rank[r] = cache_->Get(bit)->RequestOf(r);
          ++p.count;
          p.steps.Set(r, size_, wait.steps.Of(r));
          steps_mixed_ = steps_mixed_ || p.steps.mixed;
          if (!wait.data.empty() && wait.data[r]) {
            p.data_by_rank.resize(size_);
            p.data_by_rank[r] = std::move(wait.data[r]);
          }
        }
      }
      p.first_seen = std::min(p.first_seen, wait.first_seen);
      // A warning given for the bit is not repeated: the ranks still missing are among the ones
      // it named (every rank that set the bit is in the request now).
      p.warned = p.warned || wait.warned;
      p.arrivals.Merge(wait.arrivals);
      p.bits.push_back(bit);
      bit_waits_.erase(bit);
    }
  }
}

Response Coordinator::Validate(const Pending& p) const {
  // The ranks that submitted it: every rank, or all but joined ones (point 8).
  std::vector<int> ranks;
  for (int r = 0; r < size_; ++r) {
    if (p.by_rank[r]) ranks.push_back(r);
  }
  const TensorRequest& first = *p.by_rank[ranks.front()];
  Response response;
  response.request = first;
  const bool allgather = GathersRows(first.op);
  const bool alltoall = first.op == OpType::kAlltoall;
  // Allgather and alltoall: each rank's first dimension (and alltoall's splits) are its own; a
  // joined rank contributes no rows (and sends none: point 8).
  auto per_rank = [&] {
    for (int r = 0; r < size_; ++r) {
      response.first_dims.push_back(p.by_rank[r] ? p.by_rank[r]->shape[0] : 0);
      if (alltoall) {
        if (p.by_rank[r]) {
          const auto& row = p.by_rank[r]->splits;
          response.splits.insert(response.splits.end(), row.begin(), row.end());
        } else {
          response.splits.insert(response.splits.end(), static_cast<size_t>(size_), 0);
        }
      }
    }
  };
  // The common case, all ranks agreeing, needs no text: compare whole requests first.
  bool agree = true;
  for (size_t i = 1; i < ranks.size() && agree; ++i) {
    TensorRequest other = *p.by_rank[ranks[i]];
    if ((allgather || alltoall) && !other.shape.empty() && !first.shape.empty()) {
      other.shape[0] = first.shape[0];
    }
    if (alltoall) other.splits = first.splits;
    agree = other == first;
  }
  if (agree) {
    if (allgather || alltoall) per_rank();
    return response;
  }
  // Checks one field: every rank's value as text; on disagreement, an error naming the groups.
  auto check = [&](const char* field, const std::function<std::string(const TensorRequest&)>& get) {
    if (response.error != Code::kOk) return;
    std::map<std::string, std::vector<int>> ranks_by_value;
    std::vector<std::string> order;
    for (int r : ranks) {
      std::string v = get(*p.by_rank[r]);
      if (ranks_by_value.count(v) == 0) order.push_back(v);
      ranks_by_value[v].push_back(r);
    }
    if (order.size() == 1) return;
    std::string msg = "tensor '" + first.name + "': ranks disagree on " + field + ": ";
    for (size_t i = 0; i < order.size(); ++i) {
      msg += (i ? "; " : "") + order[i] + " on " + RankList(ranks_by_value[order[i]]);
    }
    response.error = Code::kMismatch;
    response.error_message = msg;
  };
  check("the operation", [](const TensorRequest& r) { return OpTypeName(r.op); });
  check("dtype", [](const TensorRequest& r) { return DTypeName(r.dtype); });
  check("device",
        [](const TensorRequest& r) { return std::string(r.device < 0 ? "cpu" : "cuda"); });
  if (allgather || alltoall) {
    check("the number of dimensions",
          [](const TensorRequest& r) { return std::to_string(r.shape.size()); });
    check("the shape after the first dimension",
          [](const TensorRequest& r) { return ShapeString(r.shape, 1); });
  } else if (first.op != OpType::kBarrier) {
    check("shape", [](const TensorRequest& r) { return ShapeString(r.shape, 0); });
  }
  if (ReducesWhole(first.op) || first.op == OpType::kReducescatter) {
    check("reduce op", [](const TensorRequest& r) { return ReduceOpName(r.reduce_op); });
    check("prescale", [](const TensorRequest& r) { return ExactDouble(r.prescale); });
    check("postscale", [](const TensorRequest& r) { return ExactDouble(r.postscale); });
  }
  if (first.op == OpType::kAllreduce || first.op == OpType::kReducescatter) {
    check("compression", [](const TensorRequest& r) {
      return r.compression.empty() ? std::string("none") : r.compression;
    });
  }
  if (first.op == OpType::kReducescatter) {
    check("the splits", [](const TensorRequest& r) { return ShapeString(r.splits, 0); });
  }
  if (HasRoot(first.op)) {
    check("root", [](const TensorRequest& r) { return std::to_string(r.root); });
  }
  check("group", [](const TensorRequest& r) {
    return r.group.empty() ? std::string("no group")
                           : "group '" + r.group + "' of " + std::to_string(r.group_size);
  });
  if (response.error == Code::kOk && (allgather || alltoall)) per_rank();
  if (response.error == Code::kOk) {
    // Fields no check above names (the caller's layer fills them alike): still an error.
    response.error = Code::kMismatch;
    response.error_message = "tensor '" + first.name + "': ranks disagree on its request";
    for (int r : ranks) {
      if (response.RequestOf(r) != *p.by_rank[r]) return response;
    }
    response.error = Code::kOk;
    response.error_message.clear();
  }
  return response;
}

bool Coordinator::Ready(const std::string& name, const Pending& p) const {
  if (p.count == size_) return true;
  // A join and the finalize barrier need every rank's own: a joined rank stands in for neither.
  if (join_order_.empty() || IsJoinName(name) || name == FinalizeName()) return false;
  bool before_join = false;  // a submission from a rank that had not joined
  for (int r = 0; r < size_; ++r) {
    if (!p.by_rank[r]) {
      if (!joined_[r]) return false;
    } else if (p.after_join.empty() || !p.after_join[r]) {
      before_join = true;
    }
  }
  // Ranks that joined stand in for one another only in an operation of the epoch they ended:
  // one that only they submitted, since, waits for the others' next submission of it.
  return before_join;
}

bool Coordinator::OnlyAfterJoin(const Pending& p) {
  if (p.after_join.empty()) return false;
  for (size_t r = 0; r < p.by_rank.size(); ++r) {
    if (p.by_rank[r] && !p.after_join[r]) return false;
  }
  return true;
}

void Coordinator::ApplyJoined(const Pending& p, Response& response, Clock::time_point now) {
  if (IsJoinName(response.request.name)) {
    // Every rank has joined: the join completes and the next one starts afresh.
    response.joined = join_order_;
    join_order_.clear();
    joined_.assign(size_, false);
    step_base_ = join_step_;
    // What only joined ranks submitted since they joined is an ordinary submission from now on:
    // it stalls from now, not from an epoch of the others' it was exempt from waiting for.
    for (auto& [name, q] : pending_) {
      if (OnlyAfterJoin(q)) {
        q.first_seen = now;
        q.warned = false;
      }
      q.after_join.clear();
    }
    return;
  }
  std::vector<int> submitted;
  for (int r = 0; r < size_; ++r) {
    if (p.by_rank[r]) {
      submitted.push_back(r);
    } else {
      response.joined.push_back(r);
    }
  }
  if (response.joined.empty() || response.error != Code::kOk) return;
  const TensorRequest& q = response.request;
  std::string why;
  if (q.device >= 0) {
    why =
        "it is on CUDA devices, and a joined rank has no device buffer for it (join covers CPU "
        "tensors)";
  } else if (HasRoot(q.op) && joined_[q.root]) {
    why = "its root, rank " + std::to_string(q.root) + ", has joined";
  } else if (IsInternalExchangeName(q.name, q.op)) {
    why = "a split of the communicator needs every rank, and a joined rank takes part in none";
  } else if (q.op == OpType::kReducescatter || q.op == OpType::kAlltoall) {
    why = std::string(
              "join covers allreduce, reduce, allgather, gather, broadcast and barrier, not ") +
          OpTypeName(q.op);
  }
  if (why.empty()) return;
  std::vector<int> joined(response.joined.begin(), response.joined.end());
  response.error = Code::kInvalidArgument;
  response.error_message = "tensor '" + q.name + "' cannot run while " + RankList(joined) +
                           (joined.size() == 1 ? " has" : " have") +
                           " joined (concord_join): " + why;
  response.error_ranks.assign(submitted.begin(), submitted.end());
  response.joined.clear();
}

void Coordinator::NoteLast(const Arrivals& arrivals, ResponseItem* item) {
  if (arrivals.latest_rank < 0) return;
  item->last_rank = arrivals.latest_rank;
  const auto us =
      std::chrono::duration_cast<std::chrono::microseconds>(arrivals.latest - arrivals.previous);
  item->last_wait_us = static_cast<uint32_t>(
      std::clamp<int64_t>(us.count(), 0, std::numeric_limits<uint32_t>::max()));
}

void Coordinator::TakeFullPath(Clock::time_point now, std::vector<ReadyItem>* ready) {
  // Names every rank has sent, in order of arrival; joins after every other name, so what ranks
  // submitted before the last one joined runs (with the joined ones standing in) before that
  // join ends their standing in, whichever arrived first.
  std::vector<std::string> still_waiting, joins;
  for (const std::string& name : arrival_) {
    if (IsJoinName(name)) {
      joins.push_back(name);
    } else if (!TakeIfReady(name, now, ready)) {
      still_waiting.push_back(name);
    }
  }
  for (const std::string& name : joins) {
    if (!TakeIfReady(name, now, ready)) still_waiting.push_back(name);
  }
  arrival_ = std::move(still_waiting);
}

bool Coordinator::TakeIfReady(const std::string& name, Clock::time_point now,
                              std::vector<ReadyItem>* ready) {
  auto it = pending_.find(name);
  if (!Ready(name, it->second)) return false;
  ReadyItem ready_item{ResponseItem(), std::move(it->second.bits), it->second.first_seen};
  ResponseItem& item = ready_item.item;
  item.response = Validate(it->second);
  ApplyJoined(it->second, item.response, now);
  if (item.response.error == Code::kOk) {
    item.data = CombineInline(item.response, it->second.data_by_rank);
  }
  if (name != FinalizeName() && !IsJoinName(name)) {
    stragglers_.OnReady(it->second.arrivals, it->second.steps.first);
    if (item.response.error == Code::kOk) NoteLast(it->second.arrivals, &item);
  }
  ready->push_back(std::move(ready_item));
  pending_.erase(it);
  return true;
}

StatusOr<ResponseMessage> Coordinator::TakeReady(Clock::time_point now) {
  ExpandDivergedBits();
  std::vector<ReadyItem> ready;

  // Fast path: the AND of every rank's bit vector.
  std::vector<uint64_t> all = bits_by_rank_[0];
  for (int r = 1; r < size_; ++r) {
    all.resize(std::min(all.size(), bits_by_rank_[r].size()));
    for (size_t w = 0; w < all.size(); ++w) all[w] &= bits_by_rank_[r][w];
  }
  for (size_t w = 0; w < all.size(); ++w) {
    for (uint64_t word = all[w]; word != 0; word &= word - 1) {
      const auto bit = static_cast<uint32_t>(w * 64 + __builtin_ctzll(word));
      for (auto& v : bits_by_rank_) ClearBit(v, bit);
      auto wait = bit_waits_.find(bit);
      ReadyItem ready_item{
          ResponseItem(), {bit}, wait != bit_waits_.end() ? wait->second.first_seen : now};
      ResponseItem& item = ready_item.item;
      item.cached = true;
      item.bit = bit;
      if (wait != bit_waits_.end()) {
        item.data = CombineInline(*cache_->Get(bit), wait->second.data);
        stragglers_.OnReady(wait->second.arrivals, wait->second.steps.first);
        NoteLast(wait->second.arrivals, &item);
        bit_waits_.erase(wait);
      }
      ready.push_back(std::move(ready_item));
    }
  }

  // Operations that can never run as they are fail now, before the full path sees them.
  FailOlderSteps(now, &ready);
  FailWaitingForFinalized(&ready);
  TakeFullPath(now, &ready);

  // Groups leave only whole: hold members until all group_size members are ready; a member
  // that failed counts as ready (it completes with its error, the rest still run). Members are
  // counted by name: a name can be two candidates at once, the error of its older steps'
  // submissions and its newest submission (ready at once when the ranks that sent the older ones
  // have joined), and is still one member. A group that can never complete leaves failed.
  ResponseMessage out;
  std::vector<ReadyItem> candidates = std::move(held_);
  held_.clear();
  for (auto& item : ready) candidates.push_back(std::move(item));
  std::map<std::string, std::set<std::string>> ready_members;  // by group
  for (const auto& c : candidates) {
    const Response& r = ResponseOf(c.item);
    if (!r.request.group.empty()) ready_members[r.request.group].insert(r.request.name);
  }
  const std::set<std::string> broken = BrokenGroups(candidates);
  for (auto& c : candidates) {
    const TensorRequest& q = ResponseOf(c.item).request;
    if (q.group.empty() || static_cast<int64_t>(ready_members[q.group].size()) >= q.group_size) {
      out.items.push_back(std::move(c.item));
    } else if (broken.count(q.group) != 0) {
      FailMemberOfBrokenGroup(c);
      out.items.push_back(std::move(c.item));
    } else {
      held_.push_back(std::move(c));
    }
  }
  // After the groups: a held member that waited too long fails the job too.
  CONCORD_RETURN_IF_ERROR(CheckStallShutdown(now));
  ChooseEvictions(out);
  return out;
}

void Coordinator::ChooseEvictions(ResponseMessage& out) const {
  const size_t n = cache_->EvictionsNeeded(out);
  if (n == 0) return;
  // Every bit this coordinator holds keeps its meaning until it leaves in a list.
  std::vector<uint64_t> keep;
  for (const auto& [bit, wait] : bit_waits_) SetBit(keep, bit);
  for (const auto& [name, p] : pending_) {
    for (uint32_t bit : p.bits) SetBit(keep, bit);
  }
  for (const auto& held : held_) {
    for (uint32_t bit : held.bits) SetBit(keep, bit);
  }
  // A full response in the list needs none of its bits kept: applying it ends them on the ranks
  // that sent them before its evictions are made (ResponseCache::Apply).
  for (const auto& item : out.items) {
    if (item.cached) SetBit(keep, item.bit);
  }
  out.evictions = cache_->ChooseVictims(n, keep);
}

}  // namespace concord
