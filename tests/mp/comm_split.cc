// Sub-communicators (concord_comm_split, concord_comm_create_group), run by a launcher:
//   mp_comm_split --mode semantics   order by key, overlapping sets used from threads at once,
//                                    two communicators split at once from two threads (also
//                                    two that init started, first splits in opposite orders),
//                                    nesting, CONCORD_UNDEFINED, bad arguments on one rank
//                                    failing every rank, finalize in any order; prints what a
//                                    sub-communicator costs (time, threads, fds, memory)
//   mp_comm_split --mode kill        4 ranks; parent rank 3 SIGKILLs itself: the communicators
//                                    it belongs to fail naming it by parent rank, the one without
//                                    it ({0, 1}) keeps working
//   mp_comm_split --mode kill-starting --delay-ms D
//                                    3 ranks; parent rank 2 SIGKILLs itself D ms into a split:
//                                    the others fail within 5 s (timeout 10 s) naming it
#include <dirent.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/common/tensors.h"
#include "tests/mp/mp_common.h"

namespace {

int g_rank = 0, g_size = 1;

int SizeOf(concord_comm_t c) {
  int n = -1;
  concord_comm_size(c, &n);
  return n;
}

// Allreduce of 7 floats (parent rank + 1 + i) on `c`; returns the status and keeps the error.
concord_status_t Allreduce(concord_comm_t c, const std::string& name, float* out,
                           std::string* error = nullptr) {
  std::vector<float> v(7);
  for (int i = 0; i < 7; ++i) v[static_cast<size_t>(i)] = static_cast<float>(g_rank + 1 + i);
  int64_t shape[1] = {7};
  concord_tensor_t t = CpuTensor(v.data(), CONCORD_FLOAT32, 1, shape);
  const concord_status_t s = concord_allreduce(c, name.c_str(), &t, nullptr, nullptr);
  if (s != CONCORD_SUCCESS && error != nullptr) *error = concord_comm_last_error(c);
  if (out != nullptr) *out = v[0];
  return s;
}

// The sum Allreduce gives over the members (parent ranks).
float SumOver(const std::vector<int>& members) {
  float sum = 0;
  for (int r : members) sum += static_cast<float>(r + 1);
  return sum;
}

// The parent ranks of c's members, in c's rank order (an allgather of each member's parent rank).
std::vector<int> Members(concord_comm_t c, const std::string& name) {
  int64_t mine = g_rank;
  int64_t shape[1] = {1};
  concord_tensor_t t = CpuTensor(&mine, CONCORD_INT64, 1, shape);
  std::vector<int64_t> all(static_cast<size_t>(SizeOf(c)));
  const concord_status_t s =
      concord_allgather(c, name.c_str(), &t, all.data(), all.size() * sizeof(int64_t));
  CHECKF(s == CONCORD_SUCCESS, "allgather %s: %s", name.c_str(), concord_comm_last_error(c));
  return std::vector<int>(all.begin(), all.end());
}

std::string Text(const std::vector<int>& ranks) {
  std::string s;
  for (int r : ranks) s += (s.empty() ? "" : ",") + std::to_string(r);
  return s;
}

long CountDir(const char* path) {
  long n = 0;
  if (DIR* d = opendir(path)) {
    while (readdir(d) != nullptr) ++n;
    closedir(d);
  }
  return n - 2;
}

long RssKiB() {
  std::ifstream f("/proc/self/status");
  std::string key;
  while (f >> key) {
    if (key == "VmRSS:") {
      long kib = 0;
      f >> kib;
      return kib;
    }
  }
  return -1;
}

void ExpectMembers(concord_comm_t c, const std::vector<int>& want, const char* what) {
  CHECKF(c != nullptr, "%s: no communicator", what);
  if (c == nullptr) return;
  CHECKF(SizeOf(c) == static_cast<int>(want.size()), "%s: size %d, want %zu", what, SizeOf(c),
         want.size());
  const std::vector<int> got = Members(c, std::string("members.") + what);
  CHECKF(got == want, "%s: members %s, want %s", what, Text(got).c_str(), Text(want).c_str());
}

// 30 allreduces on c from one thread, checking each sum.
void Hammer(concord_comm_t c, const std::vector<int>& members, const char* what) {
  for (int i = 0; i < 30; ++i) {
    float got = 0;
    std::string err;
    const concord_status_t s =
        Allreduce(c, std::string(what) + "." + std::to_string(i), &got, &err);
    CHECKF(s == CONCORD_SUCCESS, "%s #%d: %s", what, i, err.c_str());
    CHECKF(got == SumOver(members), "%s #%d: %g, want %g", what, i, got, SumOver(members));
  }
}

// Every rank of `parent` fails the call alike; `want` must be in the others' error.
// A split from a completion callback is refused; it must not take a split number on that rank
// alone (the ranks' later splits would then never meet).
struct SplitInCallback {
  concord_comm_t parent = nullptr;
  std::atomic<int> status{-100};
};
void OnDoneSplit(concord_request_t, concord_status_t, void* user_data) {
  auto* c = static_cast<SplitInCallback*>(user_data);
  concord_comm_t sub = nullptr;
  c->status.store(static_cast<int>(concord_comm_split(c->parent, 0, 0, &sub)));
}

void ExpectRefused(concord_status_t s, concord_comm_t parent, concord_comm_t sub, bool culprit,
                   const std::string& want, const char* what) {
  const std::string err = concord_comm_last_error(parent);
  CHECKF(s == CONCORD_ERR_INVALID_ARGUMENT, "%s: %s (%s)", what, concord_status_string(s),
         err.c_str());
  CHECKF(sub == nullptr, "%s: a communicator was created", what);
  if (!culprit) {
    CHECKF(mp::Contains(err, want), "%s: error '%s' lacks '%s'", what, err.c_str(), want.c_str());
  }
}

int Semantics() {
  concord_comm_t world = mp::InitOrExit(&g_rank, &g_size);
  const double t0 = mp::Now();
  // Parity, in reverse order of parent rank.
  concord_comm_t parity = nullptr;
  concord_status_t s = concord_comm_split(world, g_rank % 2, -g_rank, &parity);
  const double split_ms = (mp::Now() - t0) * 1e3;
  CHECKF(s == CONCORD_SUCCESS, "split: %s", concord_comm_last_error(world));
  std::vector<int> same_parity;
  for (int r = g_size - 1; r >= 0; --r) {
    if (r % 2 == g_rank % 2) same_parity.push_back(r);
  }
  ExpectMembers(parity, same_parity, "parity");

  // Every rank but 0, in reverse (rank 0 gets none): overlaps the parity sets.
  std::vector<int> tail;
  for (int r = g_size - 1; r >= 1; --r) tail.push_back(r);
  concord_comm_t group = nullptr;
  if (g_size >= 2) {
    s = concord_comm_create_group(world, tail.data(), static_cast<int>(tail.size()), &group);
    CHECKF(s == CONCORD_SUCCESS, "create_group: %s", concord_comm_last_error(world));
    if (g_rank == 0) {
      CHECKF(group == nullptr, "rank 0 is outside the list but got a communicator");
    } else {
      ExpectMembers(group, tail, "group");
    }
  }

  // The three used at once, each from its own thread.
  std::vector<int> everyone;
  for (int r = 0; r < g_size; ++r) everyone.push_back(r);
  {
    std::thread a([&] { Hammer(parity, same_parity, "hammer.parity"); });
    std::thread b([&] {
      if (group != nullptr) Hammer(group, tail, "hammer.group");
    });
    Hammer(world, everyone, "hammer.world");
    a.join();
    b.join();
  }

  // Two communicators split at once, each from its own thread: the world (keys reversed) and a
  // copy of it. Each split's start waits for its peers (in the store; on MPI inside
  // MPI_Comm_create_group), which must not hold up the other's, whichever starts first on each
  // rank. (On MPI before: the first held the MPI lock while it waited, and two ranks whose first
  // starts differed hung there, in about one run in six.)
  concord_comm_t copy = nullptr;
  CHECKF(concord_comm_split(world, 0, 0, &copy) == CONCORD_SUCCESS, "copy: %s",
         concord_comm_last_error(world));
  for (int round = 0; round < 6 && copy != nullptr; ++round) {
    concord_comm_t from_world = nullptr, from_copy = nullptr;
    std::string copy_error;  // last errors are per thread
    std::thread other([&] {
      if (concord_comm_split(copy, 0, g_rank, &from_copy) != CONCORD_SUCCESS) {
        copy_error = concord_comm_last_error(copy);
      }
    });
    const concord_status_t sw = concord_comm_split(world, 0, -g_rank, &from_world);
    other.join();
    CHECKF(sw == CONCORD_SUCCESS, "round %d: world split at once: %s", round,
           concord_comm_last_error(world));
    CHECKF(copy_error.empty(), "round %d: copy split at once: %s", round, copy_error.c_str());
    const std::vector<int> reversed(everyone.rbegin(), everyone.rend());
    std::thread check([&] { ExpectMembers(from_copy, everyone, "at.once.copy"); });
    ExpectMembers(from_world, reversed, "at.once.world");
    check.join();
    if (from_world != nullptr) concord_finalize(from_world);
    if (from_copy != nullptr) concord_finalize(from_copy);
  }
  if (copy != nullptr) concord_finalize(copy);

  // Two more communicators from init (on MPI, both over MPI_COMM_WORLD), each split for the first
  // time at once from two threads, one first on even ranks, the other on odd ones: each split
  // meets its own on every rank. (On MPI before, both first splits had the same name, tag and
  // digest, so MPI could pair one rank's with another rank's other one, unseen.)
  concord_comm_t inits[2] = {nullptr, nullptr};
  for (concord_comm_t& c : inits) {
    CHECKF(concord_init(&c) == CONCORD_SUCCESS, "another init: %s",
           concord_comm_last_error(nullptr));
  }
  if (inits[0] != nullptr && inits[1] != nullptr) {
    concord_comm_t subs[2] = {nullptr, nullptr};
    std::string errors[2];  // last errors are per thread
    auto split_one = [&](int i) {
      if (i != g_rank % 2) std::this_thread::sleep_for(std::chrono::milliseconds(200));
      if (concord_comm_split(inits[i], 0, 0, &subs[i]) != CONCORD_SUCCESS) {
        errors[i] = concord_comm_last_error(inits[i]);
      }
    };
    std::thread other(split_one, 1);
    split_one(0);
    other.join();
    for (int i = 0; i < 2; ++i) {
      CHECKF(errors[i].empty(), "init %d's split at once: %s", i, errors[i].c_str());
    }
    std::thread check([&] { ExpectMembers(subs[1], everyone, "first.split.1"); });
    ExpectMembers(subs[0], everyone, "first.split.0");
    check.join();
    for (concord_comm_t c : subs) {
      if (c != nullptr) concord_finalize(c);
    }
  }
  for (concord_comm_t c : inits) {
    if (c != nullptr) concord_finalize(c);
  }

  // Nested: the parity communicator split again (one color, same order).
  concord_comm_t nested = nullptr;
  s = concord_comm_split(parity, 7, 0, &nested);
  CHECKF(s == CONCORD_SUCCESS, "nested split: %s", concord_comm_last_error(parity));
  ExpectMembers(nested, same_parity, "nested");

  // CONCORD_UNDEFINED: the last rank joins none.
  concord_comm_t most = nullptr;
  s = concord_comm_split(world, g_rank == g_size - 1 ? CONCORD_UNDEFINED : 0, 0, &most);
  CHECKF(s == CONCORD_SUCCESS, "split with UNDEFINED: %s", concord_comm_last_error(world));
  if (g_rank == g_size - 1) {
    CHECKF(most == nullptr, "CONCORD_UNDEFINED gave a communicator");
  } else {
    std::vector<int> want(everyone.begin(), everyone.end() - 1);
    ExpectMembers(most, want, "most");
  }

  // Bad arguments on one rank fail the call on every rank, naming it; the parent goes on.
  if (g_size >= 2) {
    const int culprit = g_size - 1;
    concord_comm_t sub = nullptr;
    s = concord_comm_split(world, g_rank == culprit ? -7 : 0, 0, &sub);
    ExpectRefused(s, world, sub, g_rank == culprit, "parent rank " + std::to_string(culprit),
                  "split with color -7");
    std::vector<int> list = {0, 1};
    if (g_rank == culprit) list = {1, 0};
    s = concord_comm_create_group(world, list.data(), 2, &sub);
    ExpectRefused(s, world, sub, false, "parent rank " + std::to_string(culprit),
                  "create_group with different lists");
    std::vector<int> twice = {0, 0};
    s = concord_comm_create_group(world, g_rank == culprit ? twice.data() : list.data(), 2, &sub);
    ExpectRefused(s, world, sub, g_rank == culprit, "parent rank " + std::to_string(culprit),
                  "create_group with a repeated rank");
    if (g_rank == culprit) {
      CHECKF(mp::Contains(concord_comm_last_error(world), "appears twice"), "culprit's error: %s",
             concord_comm_last_error(world));
    }
    float got = 0;
    CHECKF(Allreduce(world, "after.refusals", &got) == CONCORD_SUCCESS && got == SumOver(everyone),
           "the parent after refused splits: %g", got);
  }

  if (g_size >= 2) {
    SplitInCallback in_callback;
    in_callback.parent = world;
    float v[3] = {1, 2, 3};
    int64_t shape[1] = {3};
    concord_tensor_t t = CpuTensor(v, CONCORD_FLOAT32, 1, shape);
    concord_request_t r = nullptr;
    const bool culprit = g_rank == g_size - 1;
    CHECKF(concord_allreduce_async(world, "split.in.callback", &t, nullptr, nullptr,
                                   culprit ? OnDoneSplit : nullptr, &in_callback,
                                   &r) == CONCORD_SUCCESS,
           "allreduce");
    CHECKF(concord_wait(r, 30.0) == CONCORD_SUCCESS, "allreduce: %s", concord_request_error(r));
    concord_request_free(r);
    if (culprit) {
      CHECKF(in_callback.status.load() == CONCORD_ERR_INVALID_ARGUMENT,
             "split from a callback returned %d", in_callback.status.load());
    }
  }

  // A rank that never calls split: the others' call fails after the timeout, no hang; finalize
  // then ends what is left (a communicator of its own, with a short timeout). The late rank waits
  // in a barrier of the world until the others' split has failed (sleeping past their timeout
  // raced with a slow init on a loaded machine: its finalize came first).
  if (g_size >= 2) {
    concord_config_t config;
    concord_config_init(&config);
    config.timeout_s = 1.5;
    concord_comm_t brief = nullptr;
    CHECKF(concord_init_config(&config, &brief) == CONCORD_SUCCESS, "init: %s",
           concord_comm_last_error(nullptr));
    if (g_rank != g_size - 1 && brief != nullptr) {
      concord_comm_t sub = nullptr;
      const double t2 = mp::Now();
      s = concord_comm_split(brief, 0, 0, &sub);
      const std::string err = concord_comm_last_error(brief);
      CHECKF(s == CONCORD_ERR_TIMEOUT && mp::Contains(err, "not every rank"),
             "split without rank %d: %s: %s", g_size - 1, concord_status_string(s), err.c_str());
      CHECKF(mp::Now() - t2 < 10, "split without a rank took %.1f s", mp::Now() - t2);
    }
    CHECKF(concord_barrier(world) == CONCORD_SUCCESS, "barrier after the split without rank %d",
           g_size - 1);
    concord_finalize(brief);  // the late rank's finalize ends what waited for it
  }

  // What one more sub-communicator costs, on each rank.
  const long threads0 = CountDir("/proc/self/task"), fds0 = CountDir("/proc/self/fd");
  const long rss0 = RssKiB();
  const double t1 = mp::Now();
  concord_comm_t cost = nullptr;
  s = concord_comm_split(world, 0, 0, &cost);
  const double whole_ms = (mp::Now() - t1) * 1e3;
  CHECKF(s == CONCORD_SUCCESS, "split for the cost: %s", concord_comm_last_error(world));
  float warm = 0;
  CHECKF(Allreduce(cost, "cost.warm", &warm) == CONCORD_SUCCESS, "cost allreduce");
  std::printf(
      "COST rank %d of %d: first split %.1f ms, a split of all %.1f ms; per sub-communicator "
      "+%ld threads, +%ld fds, +%ld KiB RSS\n",
      g_rank, g_size, split_ms, whole_ms, CountDir("/proc/self/task") - threads0,
      CountDir("/proc/self/fd") - fds0, RssKiB() - rss0);

  // Finalize in any order: a sibling first, then the parent before its children.
  CHECKF(concord_finalize(group) == CONCORD_SUCCESS, "finalize group");
  float got = 0;
  CHECKF(Allreduce(world, "after.group", &got) == CONCORD_SUCCESS && got == SumOver(everyone),
         "the parent after a sibling's finalize: %g", got);
  CHECKF(concord_finalize(most) == CONCORD_SUCCESS, "finalize most");
  CHECKF(concord_finalize(cost) == CONCORD_SUCCESS, "finalize cost");
  CHECKF(concord_finalize(world) == CONCORD_SUCCESS, "finalize the parent first");
  CHECKF(Allreduce(parity, "after.parent", &got) == CONCORD_SUCCESS && got == SumOver(same_parity),
         "a child after its parent's finalize: %g", got);
  CHECKF(concord_finalize(parity) == CONCORD_SUCCESS, "finalize parity");
  CHECKF(Allreduce(nested, "after.all", &got) == CONCORD_SUCCESS && got == SumOver(same_parity),
         "a grandchild after its ancestors' finalize: %g", got);
  CHECKF(concord_finalize(nested) == CONCORD_SUCCESS, "finalize nested");
  std::printf("comm_split semantics: rank %d of %d: %d failures: %s\n", g_rank, g_size,
              CheckFailures(), CheckFailures() == 0 ? "PASS" : "FAIL");
  return CheckFailures() == 0 ? 0 : 1;
}

// The world of a kill mode, which needs `ranks` ranks (else nullptr, saying so). SIGTERM is
// ignored: the survivors observe the failure; concordrun's grace comes first.
concord_comm_t InitForKill(int ranks, const char* mode) {
  ::signal(SIGTERM, SIG_IGN);
  concord_comm_t world = mp::InitOrExit(&g_rank, &g_size);
  if (g_size == ranks) return world;
  std::fprintf(stderr, "%s mode needs %d ranks\n", mode, ranks);
  concord_finalize(world);
  return nullptr;
}

int Kill() {
  concord_comm_t world = InitForKill(4, "kill");
  if (world == nullptr) return 2;
  const int kVictim = 3;
  concord_comm_t pair = nullptr, trio = nullptr;  // pairs {0,1} {2,3}; trio {1,2,3}
  CHECKF(concord_comm_split(world, g_rank / 2, 0, &pair) == CONCORD_SUCCESS, "split: %s",
         concord_comm_last_error(world));
  const int trio_ranks[] = {1, 2, 3};
  CHECKF(concord_comm_create_group(world, trio_ranks, 3, &trio) == CONCORD_SUCCESS,
         "create_group: %s", concord_comm_last_error(world));
  float got = 0;
  CHECKF(Allreduce(pair, "warm.pair", &got) == CONCORD_SUCCESS, "pair warm-up");
  if (trio != nullptr) CHECKF(Allreduce(trio, "warm.trio", &got) == CONCORD_SUCCESS, "trio");
  CHECKF(concord_barrier(world) == CONCORD_SUCCESS, "barrier: %s", concord_comm_last_error(world));
  if (CheckFailures()) return 1;
  if (g_rank == kVictim) {
    std::printf("VICTIM rank %d kills itself\n", g_rank);
    std::fflush(stdout);
    ::raise(SIGKILL);
  }
  auto expect_failure = [&](concord_comm_t c, const char* what, const std::string& names) {
    std::string err;
    const concord_status_t s = Allreduce(c, std::string("after.") + what, nullptr, &err);
    CHECKF(s != CONCORD_SUCCESS, "%s succeeded without parent rank 3", what);
    CHECKF(mp::Contains(err, names), "%s: error '%s' does not name '%s'", what, err.c_str(),
           names.c_str());
  };
  if (g_rank <= 1) {
    // The pair without the victim keeps working.
    std::vector<int> members = {0, 1};
    for (int i = 0; i < 20; ++i) {
      std::string err;
      const concord_status_t s = Allreduce(pair, "after.pair." + std::to_string(i), &got, &err);
      CHECKF(s == CONCORD_SUCCESS && got == SumOver(members), "pair {0,1} #%d: %s", i, err.c_str());
    }
  } else {
    expect_failure(pair, "pair", "parent ranks 2, 3");
  }
  if (trio != nullptr) expect_failure(trio, "trio", "parent ranks 1, 2, 3");
  expect_failure(world, "world", "rank 3");
  concord_finalize(trio);
  concord_finalize(pair);
  concord_finalize(world);
  if (CheckFailures() == 0) std::printf("SURVIVOR_OK rank %d\n", g_rank);
  return CheckFailures() == 0 ? 0 : 1;
}

// 3 ranks; parent rank 2 SIGKILLs itself `delay_ms` into a split of the world: before the
// split's exchange, while the sub-communicator starts, or after. The others' split, or an
// operation on the new communicator, fails well within the 10 s timeout, naming rank 2: the
// start's waits for the members' keys look at the parent's failure.
int KillWhileStarting(int delay_ms) {
  concord_comm_t world = InitForKill(3, "kill-starting");
  if (world == nullptr) return 2;
  const int kVictim = 2;
  CHECKF(concord_barrier(world) == CONCORD_SUCCESS, "barrier: %s", concord_comm_last_error(world));
  if (g_rank == kVictim) {
    std::printf("VICTIM rank %d kills itself %d ms into the split\n", g_rank, delay_ms);
    std::fflush(stdout);
    std::thread([delay_ms] {
      std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
      ::raise(SIGKILL);
    }).detach();
  }
  const double t0 = mp::Now();
  concord_comm_t sub = nullptr;
  concord_status_t s = concord_comm_split(world, 0, 0, &sub);
  std::string err = s == CONCORD_SUCCESS ? "" : concord_comm_last_error(world);
  const char* failed = "the split";
  // Started whole (the victim died later): allreduces on it until one fails.
  for (int i = 0; s == CONCORD_SUCCESS && mp::Now() - t0 < 5.0; ++i) {
    failed = "an allreduce on it";
    s = Allreduce(sub, "after.start." + std::to_string(i), nullptr, &err);
  }
  const double took = mp::Now() - t0;
  if (g_rank == kVictim) {
    std::this_thread::sleep_for(std::chrono::seconds(30));  // its killer comes first
    return 1;
  }
  CHECKF(s != CONCORD_SUCCESS, "the split and 5 s of allreduces on it succeeded without rank 2");
  CHECKF(took < 5.0, "%s failed only after %.2f s: %s", failed, took, err.c_str());
  CHECKF(mp::Contains(err, "rank 2 "), "%s: error '%s' does not name rank 2", failed, err.c_str());
  if (sub != nullptr) concord_finalize(sub);
  concord_finalize(world);
  if (CheckFailures() == 0) {
    std::printf("SURVIVOR_OK rank %d: %s failed after %.2f s: %s\n", g_rank, failed, took,
                err.c_str());
  }
  return CheckFailures() == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  std::string mode;
  int delay_ms = 0;
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--mode" && i + 1 < argc) mode = argv[++i];
    if (std::string(argv[i]) == "--delay-ms" && i + 1 < argc) delay_ms = std::atoi(argv[++i]);
  }
  if (mode == "semantics") return Semantics();
  if (mode == "kill") return Kill();
  if (mode == "kill-starting") return KillWhileStarting(delay_ms);
  std::fprintf(stderr, "usage: %s --mode semantics|kill|kill-starting [--delay-ms D]\n", argv[0]);
  return 2;
}
