// The engine's step, the negotiation client: take the messages that arrived (responses on every
// rank, requests on rank 0), send what the application enqueued since the last step as one
// RequestMessage, and on rank 0 let the coordinator decide what is ready and send the response
// list to every rank. The protocol itself is described in core/coordinator.h.
//
// Runs on the stepping thread only (ProgressDriver), which holds the step lock.
#include <algorithm>

#include "core/engine.h"
#include "core/entry_validation.h"
#include "core/message.h"

namespace concord {

Status Engine::Step(Deadline limit, std::chrono::microseconds busy) {
  // Wait for a message or a wake-up; then take every message already there; then the queue.
  // The queue is read after the last Receive, so a wake-up consumed there is never lost.
  ControlMessage message;
  CONCORD_ASSIGN_OR_RETURN(bool got,
                           control_->ReceiveBusy(&message, NextWake().Earlier(limit), busy));
  while (got && !driver_.stopping()) {
    CONCORD_RETURN_IF_ERROR(HandleMessage(message));
    CONCORD_ASSIGN_OR_RETURN(
        got, control_->Receive(&message, Deadline::After(std::chrono::milliseconds(0))));
  }
  if (driver_.stopping()) return Status::Ok();
  {
    MutexLock lock(failure_mu_);
    if (!device_failure_.ok()) return device_failure_;
  }
  CONCORD_RETURN_IF_ERROR(SubmitNew());
  if (coordinator_) CONCORD_RETURN_IF_ERROR(Coordinate());
  return Status::Ok();
}

Deadline Engine::NextWake() const {
  // Rounded up to whole milliseconds, so a wait never ends just before the moment it waits for.
  auto at = [](Clock::time_point t) {
    return Deadline::After(std::chrono::duration_cast<std::chrono::milliseconds>(
        t - Clock::now() + std::chrono::microseconds(999)));
  };
  Deadline d = Deadline::Infinite();
  if (config_.cycle_time_ms > 0) {
    if (auto oldest = queue_.OldestNew()) {
      d = at(*oldest +
             std::chrono::microseconds(static_cast<int64_t>(config_.cycle_time_ms * 1000.0)));
    }
  }
  if (coordinator_) {
    if (auto next = coordinator_->NextStallCheck()) d = d.Earlier(at(*next));
  }
  return d;
}

Status Engine::SubmitNew() {
  if (config_.cycle_time_ms > 0) {
    auto oldest = queue_.OldestNew();
    if (oldest && Clock::now() - *oldest < std::chrono::microseconds(static_cast<int64_t>(
                                               config_.cycle_time_ms * 1000.0))) {
      return Status::Ok();  // keep gathering; NextWake() comes back when the cycle ends
    }
  }
  std::vector<TensorQueue::Fresh> fresh = queue_.PopNew();
  if (fresh.empty()) return Status::Ok();
  // One message per step (steps change between messages, almost never inside one).
  RequestMessage m;
  size_t message_bytes = 0;  // inline data and full requests in `m`
  auto begin_message = [&](decltype(m.step) step) REQUIRES(driver_.step_mutex()) {
    m = RequestMessage();
    m.step = step;
    m.cache_generation = cache_.generation();
    message_bytes = 0;
  };
  auto send_and_begin = [&](decltype(m.step) step) REQUIRES(driver_.step_mutex()) {
    CONCORD_RETURN_IF_ERROR(SendRequests(std::move(m)));
    begin_message(step);
    return Status::Ok();
  };
  begin_message(fresh.front().step);
  // Past the budget, requests go without their input and run on the backend (coordinator.h,
  // point 2), and a full request that would pass it (long names) begins the next message: each
  // message stays far below the control plane's frame limit.
  const size_t budget = inline_message_budget_.load(std::memory_order_relaxed);
  const auto room = [&] { return message_bytes < budget ? budget - message_bytes : 0; };
  for (auto& [request, input, step] : fresh) {
    if (step != m.step) {
      CONCORD_RETURN_IF_ERROR(send_and_begin(step));
    }
    const std::optional<uint32_t> bit = cache_.Lookup(request, config_.rank);
    const size_t request_bytes = bit ? 0 : RequestWireBytes(request);
    if (!m.empty() && request_bytes > room()) {
      CONCORD_RETURN_IF_ERROR(send_and_begin(step));
    }
    message_bytes += request_bytes;
    std::optional<std::string> data;
    if (request.NumBytes() <= room()) data = InlineData(request, input);
    if (data) message_bytes += data->size();
    if (bit) {
      cache_.MarkSent(*bit);
      if (*bit / 64 >= m.cached_mask.size()) m.cached_mask.resize(*bit / 64 + 1, 0);
      m.cached_mask[*bit / 64] |= uint64_t{1} << (*bit % 64);
      if (data) m.cached_data.emplace(*bit, std::move(*data));
    } else {
      if (data) m.request_data.emplace(static_cast<uint32_t>(m.requests.size()), std::move(*data));
      const bool join = IsJoinName(request.name);
      m.requests.push_back(std::move(request));
      // A join ends its message: the coordinator takes what follows it as submitted after it
      // (coordinator.h, point 8), and it cannot tell where in a message's bits a join fell.
      if (join) {
        CONCORD_RETURN_IF_ERROR(send_and_begin(step));
      }
    }
  }
  if (m.empty()) return Status::Ok();
  return SendRequests(std::move(m));
}

Status Engine::SendRequests(RequestMessage m) {
  if (coordinator_) return coordinator_->Add(0, std::move(m), Clock::now());
  return control_->Send(0, SerializeRequestMessage(m));
}

Status Engine::HandleMessage(const ControlMessage& message) {
  if (coordinator_) {
    if (IsFailureReport(message.bytes)) return ReportedFailure(message);
    auto parsed = ParseRequestMessage(message.bytes);
    if (!parsed.ok())
      return parsed.status().WithContext("from rank " + std::to_string(message.from));
    return coordinator_->Add(message.from, std::move(*parsed), Clock::now());
  }
  if (message.from != 0) {
    return ProtocolError("negotiation message from rank " + std::to_string(message.from));
  }
  CONCORD_ASSIGN_OR_RETURN(ResponseMessage response, ParseResponseMessage(message.bytes));
  if (response.abort) {
    read_rank0_abort_.store(true);
    return Status(response.abort_code, response.abort_reason);
  }
  for (const auto& warning : response.warnings) Log(LogLevel::kWarning, "stall: " + warning);
  if (!response.warnings.empty()) metrics_->RecordStallWarnings(response.warnings.size());
  if (response.items.empty()) return Status::Ok();
  return ExecuteList(response);
}

Status Engine::ReportedFailure(const ControlMessage& message) {
  const std::string from = "rank " + std::to_string(message.from);
  StatusOr<ResponseMessage> report = ParseResponseMessage(message.bytes);
  if (!report.ok()) return report.status().WithContext("failure report from " + from);
  if (!report->abort || report->abort_code == Code::kOk) {
    return ProtocolError("a response message from " + from + " that is no failure report");
  }
  // Whatever its own error's code, for this rank another rank failed.
  return Status(Code::kPeerFailure, from + " failed: " + report->abort_reason);
}

Status Engine::ExecuteList(const ResponseMessage& list) {
  const Clock::time_point start = timeline_->on() ? Clock::now() : Clock::time_point();
  CONCORD_RETURN_IF_ERROR(Execute(list));
  if (start != Clock::time_point()) {
    timeline_->Slice(Timeline::kEngineTrack, "cycle", start, Clock::now(), Timeline::kNoBytes,
                     nullptr, "\"responses\":" + std::to_string(list.items.size()));
  }
  // Every rank applies the lists in this same order, so cache bits agree everywhere.
  std::vector<std::string> resend;
  CONCORD_RETURN_IF_ERROR(cache_.Apply(list, config_.rank, &resend));
  if (!list.evictions.empty()) {
    stats_.cache_evictions.fetch_add(list.evictions.size(), std::memory_order_relaxed);
  }
  // Bits of this rank's that were evicted on their way: the coordinator ignores them.
  if (!resend.empty()) queue_.Resubmit(resend);
  return Status::Ok();
}

void Engine::DropInlinePastBudget(ResponseMessage& list) const {
  const size_t budget = inline_message_budget_.load(std::memory_order_relaxed);
  size_t inline_bytes = 0;
  for (ResponseItem& item : list.items) {
    if (!item.data) continue;
    if (item.data->size() <= budget - inline_bytes) {
      inline_bytes += item.data->size();
    } else {
      item.data.reset();
    }
  }
}

Status Engine::Coordinate() {
  const auto now = Clock::now();
  CONCORD_ASSIGN_OR_RETURN(ResponseMessage ready, coordinator_->TakeReady(now));
  DropInlinePastBudget(ready);
  // Warnings go to every rank, so each rank's log says whom it waits for.
  ready.warnings = coordinator_->StallWarnings(now);
  for (const auto& warning : ready.warnings) Log(LogLevel::kWarning, "stall: " + warning);
  if (!ready.warnings.empty()) metrics_->RecordStallWarnings(ready.warnings.size());
  if (auto line = coordinator_->StragglerReport(now))
    Log(LogLevel::kWarning, "straggler: " + *line);
  // What became ready moved the straggler totals (a copy into the metrics' vectors).
  if (!ready.items.empty() && config_.size > 1) {
    metrics_->SetStragglers(coordinator_->straggler_totals());
  }
  if (ready.items.empty() && ready.warnings.empty()) return Status::Ok();
  if (config_.size > 1) {
    std::string bytes = SerializeResponseMessage(ready);
    for (int r = 1; r + 1 < config_.size; ++r) CONCORD_RETURN_IF_ERROR(control_->Send(r, bytes));
    CONCORD_RETURN_IF_ERROR(control_->Send(config_.size - 1, std::move(bytes)));
    // Every rank must have the whole list before this one enters its collectives: a rank still
    // waiting for the rest of a large response (inline results on a slow link) could never join.
    CONCORD_RETURN_IF_ERROR(control_->Drain(TimeoutFromNow()));
  }
  if (ready.items.empty()) return Status::Ok();
  return ExecuteList(ready);
}

}  // namespace concord
