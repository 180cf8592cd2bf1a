#include "core/tensor_queue.h"

#include <algorithm>
#include <string_view>
#include <unordered_set>

#include "core/entry_validation.h"

namespace concord {

Status TensorQueue::Push(std::vector<QueueEntry> entries, bool wake) {
  {
    MutexLock lock(mu_);
    if (!closed_.ok()) return closed_;
    std::unordered_set<std::string_view> names;  // a group's names (one entry needs no set)
    for (const auto& e : entries) {
      const std::string& name = e.request.name;
      if (name.empty() && e.request.op == OpType::kBarrier) continue;  // numbered below
      if (table_.count(name) != 0) {
        return InvalidArgument("tensor '" + name +
                               "' is already in flight; wait for it before enqueuing it again");
      }
      if (entries.size() > 1 && !names.insert(name).second) {
        return InvalidArgument("tensor '" + name + "' appears twice in one group");
      }
    }
    if (entries.empty()) return Status::Ok();
    if (!oldest_fresh_) oldest_fresh_ = Clock::now();
    for (auto& e : entries) {
      if (e.request.name.empty() && e.request.op == OpType::kBarrier) {
        e.request.name = BarrierName(barrier_seq_++);
      }
    }
    // A group (Engine::GroupEnd) is known by its first member's name and its size.
    if (entries.front().request.group_size > 0 && entries.front().request.group.empty()) {
      const std::string group =
          entries.front().request.name + "#" + std::to_string(entries.front().request.group_size);
      for (auto& e : entries) e.request.group = group;
    }
    for (auto& e : entries) {
      fresh_.push_back(e.request.name);
      std::string name = e.request.name;
      table_.emplace(std::move(name), Slot{std::move(e), true});
    }
  }
  if (wake) wake_();
  return Status::Ok();
}

std::string TensorQueue::NextBarrierName() {
  MutexLock lock(mu_);
  return BarrierName(barrier_seq_++);
}

std::vector<TensorQueue::Fresh> TensorQueue::PopNew() {
  MutexLock lock(mu_);
  std::vector<Fresh> out;
  out.reserve(fresh_.size());
  for (const auto& name : fresh_) {
    Slot& slot = table_.at(name);  // in flight: Take removes a name from fresh_
    slot.fresh = false;
    out.push_back(Fresh{slot.entry.request, slot.entry.input, slot.entry.step});
  }
  fresh_.clear();
  oldest_fresh_.reset();
  return out;
}

std::optional<Clock::time_point> TensorQueue::OldestNew() const {
  MutexLock lock(mu_);
  return oldest_fresh_;
}

void TensorQueue::Resubmit(const std::vector<std::string>& names) {
  {
    MutexLock lock(mu_);
    for (const auto& name : names) {
      auto it = table_.find(name);
      if (it == table_.end() || it->second.fresh) continue;
      it->second.fresh = true;
      if (!oldest_fresh_) oldest_fresh_ = Clock::now();
      fresh_.push_back(name);
    }
  }
  wake_();
}

std::optional<QueueEntry> TensorQueue::Take(const std::string& name) {
  MutexLock lock(mu_);
  auto it = table_.find(name);
  if (it == table_.end()) return std::nullopt;
  if (it->second.fresh) {
    fresh_.erase(std::find(fresh_.begin(), fresh_.end(), name));
    if (fresh_.empty()) oldest_fresh_.reset();
  }
  QueueEntry e = std::move(it->second.entry);
  table_.erase(it);
  return e;
}

std::vector<QueueEntry> TensorQueue::Close(const Status& status) {
  MutexLock lock(mu_);
  if (closed_.ok()) closed_ = status;
  std::vector<QueueEntry> out;
  for (auto& [name, slot] : table_) out.push_back(std::move(slot.entry));
  table_.clear();
  fresh_.clear();
  oldest_fresh_.reset();
  return out;
}

size_t TensorQueue::in_flight() const {
  MutexLock lock(mu_);
  return table_.size();
}

}  // namespace concord
