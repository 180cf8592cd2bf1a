#include "core/comm_split.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <string>

#include "base/digest.h"
#include "core/device_setup.h"

namespace concord {
namespace {

uint64_t HostDigest() {
  char name[256] = {0};
  if (gethostname(name, sizeof(name) - 1) != 0) return 0;
  return Fnv1a(name, std::strlen(name));
}

// One rank's part of the exchange (step 1 of the protocol).
struct SplitArgs {
  int64_t valid = 1;  // 0: this rank's arguments were refused (it says why itself)
  int64_t color = kUndefinedColor;
  int64_t key = 0;
  uint64_t list_digest = 0;  // create_group: the rank list's; split: 0
  uint64_t host = 0;
};

std::string RankList(const std::vector<int>& ranks) {
  std::string text;
  for (int r : ranks) text += (text.empty() ? "" : ", ") + std::to_string(r);
  return text;
}

// Steps 1 to 3 for this rank's `mine`; `what` names the call in errors. `local_error` is this
// rank's own refusal (mine.valid == 0), returned once every rank has learnt of it.
StatusOr<Communicator> Split(Engine& engine, CommOrigin& origin, SplitArgs mine, const char* what,
                             const Status& local_error) {
  const Config& pc = engine.config();
  // Refused before taking a number: a refusal on one rank must not shift its later splits.
  if (Status s = engine.CheckExchangeInternal(); !s.ok()) return s.WithContext(what);
  const uint64_t seq = origin.splits.fetch_add(1);
  mine.host = HostDigest();
  std::string bytes(sizeof(SplitArgs), '\0');
  std::memcpy(bytes.data(), &mine, sizeof(SplitArgs));
  auto gathered = engine.ExchangeInternal("split." + std::to_string(seq), bytes);
  if (!gathered.ok()) {
    // Refused (queued on no rank, or refused on every rank that called it: a rank has joined):
    // the number is given back, so the next split has it on every rank.
    if (gathered.status().code() == Code::kInvalidArgument) {
      uint64_t next = seq + 1;
      origin.splits.compare_exchange_strong(next, seq);
    }
    return gathered.status().WithContext(what);
  }
  std::vector<SplitArgs> all(static_cast<size_t>(pc.size));
  std::memcpy(all.data(), gathered->data(), gathered->size());

  if (!local_error.ok()) return local_error;
  for (int r = 0; r < pc.size; ++r) {
    const SplitArgs& a = all[static_cast<size_t>(r)];
    if (a.valid == 0) {
      return InvalidArgument(std::string(what) + ": parent rank " + std::to_string(r) +
                             " gave invalid arguments (its own error says which); no "
                             "communicator was created");
    }
    if (a.list_digest != all[0].list_digest) {
      return InvalidArgument(std::string(what) + ": parent rank " + std::to_string(r) +
                             " gave a different rank list than rank 0; every rank must give the "
                             "same; no communicator was created");
    }
  }
  if (mine.color == kUndefinedColor) return Communicator();

  std::vector<int> members;  // parent ranks, in the sub-communicator's order
  for (int r = 0; r < pc.size; ++r) {
    if (all[static_cast<size_t>(r)].color == mine.color) members.push_back(r);
  }
  std::stable_sort(members.begin(), members.end(), [&all](int a, int b) {
    return all[static_cast<size_t>(a)].key < all[static_cast<size_t>(b)].key;
  });
  Config config = pc;
  config.size = static_cast<int>(members.size());
  config.rank =
      static_cast<int>(std::find(members.begin(), members.end(), pc.rank) - members.begin());
  // The device plane stays on the parent's GPU, which the recomputed local_rank may not pick.
  config.device_local_rank = DeviceLocalRank(pc);
  config.local_rank = 0;
  config.local_size = 0;
  for (int r : members) {
    if (all[static_cast<size_t>(r)].host != mine.host) continue;
    if (r == pc.rank) config.local_rank = config.local_size;
    ++config.local_size;
  }
  const std::string name = "split " + std::to_string(seq) + ", color " + std::to_string(mine.color);
  std::string parent_ranks = RankList(members);
  config.membership = "sub-communicator (" + name + ") of " + std::to_string(members.size()) +
                      " ranks: its ranks 0.." + std::to_string(members.size() - 1) +
                      " are parent ranks " + parent_ranks;
  if (!pc.membership.empty()) config.membership += "; the parent is a " + pc.membership;

  std::vector<int> world_ranks;
  for (int r : members) world_ranks.push_back(origin.world_ranks.at(static_cast<size_t>(r)));
  const std::string prefix =
      origin.prefix + "/split" + std::to_string(seq) + "/" + std::to_string(mine.color);
  auto sub = StartSubCommunicator(config, origin, prefix, std::move(world_ranks),
                                  [&engine] { return engine.failure(); });
  if (!sub.ok()) return sub.status().WithContext(std::string(what) + " (" + name + ")");
  return sub;
}

}  // namespace

StatusOr<Communicator> SplitCommunicator(Engine& parent, CommOrigin& origin, int color, int key) {
  SplitArgs mine;
  mine.color = color;
  mine.key = key;
  Status local = Status::Ok();
  if (color < 0 && color != kUndefinedColor) {
    local = InvalidArgument("concord_comm_split: color " + std::to_string(color) +
                            " is negative; give a color >= 0, or CONCORD_UNDEFINED (-1) to join "
                            "no communicator");
    mine.valid = 0;
    mine.color = kUndefinedColor;
  }
  return Split(parent, origin, mine, "concord_comm_split", local);
}

StatusOr<Communicator> CreateGroupCommunicator(Engine& parent, CommOrigin& origin, const int* list,
                                               int n) {
  SplitArgs mine;
  Status local = Status::Ok();
  const int size = parent.size();
  const int rank = parent.rank();
  std::vector<int> ranks;
  if (n > 0 && list != nullptr) ranks.assign(list, list + n);
  std::vector<int> seen(ranks);
  std::sort(seen.begin(), seen.end());
  if (n > 0 && list == nullptr) {
    local = InvalidArgument("concord_comm_create_group: ranks is NULL");
  } else if (n <= 0) {
    local = InvalidArgument("concord_comm_create_group: n = " + std::to_string(n) +
                            ": the list needs at least one rank");
  } else if (seen.front() < 0 || seen.back() >= size) {
    local = InvalidArgument("concord_comm_create_group: rank " +
                            std::to_string(seen.front() < 0 ? seen.front() : seen.back()) +
                            " is outside the parent's [0, " + std::to_string(size) + ")");
  } else if (std::adjacent_find(seen.begin(), seen.end()) != seen.end()) {
    local = InvalidArgument("concord_comm_create_group: rank " +
                            std::to_string(*std::adjacent_find(seen.begin(), seen.end())) +
                            " appears twice in the list");
  }
  if (!local.ok()) {
    mine.valid = 0;
  } else {
    mine.list_digest = Fnv1a(ranks.data(), ranks.size() * sizeof(int));
    const auto at = std::find(ranks.begin(), ranks.end(), rank);
    if (at != ranks.end()) {
      mine.color = 0;
      mine.key = at - ranks.begin();
    }
  }
  return Split(parent, origin, mine, "concord_comm_create_group", local);
}

}  // namespace concord
