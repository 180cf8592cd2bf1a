// MPI's lifetime and thread level around Concord, through the C API, under mpirun with
// CONCORD_BACKEND=mpi:
//
//   mpi_lifetime_test --mode app-multiple   the application initialises MPI with
//                                           MPI_THREAD_MULTIPLE: Concord works, leaves MPI
//                                           initialised at concord_finalize, the application's own
//                                           MPI calls still work and it finalizes MPI itself.
//   mpi_lifetime_test --mode app-funneled   the application got MPI_THREAD_FUNNELED: concord_init
//                                           fails with CONCORD_ERR_UNAVAILABLE naming the level.
//   mpi_lifetime_test --mode two-comms      Concord initialises MPI; two communicators at once;
//                                           finalizing the first leaves the second working; MPI
//                                           is finalized with the last one.
// Each rank prints "mpi_lifetime MODE: rank R: PASS" when every check held.
#include <mpi.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "concord/concord.h"
#include "tests/common/check.h"
#include "tests/common/tensors.h"

namespace {

int g_rank = -1;

// Every failure line names this process's rank (tests/common/check.h).
void SetRank(int rank) {
  g_rank = rank;
  CheckSetContext("rank %d", rank);
}

// A float32 sum over the communicator; checks the result.
void SumAndCheck(concord_comm_t comm, const char* name) {
  int size = 0;
  concord_comm_size(comm, &size);
  std::vector<float> x(33, static_cast<float>(g_rank + 1));
  int64_t shape[1] = {33};
  concord_tensor_t t = CpuTensor(x.data(), CONCORD_FLOAT32, 1, shape);
  const concord_status_t s = concord_allreduce(comm, name, &t, nullptr, nullptr);
  CHECKF(s == CONCORD_SUCCESS, "allreduce %s: %s", name, concord_comm_last_error(comm));
  const float want = static_cast<float>(size * (size + 1) / 2);
  CHECKF(x[0] == want && x[32] == want, "allreduce %s: got %g want %g", name, x[0], want);
}

concord_comm_t Init() {
  concord_comm_t comm = nullptr;
  const concord_status_t s = concord_init(&comm);
  CHECKF(s == CONCORD_SUCCESS, "concord_init: %s", concord_comm_last_error(nullptr));
  int rank = -1;
  if (comm && concord_comm_rank(comm, &rank) == CONCORD_SUCCESS) SetRank(rank);
  return comm;
}

// The application initialises MPI asking for thread level `level`; returns the level provided.
int AppInitMpi(int level) {
  int provided = 0;
  MPI_Init_thread(nullptr, nullptr, level, &provided);
  int rank = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  SetRank(rank);
  return provided;
}

void AppMultiple() {
  AppInitMpi(MPI_THREAD_MULTIPLE);
  concord_comm_t comm = Init();
  if (!comm) return;
  SumAndCheck(comm, "app-multiple");
  CHECKF(concord_finalize(comm) == CONCORD_SUCCESS, "finalize");
  int finalized = 1;
  MPI_Finalized(&finalized);
  CHECKF(!finalized, "Concord finalized MPI that the application had initialised");
  int one = 1, sum = 0, size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  CHECKF(
      MPI_Allreduce(&one, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD) == MPI_SUCCESS && sum == size,
      "the application's MPI_Allreduce after concord_finalize: %d", sum);
  MPI_Finalize();
}

void AppFunneled() {
  const int provided = AppInitMpi(MPI_THREAD_FUNNELED);
  concord_comm_t comm = nullptr;
  const concord_status_t s = concord_init(&comm);
  const std::string err = concord_comm_last_error(nullptr);
  if (provided >= MPI_THREAD_SERIALIZED) {  // an MPI may grant more than asked: then it works
    CHECKF(s == CONCORD_SUCCESS, "concord_init at level %d: %s", provided, err.c_str());
    if (comm) concord_finalize(comm);
  } else {
    CHECKF(s == CONCORD_ERR_UNAVAILABLE, "concord_init: %s (%s)", concord_status_string(s),
           err.c_str());
    CHECKF(err.find(provided == MPI_THREAD_SINGLE ? "MPI_THREAD_SINGLE" : "MPI_THREAD_FUNNELED") !=
               std::string::npos,
           "the error does not name the thread level: %s", err.c_str());
    if (g_rank == 0) std::printf("refused as expected: %s\n", err.c_str());
  }
  MPI_Finalize();
}

void TwoComms() {
  concord_comm_t a = Init();
  concord_comm_t b = Init();
  if (!a || !b) return;
  SumAndCheck(a, "a.1");
  SumAndCheck(b, "b.1");
  CHECKF(concord_finalize(a) == CONCORD_SUCCESS, "finalize a");
  int finalized = 1;
  MPI_Finalized(&finalized);
  CHECKF(!finalized, "MPI was finalized while communicator b still uses it");
  SumAndCheck(b, "b.2");
  CHECKF(concord_finalize(b) == CONCORD_SUCCESS, "finalize b");
  MPI_Finalized(&finalized);
  CHECKF(finalized, "Concord initialised MPI but did not finalize it with its last communicator");
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc == 3 && std::strcmp(argv[1], "--mode") == 0 ? argv[2] : "";
  if (mode == "app-multiple") {
    AppMultiple();
  } else if (mode == "app-funneled") {
    AppFunneled();
  } else if (mode == "two-comms") {
    TwoComms();
  } else {
    std::fprintf(stderr, "usage: %s --mode app-multiple|app-funneled|two-comms\n", argv[0]);
    return 2;
  }
  std::printf("mpi_lifetime %s: rank %d: %s\n", mode.c_str(), g_rank,
              CheckFailures() ? "FAIL" : "PASS");
  return CheckFailures() ? 1 : 0;
}
