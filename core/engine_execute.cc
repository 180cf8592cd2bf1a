// Executing one response list, identically on every rank:
//  1. resolve cached items to the responses they stand for, and take this rank's entries out of
//     the queue (checking each against its response);
//  2. complete the operations the coordinator reduced inline;
//  3. plan the rest into fusion batches and run them in segments: device batches are launched at
//     once, in plan order, and run while the lanes run the host batches; a barrier is a segment
//     of its own that waits for every batch before it, device ones included;
//  4. the lanes' buffers and the result pool count the list, and give memory back after a burst
//     (GrowingBuffer, ResultBuffers);
//  5. on success, the caller applies the list to the response cache (ExecuteList).
//
// Who completes a request: the list owns the entries it took. An operation that finishes
// completes its entry and releases it (Finish): the lane that ran it, the span group's completion
// after every lane, the device backend's completion thread for a launched batch. When anything
// fails, Execute() completes every entry still held with that error, in one place; the queue's
// entries that were not taken are Fail()'s. So every request is completed once, by its owner.
//
// Runs on the stepping thread; lane workers run their share of a segment while it waits.
#include <algorithm>
#include <new>
#include <vector>

#include "core/engine.h"
#include "core/message.h"

namespace concord {

Status Engine::Execute(const ResponseMessage& message) {
  stats_.response_lists.fetch_add(1, std::memory_order_relaxed);
  Responses responses;
  CONCORD_RETURN_IF_ERROR(ResolveCached(message, &responses));
  Entries entries(responses.size());
  Status s = TakeEntries(message, responses, entries);
  if (s.ok()) s = RunResponses(message, responses, entries);
  EndListOnBuffers();
  if (!s.ok()) {
    s = WithMembership(ExplainFailure(s));
    for (auto& e : entries) {
      if (e) Finish(e, s);
    }
    return s;
  }
  return Status::Ok();
}

Status Engine::ResolveCached(const ResponseMessage& message, Responses* responses) {
  responses->reserve(message.items.size());
  for (const auto& item : message.items) {
    if (item.last_rank >= config_.size) {
      return ProtocolError("response names rank " + std::to_string(item.last_rank) +
                           " as the last to submit, in a communicator of " +
                           std::to_string(config_.size));
    }
    if (!item.cached) {
      responses->push_back(&item.response);
      stats_.responses_full.fetch_add(1, std::memory_order_relaxed);
      continue;
    }
    stats_.responses_cached.fetch_add(1, std::memory_order_relaxed);
    const Response* cached = cache_.Get(item.bit);
    if (cached == nullptr) {
      return ProtocolError("response names cache entry " + std::to_string(item.bit) +
                           ", which does not exist");
    }
    responses->push_back(cached);
  }
  return Status::Ok();
}

Status Engine::TakeEntries(const ResponseMessage& message, const Responses& responses,
                           Entries& entries) {
  for (size_t i = 0; i < responses.size(); ++i) {
    const Response& r = *responses[i];
    // Rank lists from the wire (the parser refuses negative and repeated ranks): a rank past the
    // communicator, or every rank joined in an operation (an average of no contributors divides
    // by zero), cannot come from a coordinator.
    for (const std::vector<int32_t>* ranks : {&r.error_ranks, &r.joined}) {
      for (const int32_t named : *ranks) {
        if (named >= config_.size) {
          return ProtocolError("response for tensor '" + r.request.name + "' names rank " +
                               std::to_string(named) + " of " + std::to_string(config_.size));
        }
      }
    }
    if (r.error == Code::kOk && r.Contributors(config_.size) < 1 && !IsJoinName(r.request.name)) {
      return ProtocolError("response for tensor '" + r.request.name +
                           "' has every rank joined: nobody contributes to it");
    }
    // An error for other ranks (a stall timeout this rank was late for) leaves its entry alone.
    if (!r.AppliesTo(config_.rank)) {
      if (r.error != Code::kOk) NoteLeftBehind(r);
      continue;
    }
    if (r.Joined(config_.rank) && !IsJoinName(r.request.name)) {
      // This rank has joined: it takes part without a tensor of its own, through a stand-in (in
      // an error, not at all). An entry of that name in its queue was enqueued after its join
      // and is no part of this response: the coordinator has not seen it yet, or holds it for
      // the others' next submission of the name. It stays in flight (taken, it ran where the
      // others expected the identity, or failed with an error among the others).
      if (r.error != Code::kOk) continue;
      CONCORD_ASSIGN_OR_RETURN(QueueEntry stand_in, JoinedEntry(r));
      entries[i] = std::move(stand_in);
      continue;
    }
    entries[i] = queue_.Take(r.request.name);
    if (entries[i]) {
      entries[i]->state->MarkNegotiated(message.items[i].last_rank, message.items[i].last_wait_us);
    }
    if (r.error != Code::kOk) continue;  // completed with the error, if this rank submitted it
    if (!entries[i]) {
      return ProtocolError("response for tensor '" + r.request.name +
                           "', which this rank did not submit");
    }
    // The entry must be able to run what the coordinator decided: its own request is part of it.
    if (!r.IsRequestOf(entries[i]->request, config_.rank)) {
      return Internal("response for tensor '" + r.request.name +
                      "' does not match this rank's request");
    }
  }
  return Status::Ok();
}

Status Engine::ExplainFailure(const Status& failure) {
  const Code code = failure.code();
  if (config_.size == 1 || !control_ ||
      (code != Code::kBackendError && code != Code::kTimeout && code != Code::kSystemError)) {
    return failure;
  }
  // A collective that failed knows only its connection or its deadline, not which rank caused
  // it. The control plane knows: rank 0's sees a peer close or go silent (its liveness thread
  // watches while collectives run) and sends every rank an abort naming it. Wait for that, as
  // long as rank 0's own collective may take to fail (the timeout) and a second more.
  const Deadline deadline =
      Deadline::After(MillisFromSeconds(config_.timeout_s) + std::chrono::seconds(1));
  auto explained = [this, &failure](const Status& cause) {
    return Status(cause.code(), cause.message() + " (rank " + std::to_string(config_.rank) +
                                    "'s collective failed meanwhile: " + failure.message() + ")");
  };
  ControlMessage message;
  while (!deadline.passed() && !driver_.stopping()) {
    StatusOr<bool> got = control_->Receive(&message, deadline);
    if (!got.ok()) return explained(got.status());
    if (!*got) continue;  // woken
    if (coordinator_) {
      // Another rank that failed first may have said why (it saw the culprit die); requests:
      // nothing runs any more.
      if (IsFailureReport(message.bytes)) return explained(ReportedFailure(message));
      continue;
    }
    StatusOr<ResponseMessage> response = ParseResponseMessage(message.bytes);
    if (response.ok() && response->abort) {
      read_rank0_abort_.store(true);
      return explained(Status(response->abort_code, response->abort_reason));
    }
  }
  return failure.WithContext("no rank was reported failed within " +
                             FormatSeconds(config_.timeout_s + 1.0) + " of it");
}

void Engine::NoteLeftBehind(const Response& r) {
  if (!finalizing_.load()) return;
  MutexLock lock(left_behind_mu_);
  // A name once (each rank's failure of it, each step's, is one more response for the same name).
  std::vector<std::string>& names = left_behind_.names;
  if (std::find(names.begin(), names.end(), r.request.name) == names.end()) {
    names.push_back(r.request.name);
  }
  for (int32_t rank : r.error_ranks) left_behind_.ranks.insert(rank);
}

Status Engine::LeftBehindError() const {
  MutexLock lock(left_behind_mu_);
  if (left_behind_.names.empty()) return Status::Ok();
  std::string names;
  for (size_t i = 0; i < left_behind_.names.size() && i < 3; ++i) {
    names += (i ? ", '" : "'") + left_behind_.names[i] + "'";
  }
  if (left_behind_.names.size() > 3) {
    names += " and " + std::to_string(left_behind_.names.size() - 3) + " more";
  }
  std::string ranks;
  for (int32_t rank : left_behind_.ranks)
    ranks += (ranks.empty() ? "" : ", ") + std::to_string(rank);
  return Status(Code::kMismatch,
                "concord_finalize: this rank finalized while rank" +
                    std::string(left_behind_.ranks.size() == 1 ? " " : "s ") + ranks +
                    " still submitted tensors, which failed without it: " + names +
                    " (uneven epochs: every rank must submit the same tensors before it "
                    "finalizes)");
}

Status Engine::RunResponses(const ResponseMessage& message, const Responses& responses,
                            Entries& entries) {
  // Operations the coordinator reduced inline complete now; the rest are planned.
  Responses to_run;
  std::vector<size_t> index;  // to_run[k] is responses[index[k]]
  for (size_t i = 0; i < responses.size(); ++i) {
    if (const std::optional<std::string>& data = message.items[i].data) {
      if (entries[i]) entries[i]->state->MarkStarted();
      CONCORD_RETURN_IF_ERROR(CompleteInline(*responses[i], *data, entries[i]));
    } else {
      to_run.push_back(responses[i]);
      index.push_back(i);
    }
  }
  std::vector<FusionBatch> plan = PlanFusion(to_run, fusion_);
  for (FusionBatch& batch : plan) {
    for (size_t& m : batch.members) m = index[m];
  }
  return RunSegments(plan, responses, entries);
}

Status Engine::RunSegments(const std::vector<FusionBatch>& plan, const Responses& responses,
                           Entries& entries) {
  std::vector<size_t> segment;  // host batches since the last barrier
  for (size_t b = 0; b < plan.size(); ++b) {
    const Response& first = *responses[plan[b].members.front()];
    if (first.request.device != -1 && first.error == Code::kOk) {
      MarkStarted(plan[b].members, entries);
      CONCORD_RETURN_IF_ERROR(LaunchDevice(plan[b], responses, entries));
    } else if (first.request.op == OpType::kBarrier) {
      CONCORD_RETURN_IF_ERROR(RunOnLanes(plan, segment, responses, entries));
      segment.clear();
      if (device_.backend) CONCORD_RETURN_IF_ERROR(device_.backend->Drain(TimeoutFromNow()));
      CONCORD_RETURN_IF_ERROR(RunOnLanes(plan, {b}, responses, entries));
    } else {
      segment.push_back(b);
    }
  }
  return RunOnLanes(plan, segment, responses, entries);
}

Status Engine::RunOnLanes(const std::vector<FusionBatch>& plan, const std::vector<size_t>& batches,
                          const Responses& responses, Entries& entries) {
  if (batches.empty()) return Status::Ok();
  const LanePlan lane_plan = PlanLanes(plan, batches, responses, lanes_.size(), kMinShareBytes);
  stats_.batches.fetch_add(lane_plan.groups.size(), std::memory_order_relaxed);
  // Lanes touch disjoint entries or disjoint pieces of one, and their own backend and buffers;
  // the rest is read-only here.
  auto run_lane = [&](Lane& lane, const std::vector<LaneWork>& work) -> Status {
    for (const LaneWork& w : work) {
      if (w.pieces.empty()) {
        MarkStarted(plan[w.batch].members, entries);
      } else {
        for (const AllreducePiece& p : w.pieces) {
          if (entries[p.member]) entries[p.member]->state->MarkStarted();
        }
      }
      CONCORD_RETURN_IF_ERROR(RunWork(lane, plan, w, responses, entries));
    }
    return Status::Ok();
  };
  for (size_t l = 1; l < lanes_.size(); ++l) {
    const std::vector<LaneWork>& work = lane_plan.by_lane[l];
    Lane& lane = lanes_[l];
    if (!work.empty())
      lane.worker->Start([&run_lane, &lane, &work] { return run_lane(lane, work); });
  }
  Status status = run_lane(lanes_[0], lane_plan.by_lane[0]);
  for (size_t l = 1; l < lanes_.size(); ++l) {
    if (lane_plan.by_lane[l].empty()) continue;
    Status s = lanes_[l].worker->Wait();
    if (status.ok()) status = s;
  }
  CONCORD_RETURN_IF_ERROR(status);
  for (const SpanGroup& g : lane_plan.groups) {
    for (size_t i : g.members) Finish(entries[i], Status::Ok());
  }
  return Status::Ok();
}

Status Engine::RunWork(Lane& lane, const std::vector<FusionBatch>& plan, const LaneWork& work,
                       const Responses& responses, Entries& entries) {
  try {
    return work.pieces.empty() ? RunBatch(lane, plan[work.batch], responses, entries)
                               : RunAllreducePieces(lane, work.pieces, responses, entries);
  } catch (const std::bad_alloc&) {
    // Memory for a result the request owns, or the lane's scratch, that this host cannot give:
    // an error, not an exception out of the engine's thread (std::terminate on a lane worker)
    // or out of a waiter's step (which dropped the list's entries, never completed).
    const size_t first =
        work.pieces.empty() ? plan[work.batch].members.front() : work.pieces.front().member;
    const TensorRequest& q = responses[first]->request;
    return Status(Code::kSystemError, std::string("out of memory running the ") + OpTypeName(q.op) +
                                          " of tensor '" + q.name + "'");
  }
}

void Engine::EndListOnBuffers() {
  size_t bytes = 0;
  uint64_t reallocations = 0;
  for (Lane& lane : lanes_) {
    for (GrowingBuffer* buffer : {&lane.fusion, &lane.gather}) {
      buffer->EndList();
      bytes += buffer->capacity();
      reallocations += buffer->reallocations();
    }
  }
  {
    MutexLock lock(compression_mu_);
    if (topk_scratch_trim_.EndList(TopkScratchBytes())) {
      // Swapped out, not cleared: clear() keeps the capacity.
      std::vector<uint32_t>().swap(compression_state_.index_scratch());
      std::vector<uint32_t>().swap(compression_state_.key_scratch());
      std::vector<uint32_t>().swap(compression_state_.order_scratch());
    }
    bytes += TopkScratchBytes();
  }
  result_buffers_->EndList();
  stats_.kept_result_bytes.store(result_buffers_->kept_bytes(), std::memory_order_relaxed);
  stats_.scratch_bytes.store(bytes, std::memory_order_relaxed);
  stats_.scratch_reallocations.store(reallocations, std::memory_order_relaxed);
}

size_t Engine::TopkScratchBytes() {
  return (compression_state_.index_scratch().capacity() +
          compression_state_.key_scratch().capacity() +
          compression_state_.order_scratch().capacity()) *
         sizeof(uint32_t);
}

void Engine::MarkStarted(const std::vector<size_t>& members, const Entries& entries) {
  for (size_t i : members) {
    if (entries[i]) entries[i]->state->MarkStarted();
  }
}

}  // namespace concord
