#include "core/request_state.h"

namespace concord {

void RequestState::Complete(const Status& status) {
  Callback callback;
  {
    MutexLock lock(mu_);
    ++complete_calls_;
    if (completing_) return;
    completing_ = true;
    status_ = status;
    callback = std::move(callback_);
  }
  const Clock::time_point completed = metrics_ ? Clock::now() : Clock::time_point();
  if (callback) callback(status);
  if (metrics_) {
    const Clock::time_point called_back = Clock::now();
    auto seconds = [](Clock::duration d) { return std::chrono::duration<double>(d).count(); };
    const Clock::rep negotiated = negotiated_.load(std::memory_order_relaxed);
    const Clock::time_point taken =
        negotiated == 0 ? enqueued_ : Clock::time_point(Clock::duration(negotiated));
    OpSample sample = sample_;
    sample.code = status.code();
    sample.wire_bytes = wire_bytes();
    if (from_output_ && status.ok()) {
      sample.bytes = output_.bytes;
      sample.dtype = output_.dtype;
    }
    sample.negotiation_s = seconds(taken - enqueued_);
    sample.execution_s = seconds(completed - taken);
    sample.callback_s = seconds(called_back - completed);
    metrics_->RecordOp(sample);
    if (timeline_) {
      TensorPhases phases;
      phases.enqueued = enqueued_;
      phases.negotiated = taken;
      const Clock::rep started = started_.load(std::memory_order_relaxed);
      // Never started: negotiated, it failed before its batch ran (queued until then); never
      // negotiated, it failed in the queue (as metered: all of it counts as execution).
      phases.started = started != 0      ? Clock::time_point(Clock::duration(started))
                       : negotiated != 0 ? completed
                                         : taken;
      phases.completed = completed;
      phases.called_back = called_back;
      phases.last_rank = last_rank_.load(std::memory_order_relaxed);
      phases.last_wait_us = last_wait_us_.load(std::memory_order_relaxed);
      timeline_->Tensor(name_, sample.op, sample.bytes, phases);
    }
  }
  {
    MutexLock lock(mu_);
    done_.store(true, std::memory_order_release);
  }
  cv_.NotifyAll();
}

void RequestState::Meter(std::shared_ptr<Metrics> metrics, const char* op, DType dtype,
                         uint64_t bytes, Clock::time_point enqueued, bool from_output) {
  metrics_ = std::move(metrics);
  from_output_ = from_output;
  sample_.op = op;
  sample_.dtype = dtype;
  sample_.bytes = bytes;
  enqueued_ = enqueued;
}

void RequestState::Trace(std::shared_ptr<Timeline> timeline, std::string name) {
  timeline_ = std::move(timeline);
  name_ = std::move(name);
}

int RequestState::complete_calls() const {
  MutexLock lock(mu_);
  return complete_calls_;
}

bool RequestState::Wait(Deadline deadline) {
  if (done()) return true;
  MutexLock lock(mu_);
  while (!done_) {
    if (!cv_.WaitUntil(mu_, deadline) && !done_) return false;
  }
  return true;
}

bool RequestState::done() const {
  return done_.load(std::memory_order_acquire);
}

Status RequestState::status() const {
  MutexLock lock(mu_);
  return status_;
}

void RequestState::SetLaunched(std::shared_ptr<DeviceEvent> event) {
  {
    MutexLock lock(mu_);
    launched_ = std::move(event);
  }
  cv_.NotifyAll();
}

StatusOr<std::shared_ptr<DeviceEvent>> RequestState::WaitLaunched(Deadline deadline) {
  MutexLock lock(mu_);
  while (!done_ && launched_ == nullptr) {
    if (!cv_.WaitUntil(mu_, deadline) && !done_ && launched_ == nullptr) {
      return TimeoutError("the operation was not launched on its device before the deadline");
    }
  }
  if (done_) return std::shared_ptr<DeviceEvent>();
  return launched_;
}

}  // namespace concord
