// The coordinator's account of what cannot run and why (coordinator.h, protocol points 4-6):
// submissions of older steps, operations waiting for a rank that finalized, groups that can never
// complete, stall warnings that name the missing ranks and what they last submitted (or the
// members a held group lacks), and the stall shutdown that fails the job.
// Part of class Coordinator; matching and readiness are in coordinator.cc.
#include <algorithm>
#include <map>
#include <set>

#include "core/coordinator.h"
#include "core/coordinator_internal.h"
#include "core/entry_validation.h"

namespace concord {

using coordinator_internal::ClearBit;
using coordinator_internal::RankList;
using coordinator_internal::Seconds;
using coordinator_internal::TestBit;

namespace {

// A join waits for the others' whole epoch (point 8): no stall warning, no stall shutdown.
bool ExemptFromStallWarning(const std::string& name) {
  return IsJoinName(name);
}

// The names the stall shutdown never fails the job for: joins, and the finalize barrier (a rank
// that finalized early waits for it at most its own timeout, and the others' operations already
// fail at once). CheckStallShutdown and NextStallCheck both ask this, so no check is scheduled
// for a shutdown that will not come.
bool ExemptFromStallShutdown(const std::string& name) {
  return ExemptFromStallWarning(name) || name == FinalizeName();
}

}  // namespace

void Coordinator::Steps::Set(int rank, int size, uint64_t step) {
  if (!any) {
    any = true;
    first = step;
    return;
  }
  if (!mixed && step == first) return;
  if (!mixed) {
    mixed = true;
    by_rank.assign(size, first);
  }
  by_rank[rank] = step;
}

std::vector<bool> Coordinator::PresentForBit(uint32_t bit) const {
  std::vector<bool> present(size_);
  for (int r = 0; r < size_; ++r) present[r] = TestBit(bits_by_rank_[r], bit);
  return present;
}

std::vector<bool> Coordinator::PresentFor(const Pending& p) const {
  std::vector<bool> present(size_);
  for (int r = 0; r < size_; ++r) present[r] = p.by_rank[r].has_value();
  return present;
}

std::string Coordinator::DescribeMissing(const std::vector<bool>& present,
                                         Clock::time_point now) const {
  constexpr size_t kDetailed = 4;  // ranks whose last submission is told; the rest are counted
  std::vector<int> missing;
  for (int r = 0; r < size_; ++r) {
    if (!present[r] && !joined_[r]) missing.push_back(r);
  }
  std::string s = RankList(missing) + " (";
  for (size_t i = 0; i < missing.size() && i < kDetailed; ++i) {
    const LastSubmission& last = last_[missing[i]];
    s += (i ? "; rank " : "rank ") + std::to_string(missing[i]);
    if (finalized_[missing[i]]) {
      s += " has finalized";
    } else if (!last.any) {
      s += " has submitted nothing";
    } else {
      s += " last submitted '" + last.name + "' " +
           Seconds(std::chrono::duration_cast<std::chrono::milliseconds>(now - last.at)) + " ago";
    }
  }
  if (missing.size() > kDetailed) s += "; " + std::to_string(missing.size() - kDetailed) + " more";
  return s + ")";
}

void Coordinator::FailOlderSteps(Clock::time_point now, std::vector<ReadyItem>* errors) {
  if (!steps_mixed_) return;
  steps_mixed_ = false;
  for (auto& [name, p] : pending_) {
    if (!p.steps.mixed) continue;
    uint64_t newest = 0;
    std::map<uint64_t, std::vector<int>> ranks_by_step;
    for (int r = 0; r < size_; ++r) {
      if (!p.by_rank[r]) continue;
      newest = std::max(newest, p.steps.Of(r));
      ranks_by_step[p.steps.Of(r)].push_back(r);
    }
    // The failed submissions may have come as some of the request's bits.
    ReadyItem item{ResponseItem(), p.bits, p.first_seen};
    Response& error = item.item.response;
    error.error = Code::kMismatch;
    error.error_message = "tensor '" + name + "' was submitted in different steps:";
    for (const auto& [step, ranks] : ranks_by_step) {
      error.error_message += " step " + std::to_string(step) + " on " + RankList(ranks) + ";";
      if (step == newest) continue;
      for (int r : ranks) {
        if (error.error_ranks.empty()) error.request = *p.by_rank[r];
        error.error_ranks.push_back(r);
        p.by_rank[r].reset();
        if (!p.data_by_rank.empty()) p.data_by_rank[r].reset();
        --p.count;
      }
    }
    error.error_message +=
        " a rank skipped it in a step or submitted it twice in one. The submissions of the older "
        "steps fail; the newest wait for the other ranks";
    p.steps = Steps();
    p.steps.Set(0, size_, newest);
    p.first_seen = now;
    p.warned = false;
    errors->push_back(std::move(item));
  }
}

void Coordinator::FailWaitingForFinalized(std::vector<ReadyItem>* errors) {
  if (!any_finalized_) return;
  // `bits`: the cache bits the failed submissions came as; `first_seen`: the first's arrival.
  auto fail = [&](Response error, const std::vector<bool>& present, std::vector<uint32_t> bits,
                  Clock::time_point first_seen) {
    std::vector<int> gone;
    for (int r = 0; r < size_; ++r) {
      if (present[r]) error.error_ranks.push_back(r);
      if (!present[r] && finalized_[r]) gone.push_back(r);
    }
    error.error = Code::kPeerFailure;
    error.error_message = "tensor '" + error.request.name + "' cannot complete: " + RankList(gone) +
                          (gone.size() == 1 ? " has" : " have") +
                          " finalized (concord_finalize) without submitting it";
    ReadyItem item{ResponseItem(), std::move(bits), first_seen};
    item.item.response = std::move(error);
    errors->push_back(std::move(item));
  };
  auto waits_for_finalized = [&](const std::vector<bool>& present) {
    for (int r = 0; r < size_; ++r) {
      if (!present[r] && finalized_[r]) return true;
    }
    return false;
  };
  // A join that waits for a finalized rank fails below, and its ranks are joined no longer: they
  // stand in for no one, and the stall warnings name them.
  for (const auto& [name, p] : pending_) {
    if (!IsJoinName(name) || !waits_for_finalized(PresentFor(p))) continue;
    for (int r = 0; r < size_; ++r) {
      if (!p.by_rank[r] || !joined_[r]) continue;
      joined_[r] = false;
      join_order_.erase(std::find(join_order_.begin(), join_order_.end(), r));
      for (auto& [other, q] : pending_) {
        if (!q.after_join.empty()) q.after_join[r] = false;
      }
    }
  }
  for (auto it = bit_waits_.begin(); it != bit_waits_.end();) {
    const std::vector<bool> present = PresentForBit(it->first);
    if (!waits_for_finalized(present)) {
      ++it;
      continue;
    }
    for (auto& bits : bits_by_rank_) ClearBit(bits, it->first);
    fail(*cache_->Get(it->first), present, {it->first}, it->second.first_seen);
    it = bit_waits_.erase(it);
  }
  for (auto it = pending_.begin(); it != pending_.end();) {
    const std::vector<bool> present = PresentFor(it->second);
    if (it->first == FinalizeName() || !waits_for_finalized(present)) {
      ++it;
      continue;
    }
    Response error;
    for (int r = 0; r < size_ && error.request.name.empty(); ++r) {
      if (present[r]) error.request = *it->second.by_rank[r];
    }
    fail(std::move(error), present, std::move(it->second.bits), it->second.first_seen);
    arrival_.erase(std::find(arrival_.begin(), arrival_.end(), it->first));
    it = pending_.erase(it);
  }
}

std::map<std::string, std::set<std::string>> Coordinator::WaitingMembers() const {
  std::map<std::string, std::set<std::string>> members;
  for (const auto& [name, p] : pending_) {
    auto q = std::find_if(p.by_rank.begin(), p.by_rank.end(),
                          [](const std::optional<TensorRequest>& r) { return r.has_value(); });
    if (q != p.by_rank.end() && !(*q)->group.empty()) members[(*q)->group].insert(name);
  }
  for (const auto& [bit, wait] : bit_waits_) {
    const TensorRequest& q = cache_->Get(bit)->request;
    if (!q.group.empty()) members[q.group].insert(q.name);
  }
  return members;
}

std::set<std::string> Coordinator::BrokenGroups(const std::vector<ReadyItem>& candidates) const {
  std::set<std::string> broken;
  if (!any_finalized_) return broken;
  // By group: its member count and the members some rank submitted.
  std::map<std::string, std::pair<int64_t, std::set<std::string>>> groups;
  for (const auto& c : candidates) {
    const TensorRequest& q = ResponseOf(c.item).request;
    if (q.group.empty()) continue;
    groups[q.group].first = q.group_size;
    groups[q.group].second.insert(q.name);
  }
  if (groups.empty()) return broken;
  for (const auto& [group, waiting] : WaitingMembers()) {
    auto it = groups.find(group);
    if (it != groups.end()) it->second.second.insert(waiting.begin(), waiting.end());
  }
  for (const auto& [group, g] : groups) {
    if (static_cast<int64_t>(g.second.size()) < g.first) broken.insert(group);
  }
  return broken;
}

void Coordinator::FailMemberOfBrokenGroup(ReadyItem& member) const {
  if (!member.item.cached && member.item.response.error != Code::kOk) return;  // fails already
  Response error = ResponseOf(member.item);
  std::vector<int> gone;
  for (int r = 0; r < size_; ++r) {
    if (finalized_[r]) gone.push_back(r);
    if (!error.Joined(r)) error.error_ranks.push_back(r);
  }
  error.joined.clear();
  error.error = Code::kPeerFailure;
  error.error_message = "tensor '" + error.request.name + "' cannot complete: its group '" +
                        error.request.group + "' lacks a member that no rank has submitted, and " +
                        RankList(gone) + (gone.size() == 1 ? " has" : " have") +
                        " finalized (concord_finalize)";
  member.item = ResponseItem();
  member.item.response = std::move(error);
}

std::map<std::string, Coordinator::HeldGroup> Coordinator::HeldGroups() const {
  std::map<std::string, HeldGroup> groups;
  for (const auto& h : held_) {
    const TensorRequest& q = ResponseOf(h.item).request;
    HeldGroup& g = groups[q.group];
    g.size = q.group_size;
    g.ready.insert(q.name);
    g.first_seen = std::min(g.first_seen, h.first_seen);
    g.warned = g.warned || h.warned;
  }
  return groups;
}

std::string Coordinator::DescribeGroup(const std::string& group, const HeldGroup& held) const {
  constexpr size_t kNamed = 4;  // members named; the rest are counted
  auto names = [](const std::set<std::string>& members) {
    std::string s;
    size_t i = 0;
    for (const std::string& name : members) {
      if (i == kNamed) return s + " and " + std::to_string(members.size() - kNamed) + " more";
      s += (i++ ? ", '" : "'") + name + "'";
    }
    return s;
  };
  std::set<std::string> waiting;
  const auto all = WaitingMembers();
  if (auto it = all.find(group); it != all.end()) {
    for (const std::string& name : it->second) {
      if (held.ready.count(name) == 0) waiting.insert(name);
    }
  }
  const int64_t lacking = held.size - static_cast<int64_t>(held.ready.size());
  const int64_t unknown = std::max<int64_t>(0, lacking - static_cast<int64_t>(waiting.size()));
  std::string s = std::to_string(lacking) + " of its " + std::to_string(held.size) + " members: ";
  if (!waiting.empty()) s += names(waiting) + " (not yet submitted by every rank)";
  if (unknown > 0) {
    s += (waiting.empty() ? "" : " and ") + std::to_string(unknown) + " that no rank has submitted";
  }
  return s + "; " + names(held.ready) + (held.ready.size() == 1 ? " is" : " are") + " ready";
}

Status Coordinator::CheckStallShutdown(Clock::time_point now) const {
  if (stall_.shutdown.count() <= 0) return Status::Ok();
  // The operation that has waited longest, if it waited too long (ExemptFromStallShutdown aside).
  const std::string* name = nullptr;
  std::vector<bool> present;
  Clock::time_point oldest = now - stall_.shutdown;
  for (const auto& [n, p] : pending_) {
    if (p.first_seen <= oldest && !ExemptFromStallShutdown(n) && !OnlyAfterJoin(p)) {
      oldest = p.first_seen;
      name = &n;
      present = PresentFor(p);
    }
  }
  for (const auto& [bit, wait] : bit_waits_) {
    if (wait.first_seen <= oldest) {
      oldest = wait.first_seen;
      name = &cache_->Get(bit)->request.name;
      present = PresentForBit(bit);
    }
  }
  // A held group, when older than every tensor (a tensor as old names the missing ranks).
  const std::map<std::string, HeldGroup> groups = HeldGroups();
  auto group = groups.end();
  for (auto it = groups.begin(); it != groups.end(); ++it) {
    if (it->second.first_seen < oldest ||
        (name == nullptr && group == groups.end() && it->second.first_seen <= oldest)) {
      oldest = it->second.first_seen;
      group = it;
    }
  }
  if (group != groups.end()) {
    return Status(Code::kTimeout, "group '" + group->first +
                                      "' did not complete within the stall shutdown time of " +
                                      Seconds(stall_.shutdown) + ": it lacks " +
                                      DescribeGroup(group->first, group->second) +
                                      " (CONCORD_STALL_SHUTDOWN_S)");
  }
  if (name == nullptr) return Status::Ok();
  std::vector<int> submitted;
  for (int r = 0; r < size_; ++r) {
    if (present[r]) submitted.push_back(r);
  }
  return Status(Code::kTimeout,
                "tensor '" + *name + "' was not submitted by " + DescribeMissing(present, now) +
                    " within the stall shutdown time of " + Seconds(stall_.shutdown) + " (" +
                    RankList(submitted) + " submitted it; CONCORD_STALL_SHUTDOWN_S)");
}

std::vector<std::string> Coordinator::StallWarnings(Clock::time_point now) {
  std::vector<std::string> warnings;
  // Runs every step: the text is built only for a warning.
  auto warn = [&](const std::string& name, const std::vector<bool>& present) {
    std::vector<int> submitted;
    for (int r = 0; r < size_; ++r) {
      if (present[r]) submitted.push_back(r);
    }
    const std::string waited = " for more than " + Seconds(stall_.warning);
    if (name == FinalizeName()) {
      warnings.push_back(RankList(submitted) + (submitted.size() == 1 ? " has" : " have") +
                         " finalized and waited" + waited + " for " +
                         DescribeMissing(present, now) + " to finalize");
      return;
    }
    warnings.push_back("tensor '" + name + "' has waited" + waited + " for " +
                       DescribeMissing(present, now) + "; " + RankList(submitted) +
                       " submitted it. A rank skipped it, is slow, or submits a different name");
  };
  for (auto& [name, p] : pending_) {
    if (p.warned || now - p.first_seen < stall_.warning || ExemptFromStallWarning(name) ||
        OnlyAfterJoin(p)) {
      continue;
    }
    p.warned = true;
    warn(name, PresentFor(p));
  }
  for (auto& [bit, wait] : bit_waits_) {
    if (wait.warned || now - wait.first_seen < stall_.warning) continue;
    wait.warned = true;
    warn(cache_->Get(bit)->request.name, PresentForBit(bit));
  }
  if (held_.empty()) return warnings;
  for (const auto& [group, held] : HeldGroups()) {
    const bool due = !held.warned && now - held.first_seen >= stall_.warning;
    if (due) {
      warnings.push_back("group '" + group + "' has waited for more than " +
                         Seconds(stall_.warning) + " for " + DescribeGroup(group, held) +
                         ". A member was skipped or is slow, or the ranks' groups differ");
    }
    // Once per group: members held after its warning are covered by it.
    if (!due && !held.warned) continue;
    for (auto& h : held_) {
      if (ResponseOf(h.item).request.group == group) h.warned = true;
    }
  }
  return warnings;
}

std::optional<Clock::time_point> Coordinator::NextStallCheck() const {
  std::optional<Clock::time_point> next;
  // `warn`: a warning is still to come; `shut_down`: the stall shutdown applies.
  auto consider = [&](Clock::time_point first_seen, bool warn, bool shut_down) {
    if (warn) {
      const auto t = first_seen + stall_.warning;
      if (!next || t < *next) next = t;
    }
    if (shut_down && stall_.shutdown.count() > 0) {
      const auto t = first_seen + stall_.shutdown;
      if (!next || t < *next) next = t;
    }
  };
  for (const auto& [name, p] : pending_) {
    if (OnlyAfterJoin(p)) continue;  // until the join completes
    consider(p.first_seen, !p.warned && !ExemptFromStallWarning(name),
             !ExemptFromStallShutdown(name));
  }
  for (const auto& [bit, w] : bit_waits_) consider(w.first_seen, !w.warned, true);
  if (held_.empty()) return next;
  for (const auto& [group, held] : HeldGroups()) consider(held.first_seen, !held.warned, true);
  return next;
}

}  // namespace concord
