// How a job ends under concordrun, through the C API only (tests/mp/CMakeLists.txt runs it):
//
//   mp_launcher_lifecycle --mode fail --victim V --how exit|kill --grace G
//       After a good allreduce and a barrier, the survivors block in an allreduce the victim
//       never submits; the victim says why on stderr ("VICTIM rank V: fatal: ...") and exits 3 or
//       SIGKILLs itself. Each survivor must see the error from its own allreduce well within the
//       grace period G: it prints "SURVIVOR_SAW rank R ..." and exits 4 by itself. A survivor that
//       gets SIGTERM says "GOT_SIGTERM" (the test rejects it).
//   mp_launcher_lifecycle --mode ignore --victim V --grace G [--ignore-term]
//       After the barrier the victim exits 3; the others never call Concord again and sleep.
//       When SIGTERM comes, each prints "GOT_SIGTERM rank R after X s" (X from the barrier, which
//       must be about G) and exits 143, or with --ignore-term sleeps on until SIGKILL.
//   mp_launcher_lifecycle --mode block
//       Prints "PID rank R pid P" and "READY rank R"; rank 0 then sleeps while the others block
//       in an allreduce it never submits, until killed (tests/mp/launcher_kill_test.sh).
// Every mode ends by itself within 60 s should nothing stop it ("rank R: FAIL ...").
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "mp_common.h"
#include "tests/common/check.h"
#include "tests/common/tensors.h"

namespace {

constexpr double kGiveUpSeconds = 60;

int g_rank = 0, g_size = 1;
volatile sig_atomic_t g_got_sigterm = 0;

void OnSigterm(int) {
  g_got_sigterm = 1;
}

// SIGTERM sets g_got_sigterm instead of ending the process.
void CatchSigterm() {
  struct sigaction sa = {};
  sa.sa_handler = OnSigterm;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
}

concord_status_t Allreduce(concord_comm_t comm, const char* name, std::vector<float>* x) {
  int64_t shape[1] = {static_cast<int64_t>(x->size())};
  concord_tensor_t t = CpuTensor(x->data(), CONCORD_FLOAT32, 1, shape);
  return concord_allreduce(comm, name, &t, nullptr, nullptr);
}

// A good allreduce, then a barrier: every rank has joined and works.
void Warmup(concord_comm_t comm) {
  std::vector<float> x(64, 1.0f);
  const concord_status_t s = Allreduce(comm, "warmup", &x);
  CHECKF(s == CONCORD_SUCCESS && x[0] == static_cast<float>(g_size), "warmup: %s: %s",
         concord_status_string(s), concord_comm_last_error(comm));
  CHECKF(concord_barrier(comm) == CONCORD_SUCCESS, "barrier: %s", concord_comm_last_error(comm));
}

int Fail(int victim, const std::string& how, double grace) {
  CatchSigterm();
  concord_comm_t comm = mp::InitOrExit(&g_rank, &g_size);
  Warmup(comm);
  if (CheckFailures()) return 1;
  if (g_rank == victim) {
    // The survivors are in their allreduce by now; the victim's last words name the reason.
    ::usleep(200 * 1000);
    std::fprintf(stderr, "VICTIM rank %d: fatal: simulated failure (%s)\n", g_rank,
                 how == "kill" ? "SIGKILL" : "exit 3");
    if (how == "kill") ::raise(SIGKILL);
    std::fflush(stdout);
    std::_Exit(3);  // fails as it stands: no finalize (and no leak report about the handle)
  }
  const double t0 = mp::Now();
  std::vector<float> x(1024, 1.0f);
  const concord_status_t s = Allreduce(comm, "blocked", &x);
  const double took = mp::Now() - t0;
  CHECKF(s != CONCORD_SUCCESS, "the allreduce succeeded although rank %d is gone", victim);
  CHECKF(took < grace - 0.5, "the error took %.2f s to surface, grace is %.1f s", took, grace);
  if (g_got_sigterm) std::printf("GOT_SIGTERM rank %d\n", g_rank);
  if (CheckFailures()) return 1;
  std::printf("SURVIVOR_SAW rank %d after %.3f s: %s: %s\n", g_rank, took, concord_status_string(s),
              concord_comm_last_error(comm));
  std::fflush(stdout);
  // What an application does with such an error: it says so and exits non-zero by itself.
  concord_finalize(comm);
  // A moment first: a SIGKILLed victim's sockets close (which is how the survivors learn of it)
  // before the kernel tells its parent it exited, and on a loaded machine a survivor exiting at
  // once was once reaped first, so concordrun rightly named it the first to fail.
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  return 4;
}

int Ignore(int victim, double grace, bool ignore_term) {
  CatchSigterm();
  concord_comm_t comm = mp::InitOrExit(&g_rank, &g_size);
  Warmup(comm);
  if (CheckFailures()) return 1;
  if (g_rank == victim) {
    std::fflush(stdout);
    std::_Exit(3);  // fails as it stands: no finalize (and no leak report about the handle)
  }
  const double t0 = mp::Now();
  bool reported = false;
  while (mp::Now() - t0 < kGiveUpSeconds) {
    ::usleep(10 * 1000);
    if (!g_got_sigterm || reported) continue;
    const double after = mp::Now() - t0;
    std::printf("GOT_SIGTERM rank %d after %.3f s\n", g_rank, after);
    std::fflush(stdout);
    CHECKF(after >= grace - 0.1, "SIGTERM came %.3f s after the failure, before the grace (%.1f s)",
           after, grace);
    CHECKF(after <= grace + 1.5, "SIGTERM came %.3f s after the failure, grace is %.1f s", after,
           grace);
    if (!ignore_term) std::_Exit(143);
    reported = true;
  }
  CHECKF(false, "still running %.0f s after rank %d failed", kGiveUpSeconds, victim);
  return 1;
}

int Block() {
  concord_comm_t comm = mp::InitOrExit(&g_rank, &g_size);
  Warmup(comm);
  if (CheckFailures()) return 1;
  std::printf("PID rank %d pid %d\nREADY rank %d\n", g_rank, static_cast<int>(::getpid()), g_rank);
  std::fflush(stdout);
  if (g_rank == 0) {
    ::sleep(static_cast<unsigned>(kGiveUpSeconds));
  } else {
    std::vector<float> x(1024, 1.0f);
    const concord_status_t s = Allreduce(comm, "never", &x);
    CHECKF(false, "the blocked allreduce returned: %s", concord_status_string(s));
  }
  CHECKF(false, "still running %.0f s after it started waiting", kGiveUpSeconds);
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  std::string mode, how = "exit";
  int victim = 1;
  double grace = 5;
  bool ignore_term = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--mode" && i + 1 < argc) {
      mode = argv[++i];
    } else if (a == "--victim" && i + 1 < argc) {
      victim = std::atoi(argv[++i]);
    } else if (a == "--how" && i + 1 < argc) {
      how = argv[++i];
    } else if (a == "--grace" && i + 1 < argc) {
      grace = std::atof(argv[++i]);
    } else if (a == "--ignore-term") {
      ignore_term = true;
    } else {
      mode = "?";
    }
  }
  if (mode == "fail" && (how == "exit" || how == "kill")) return Fail(victim, how, grace);
  if (mode == "ignore") return Ignore(victim, grace, ignore_term);
  if (mode == "block") return Block();
  std::fprintf(stderr,
               "usage: %s --mode fail --victim V --how exit|kill --grace G | --mode ignore "
               "--victim V --grace G [--ignore-term] | --mode block\n",
               argv[0]);
  return 2;
}
