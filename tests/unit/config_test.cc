// Config: what the environment of each launcher yields, precedence, and malformed values.
#include "core/config.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "tests/common/comma_locale.h"

namespace concord {
namespace {

// Clears every variable Config reads, sets the given ones, and restores a clean slate afterwards.
class ConfigTest : public ::testing::Test {
 protected:
  void SetUp() override { ClearAll(); }
  void TearDown() override { ClearAll(); }
  static void Set(const char* name, const char* value) { setenv(name, value, 1); }
  static void ClearAll() {
    for (const char* name : {"CONCORD_RANK",
                             "RANK",
                             "OMPI_COMM_WORLD_RANK",
                             "PMI_RANK",
                             "SLURM_PROCID",
                             "CONCORD_SIZE",
                             "WORLD_SIZE",
                             "OMPI_COMM_WORLD_SIZE",
                             "PMI_SIZE",
                             "SLURM_NTASKS",
                             "CONCORD_LOCAL_RANK",
                             "LOCAL_RANK",
                             "OMPI_COMM_WORLD_LOCAL_RANK",
                             "MPI_LOCALRANKID",
                             "SLURM_LOCALID",
                             "SLURM_STEP_NUM_TASKS",
                             "SLURM_STEP_TASKS_PER_NODE",
                             "SLURM_TASKS_PER_NODE",
                             "SLURM_NODEID",
                             "TORCHELASTIC_RESTART_COUNT",
                             "CONCORD_LOCAL_SIZE",
                             "LOCAL_WORLD_SIZE",
                             "OMPI_COMM_WORLD_LOCAL_SIZE",
                             "MPI_LOCALNRANKS",
                             "CONCORD_STORE",
                             "CONCORD_TOKEN",
                             "CONCORD_JOB_ID",
                             "TORCHELASTIC_RUN_ID",
                             "OMPI_MCA_ess_base_jobid",
                             "SLURM_JOB_ID",
                             "MASTER_ADDR",
                             "MASTER_PORT",
                             "CONCORD_IFACE",
                             "CONCORD_HOST",
                             "CONCORD_BACKEND",
                             "PMIX_RANK",
                             "CONCORD_GLOO_ALGORITHM",
                             "CONCORD_FUSION_THRESHOLD",
                             "CONCORD_INLINE_THRESHOLD",
                             "CONCORD_DIRECT_THRESHOLD",
                             "CONCORD_LANES",
                             "CONCORD_CYCLE_TIME_MS",
                             "CONCORD_TIMEOUT_S",
                             "CONCORD_CACHE_CAPACITY",
                             "CONCORD_TOPK_RESIDUALS",
                             "CONCORD_LOG_LEVEL",
                             "CONCORD_STALL_WARNING_S",
                             "CONCORD_STALL_SHUTDOWN_S",
                             "CONCORD_COMPRESSION",
                             "CONCORD_WAITER_PROGRESS",
                             "CONCORD_DETERMINISTIC"}) {
      unsetenv(name);
    }
  }
};

TEST_F(ConfigTest, LoneProcessDefaults) {
  StatusOr<Config> c = Config::FromEnvironment();
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ASSERT_TRUE(c->Finalize().ok());
  EXPECT_EQ(c->rank, 0);
  EXPECT_EQ(c->size, 1);
  EXPECT_EQ(c->local_rank, 0);
  EXPECT_EQ(c->local_size, 1);
  EXPECT_EQ(c->job_id, "default");
  EXPECT_EQ(c->backend, "gloo");
  EXPECT_EQ(c->fusion_threshold_bytes, int64_t{64} << 20);
  EXPECT_EQ(c->timeout_s, 30.0);
  EXPECT_EQ(c->cache_capacity, 1024);
  EXPECT_FALSE(c->deterministic);
}

TEST_F(ConfigTest, DeterministicModeIsReadFromItsVariable) {
  Set("CONCORD_DETERMINISTIC", "1");
  StatusOr<Config> c = Config::FromEnvironment();
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_TRUE(c->deterministic);
  EXPECT_EQ(c->SourceOf("deterministic"), "CONCORD_DETERMINISTIC");
  Set("CONCORD_DETERMINISTIC", "0");
  c = Config::FromEnvironment();
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_FALSE(c->deterministic);
}

TEST_F(ConfigTest, TorchrunVariables) {
  Set("RANK", "2");
  Set("WORLD_SIZE", "4");
  Set("LOCAL_RANK", "0");
  Set("LOCAL_WORLD_SIZE", "2");
  Set("MASTER_ADDR", "node7");
  Set("MASTER_PORT", "29500");
  Set("TORCHELASTIC_RUN_ID", "run42");
  StatusOr<Config> c = Config::FromEnvironment();
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE(c->Finalize().ok());
  EXPECT_EQ(c->rank, 2);
  EXPECT_EQ(c->size, 4);
  EXPECT_EQ(c->local_rank, 0);
  EXPECT_EQ(c->local_size, 2);
  EXPECT_EQ(c->master_addr, "node7");
  EXPECT_EQ(c->master_port, 29500);
  EXPECT_EQ(c->job_id, "run42");
}

TEST_F(ConfigTest, OpenMpiAndSlurmVariables) {
  Set("OMPI_COMM_WORLD_RANK", "1");
  Set("OMPI_COMM_WORLD_SIZE", "3");
  Set("OMPI_COMM_WORLD_LOCAL_RANK", "1");
  Set("OMPI_COMM_WORLD_LOCAL_SIZE", "3");
  Set("OMPI_MCA_ess_base_jobid", "12345");
  StatusOr<Config> c = Config::FromEnvironment();
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->rank, 1);
  EXPECT_EQ(c->size, 3);
  EXPECT_EQ(c->job_id, "12345");
  ClearAll();
  Set("SLURM_PROCID", "5");
  Set("SLURM_NTASKS", "8");
  Set("SLURM_STEP_NUM_TASKS", "8");
  Set("SLURM_LOCALID", "1");
  Set("SLURM_JOB_ID", "777");
  c = Config::FromEnvironment();
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE(c->Finalize().ok());
  EXPECT_EQ(c->rank, 5);
  EXPECT_EQ(c->size, 8);
  EXPECT_EQ(c->local_rank, 1);
  EXPECT_EQ(c->job_id, "777");
}

// A process of a Slurm job that srun did not start (an sbatch script's own, or one from an salloc
// shell: the job's SLURM_NTASKS, no SLURM_STEP_NUM_TASKS) once took itself for rank 0 of the job's
// tasks and waited out the timeout for the others: now its init fails at once saying to use srun.
// A one-task job, CONCORD_SIZE, or ranks that concordrun starts in the script are not refused.
TEST_F(ConfigTest, SlurmJobWithoutAnSrunStepIsRefused) {
  Set("SLURM_PROCID", "0");
  Set("SLURM_NTASKS", "4");
  Set("SLURM_LOCALID", "0");
  Set("SLURM_TASKS_PER_NODE", "4");
  Set("SLURM_JOB_ID", "777");
  StatusOr<Config> c = Config::FromEnvironment();
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), Code::kInvalidArgument);
  for (const char* part : {"SLURM_NTASKS = 4", "not started by srun", "3 ranks that nothing",
                           "srun python train.py", "CONCORD_SIZE=1"}) {
    EXPECT_NE(c.status().message().find(part), std::string::npos) << c.status().message();
  }
  // Without SLURM_PROCID too (an salloc shell on the login node).
  unsetenv("SLURM_PROCID");
  c = Config::FromEnvironment();
  EXPECT_EQ(c.status().code(), Code::kInvalidArgument) << c.status().ToString();

  // One process, said so: Slurm's variables describe another job.
  Set("CONCORD_SIZE", "1");
  c = Config::FromEnvironment();
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ASSERT_TRUE(c->Finalize().ok());
  EXPECT_EQ(c->rank, 0);
  EXPECT_EQ(c->size, 1);

  // A job of one task.
  unsetenv("CONCORD_SIZE");
  Set("SLURM_PROCID", "0");
  Set("SLURM_NTASKS", "1");
  Set("SLURM_TASKS_PER_NODE", "1");
  c = Config::FromEnvironment();
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ASSERT_TRUE(c->Finalize().ok());
  EXPECT_EQ(c->size, 1);

  // concordrun -np 4 inside the script: rank 0's CONCORD_RANK and CONCORD_SIZE agree with the
  // batch step's, whose local variables it then reads.
  Set("SLURM_NTASKS", "4");
  Set("SLURM_TASKS_PER_NODE", "4");
  Set("CONCORD_RANK", "0");
  Set("CONCORD_SIZE", "4");
  c = Config::FromEnvironment();
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ASSERT_TRUE(c->Finalize().ok());
  EXPECT_EQ(c->size, 4);
  EXPECT_EQ(c->local_size, 4);

  // srun's tasks: the step's count.
  unsetenv("CONCORD_RANK");
  unsetenv("CONCORD_SIZE");
  Set("SLURM_STEP_NUM_TASKS", "4");
  c = Config::FromEnvironment();
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ASSERT_TRUE(c->Finalize().ok());
  EXPECT_EQ(c->rank, 0);
  EXPECT_EQ(c->size, 4);
  EXPECT_EQ(c->SourceOf("size"), "SLURM_STEP_NUM_TASKS");
}

TEST_F(ConfigTest, ConcordVariablesWinOverOthers) {
  Set("CONCORD_RANK", "1");
  Set("RANK", "3");
  Set("CONCORD_SIZE", "2");
  Set("WORLD_SIZE", "4");
  Set("CONCORD_JOB_ID", "mine");
  Set("SLURM_JOB_ID", "theirs");
  Set("CONCORD_FUSION_THRESHOLD", "0");
  Set("CONCORD_CYCLE_TIME_MS", "2.5");
  Set("CONCORD_INLINE_THRESHOLD", "0");
  Set("CONCORD_DIRECT_THRESHOLD", "1048576");
  Set("CONCORD_LANES", "3");
  StatusOr<Config> c = Config::FromEnvironment();
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE(c->Finalize().ok());
  EXPECT_EQ(c->rank, 1);
  EXPECT_EQ(c->size, 2);
  EXPECT_EQ(c->job_id, "mine");
  EXPECT_EQ(c->fusion_threshold_bytes, 0);
  EXPECT_EQ(c->cycle_time_ms, 2.5);
  EXPECT_EQ(c->inline_threshold_bytes, 0);
  EXPECT_EQ(c->direct_threshold_bytes, 1048576);
  EXPECT_EQ(c->lanes, 3);
}

TEST_F(ConfigTest, BackendChoice) {
  Set("CONCORD_BACKEND", "nccl-ish");
  auto c = Config::FromEnvironment();
  ASSERT_TRUE(c.ok());
  const Status s = c->Finalize();
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_NE(s.message().find("CONCORD_BACKEND"), std::string::npos) << s.ToString();

  Set("CONCORD_BACKEND", "auto");
  c = Config::FromEnvironment();
  ASSERT_TRUE(c.ok() && c->Finalize().ok());
  EXPECT_FALSE(c->mpi_launched);
  EXPECT_EQ(c->ResolvedBackend(), "gloo") << "auto without mpirun";

  const auto built = BuiltBackends();
  const bool have_mpi = std::find(built.begin(), built.end(), "mpi") != built.end();
  for (const char* launcher_variable : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK"}) {
    ClearAll();
    Set("CONCORD_BACKEND", "auto");
    Set(launcher_variable, "1");
    Set("CONCORD_RANK", "0");
    Set("CONCORD_SIZE", "1");
    c = Config::FromEnvironment();
    ASSERT_TRUE(c.ok() && c->Finalize().ok());
    EXPECT_TRUE(c->mpi_launched) << launcher_variable;
    EXPECT_EQ(c->ResolvedBackend(), have_mpi ? "mpi" : "gloo") << launcher_variable;
  }
  Set("CONCORD_BACKEND", "gloo");
  c = Config::FromEnvironment();
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->ResolvedBackend(), "gloo") << "an explicit choice is kept under mpirun";
}

// A bad value of one variable: FromEnvironment (a value that does not parse) or Finalize (one out
// of range) refuses it with INVALID_ARGUMENT, and the message holds each of `says`: the variable,
// the value and what is accepted.
struct BadVariable {
  const char* name;
  const char* value;
  std::vector<std::string> says;
};

Status ReadAndFinalize() {
  StatusOr<Config> c = Config::FromEnvironment();
  if (!c.ok()) return c.status();
  return c->Finalize();
}

TEST_F(ConfigTest, EveryBadVariableIsRefusedNamingItsValueAndWhatIsAccepted) {
  const std::vector<BadVariable> bad = {
      // Values that do not parse.
      {"CONCORD_RANK", "one", {"CONCORD_RANK='one'", "not an integer"}},
      {"WORLD_SIZE", "4x", {"WORLD_SIZE='4x'", "not an integer"}},
      {"CONCORD_TIMEOUT_S", "soon", {"CONCORD_TIMEOUT_S='soon'", "not a finite number"}},
      {"CONCORD_TIMEOUT_S", "inf", {"CONCORD_TIMEOUT_S='inf'", "not a finite number"}},
      {"CONCORD_TIMEOUT_S", "nan", {"CONCORD_TIMEOUT_S='nan'", "not a finite number"}},
      // strtod's hexadecimal and leading blanks are not taken; an underflow is out of range.
      {"CONCORD_TIMEOUT_S", "0x10", {"CONCORD_TIMEOUT_S='0x10'", "not a finite number (decimal"}},
      {"CONCORD_TIMEOUT_S", " 5", {"CONCORD_TIMEOUT_S=' 5'", "not a finite number (decimal"}},
      {"CONCORD_TIMEOUT_S", "1e-400", {"CONCORD_TIMEOUT_S='1e-400'", "in a double's range"}},
      {"CONCORD_LANES", " 2", {"CONCORD_LANES=' 2'", "not an integer"}},
      {"MASTER_PORT",
       "99999999999999999999",
       {"MASTER_PORT='99999999999999999999'", "out of range for a 64-bit integer"}},
      {"CONCORD_LANES", "4294967298", {"CONCORD_LANES='4294967298'", "32-bit"}},
      {"CONCORD_WAITER_PROGRESS", "2", {"CONCORD_WAITER_PROGRESS = 2", "0 or 1"}},
      {"CONCORD_DETERMINISTIC", "2", {"CONCORD_DETERMINISTIC = 2", "0 or 1"}},
      // Values out of range.
      {"CONCORD_TIMEOUT_S", "0", {"CONCORD_TIMEOUT_S = 0", "(0, 86400] seconds"}},
      {"CONCORD_TIMEOUT_S", "-5", {"CONCORD_TIMEOUT_S = -5", "(0, 86400] seconds"}},
      {"CONCORD_TIMEOUT_S", "86401", {"CONCORD_TIMEOUT_S = 86401", "(0, 86400] seconds"}},
      {"CONCORD_CYCLE_TIME_MS", "-1", {"CONCORD_CYCLE_TIME_MS = -1", "[0, 60000] ms"}},
      {"CONCORD_CYCLE_TIME_MS", "60001", {"CONCORD_CYCLE_TIME_MS = 60001", "[0, 60000] ms"}},
      {"CONCORD_STALL_WARNING_S", "0", {"CONCORD_STALL_WARNING_S = 0", "(0, 86400] seconds"}},
      {"CONCORD_STALL_WARNING_S", "1e300", {"CONCORD_STALL_WARNING_S = 1e+300", "(0, 86400]"}},
      {"CONCORD_STALL_SHUTDOWN_S", "-1", {"CONCORD_STALL_SHUTDOWN_S = -1", "[0, 86400] seconds"}},
      {"CONCORD_STALL_SHUTDOWN_S", "1e9", {"CONCORD_STALL_SHUTDOWN_S = 1e+09", "[0, 86400]"}},
      {"CONCORD_CACHE_CAPACITY", "-1", {"CONCORD_CACHE_CAPACITY = -1", ">= 0 entries"}},
      {"CONCORD_TOPK_RESIDUALS", "0", {"CONCORD_TOPK_RESIDUALS = 0", "at least 1 tensor name"}},
      {"CONCORD_LOG_LEVEL", "9", {"CONCORD_LOG_LEVEL = 9", "0 (errors)", "3 (debug)"}},
      {"CONCORD_LOG_LEVEL", "-1", {"CONCORD_LOG_LEVEL = -1", "3 (debug)"}},
      {"CONCORD_FUSION_THRESHOLD", "-5", {"CONCORD_FUSION_THRESHOLD = -5", ">= 0 bytes"}},
      {"CONCORD_DIRECT_THRESHOLD", "-2", {"CONCORD_DIRECT_THRESHOLD = -2", ">= 0 bytes"}},
      {"CONCORD_INLINE_THRESHOLD", "-1", {"CONCORD_INLINE_THRESHOLD = -1", "[0, 262144] bytes"}},
      {"CONCORD_INLINE_THRESHOLD",
       "262145",
       {"CONCORD_INLINE_THRESHOLD = 262145", "[0, 262144] bytes"}},
      {"CONCORD_LANES", "0", {"CONCORD_LANES = 0", "[1, 8]"}},
      {"CONCORD_LANES", "9", {"CONCORD_LANES = 9", "[1, 8]"}},
      {"MASTER_PORT", "70000", {"MASTER_PORT = 70000", "[1, 65534]"}},
      {"MASTER_PORT", "0", {"MASTER_PORT = 0", "[1, 65534]"}},
      {"CONCORD_SIZE", "0", {"CONCORD_SIZE = 0", ">= 1"}},
      // -1 is what "not given" is stored as: from a variable it is refused, not read as unset
      // (CONCORD_SIZE=-1 made a lone process; CONCORD_RANK=-1 let RANK decide).
      {"CONCORD_RANK", "-1", {"CONCORD_RANK = -1", "the rank must be >= 0"}},
      {"CONCORD_SIZE", "-1", {"CONCORD_SIZE = -1", "the number of ranks must be >= 1"}},
      {"CONCORD_LOCAL_RANK", "-1", {"CONCORD_LOCAL_RANK = -1", "must be >= 0"}},
      {"CONCORD_LOCAL_SIZE", "-1", {"CONCORD_LOCAL_SIZE = -1", "must be >= 1"}},
      {"CONCORD_SIZE", "-7", {"CONCORD_SIZE = -7", ">= 1"}},
      {"RANK", "-1", {"RANK = -1", ">= 0"}},
      {"WORLD_SIZE", "-1", {"WORLD_SIZE = -1", ">= 1"}},
      {"MASTER_PORT", "-1", {"MASTER_PORT = -1", "[1, 65534]"}},
      {"CONCORD_LOCAL_SIZE", "0", {"CONCORD_LOCAL_SIZE = 0", ">= 1"}},
      // Names: the backend, the Gloo algorithm, the compression spec (the parser's own message).
      {"CONCORD_BACKEND", "nccl-ish", {"CONCORD_BACKEND = 'nccl-ish'", "gloo, gloo-ibverbs, mpi"}},
      {"CONCORD_GLOO_ALGORITHM", "bcube", {"CONCORD_GLOO_ALGORITHM = 'bcube'", "not offered"}},
      {"CONCORD_GLOO_ALGORITHM", "fast", {"CONCORD_GLOO_ALGORITHM = 'fast'", "ring_chunked"}},
      {"CONCORD_COMPRESSION",
       "bogus",
       {"CONCORD_COMPRESSION = 'bogus'", "unknown compressor 'bogus' (known: none, fp16"}},
      {"CONCORD_COMPRESSION",
       "zstd:level=99",
       {"CONCORD_COMPRESSION = 'zstd:level=99'", "unknown compressor 'zstd'"}},
      {"CONCORD_COMPRESSION",
       "topk:density=2",
       {"CONCORD_COMPRESSION = 'topk:density=2'", "density"}},
      {"CONCORD_COMPRESSION",
       "fp16:level=1",
       {"CONCORD_COMPRESSION = 'fp16:level=1'", "takes no parameters"}},
      {"CONCORD_COMPRESSION", "topk", {"CONCORD_COMPRESSION = 'topk'", "needs a density"}},
  };
  for (const BadVariable& b : bad) {
    ClearAll();
    Set(b.name, b.value);
    const Status s = ReadAndFinalize();
    EXPECT_EQ(s.code(), Code::kInvalidArgument) << b.name << "=" << b.value << ": " << s.ToString();
    for (const std::string& part : b.says) {
      EXPECT_NE(s.message().find(part), std::string::npos)
          << b.name << "=" << b.value << ": '" << s.message() << "' does not say '" << part << "'";
    }
  }
}

TEST_F(ConfigTest, GoodValuesAtTheEdgesAreTaken) {
  for (const auto& [name, value] : std::vector<std::pair<const char*, const char*>>{
           {"CONCORD_TIMEOUT_S", "86400"},
           {"CONCORD_TIMEOUT_S", "0.001"},
           {"CONCORD_CYCLE_TIME_MS", "60000"},
           {"CONCORD_STALL_SHUTDOWN_S", "0"},
           {"CONCORD_INLINE_THRESHOLD", "262144"},
           {"CONCORD_LANES", "8"},
           {"CONCORD_CACHE_CAPACITY", "0"},
           {"CONCORD_GLOO_ALGORITHM", "halving_doubling"},
           {"CONCORD_COMPRESSION", "topk:density=0.5,method=exact,values=fp16"},
           {"CONCORD_COMPRESSION", "none"},
           {"CONCORD_CYCLE_TIME_MS", ""}}) {  // an empty variable counts as unset
    ClearAll();
    Set(name, value);
    const Status s = ReadAndFinalize();
    EXPECT_TRUE(s.ok()) << name << "=" << value << ": " << s.ToString();
  }
}

// An application (or Python's locale.setlocale(locale.LC_ALL, "")) may set a locale whose numbers
// have a decimal comma: variables are still read, and refusals written, in the C locale's format.
// CONCORD_TIMEOUT_S=2.5 used to be refused ("not a finite number") and the limits were written as
// "86.400" (the C++ locale's thousands separator).
TEST_F(ConfigTest, DecimalNumbersDoNotFollowTheApplicationsLocale) {
  const harness::CommaLocale comma;
  if (!comma.active()) GTEST_SKIP() << comma.why();
  Set("CONCORD_TIMEOUT_S", "2.5");
  Set("CONCORD_CYCLE_TIME_MS", "0.25");
  Set("CONCORD_COMPRESSION", "topk:density=0.001");
  StatusOr<Config> c = Config::FromEnvironment();
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_TRUE(c->Finalize().ok());
  EXPECT_EQ(c->timeout_s, 2.5);
  EXPECT_EQ(c->cycle_time_ms, 0.25);

  ClearAll();
  Set("CONCORD_TIMEOUT_S", "2,5");  // the locale's format is not Concord's
  EXPECT_NE(ReadAndFinalize().message().find("CONCORD_TIMEOUT_S='2,5' is not a finite number"),
            std::string::npos);
  ClearAll();
  Set("CONCORD_TIMEOUT_S", "86400.5");
  const Status s = ReadAndFinalize();
  EXPECT_NE(s.message().find("CONCORD_TIMEOUT_S = 86400.5: the timeout must be in (0, 86400] "
                             "seconds"),
            std::string::npos)
      << s.ToString();
}

// MASTER_PORT is only read to derive a store: with CONCORD_STORE given (concordrun), a value
// torchrun would refuse is not Concord's business.
TEST_F(ConfigTest, MasterPortIsCheckedOnlyWhenItMakesTheStore) {
  Set("MASTER_ADDR", "127.0.0.1");
  Set("MASTER_PORT", "65535");
  EXPECT_EQ(ReadAndFinalize().code(), Code::kInvalidArgument);
  Set("CONCORD_STORE", "tcp://127.0.0.1:4000");
  Status s = ReadAndFinalize();
  EXPECT_TRUE(s.ok()) << s.ToString();
  Set("MASTER_PORT", "not a port");  // not even read
  s = ReadAndFinalize();
  EXPECT_TRUE(s.ok()) << s.ToString();
}

TEST_F(ConfigTest, RanksOutsideTheWorldNameTheirSources) {
  Set("CONCORD_RANK", "4");
  Set("CONCORD_SIZE", "4");
  Status s = ReadAndFinalize();
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_NE(s.message().find("CONCORD_RANK = 4: the rank must be in [0, 4) (the size, from "
                             "CONCORD_SIZE)"),
            std::string::npos)
      << s.message();

  ClearAll();
  Set("RANK", "1");  // torchrun's, without WORLD_SIZE
  s = ReadAndFinalize();
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_NE(s.message().find("RANK = 1: a rank is given but not the number of ranks"),
            std::string::npos)
      << s.message();

  ClearAll();
  Set("WORLD_SIZE", "2");
  s = ReadAndFinalize();
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_NE(s.message().find("WORLD_SIZE = 2: the number of ranks is given but not this rank"),
            std::string::npos)
      << s.message();

  ClearAll();
  Set("CONCORD_LOCAL_RANK", "2");
  Set("CONCORD_LOCAL_SIZE", "2");
  Set("CONCORD_RANK", "0");
  Set("CONCORD_SIZE", "4");
  s = ReadAndFinalize();
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_NE(s.message().find("CONCORD_LOCAL_RANK = 2: the rank on this host must be in [0, 2)"),
            std::string::npos)
      << s.message();
}

// Rank, size, local rank and local size come from CONCORD_* and one launcher, never from two:
// ranks started by hand (CONCORD_RANK, CONCORD_SIZE) inside an sbatch script, whose batch step
// says SLURM_PROCID=0, SLURM_LOCALID=0, are not all local rank 0.
TEST_F(ConfigTest, OneLaunchersVariablesOnly) {
  Set("CONCORD_RANK", "2");
  Set("CONCORD_SIZE", "3");
  Set("SLURM_PROCID", "0");
  Set("SLURM_NTASKS", "4");
  Set("SLURM_LOCALID", "0");
  Set("SLURM_TASKS_PER_NODE", "4");
  StatusOr<Config> c = Config::FromEnvironment();
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ASSERT_TRUE(c->Finalize().ok());
  EXPECT_EQ(c->local_rank, 2);
  EXPECT_EQ(c->local_size, 3);

  // Open MPI's rank and size without its local ones: not Slurm's local rank either.
  ClearAll();
  Set("OMPI_COMM_WORLD_RANK", "3");
  Set("OMPI_COMM_WORLD_SIZE", "4");
  Set("SLURM_LOCALID", "0");
  c = Config::FromEnvironment();
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ASSERT_TRUE(c->Finalize().ok());
  EXPECT_EQ(c->local_rank, 3);
  EXPECT_EQ(c->SourceOf("local_rank"), "local_rank");

  // The launcher agrees with CONCORD_RANK: its local variables are this job's.
  ClearAll();
  Set("CONCORD_RANK", "3");
  Set("RANK", "3");
  Set("WORLD_SIZE", "4");
  Set("LOCAL_RANK", "1");
  Set("LOCAL_WORLD_SIZE", "2");
  c = Config::FromEnvironment();
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ASSERT_TRUE(c->Finalize().ok());
  EXPECT_EQ(c->size, 4);
  EXPECT_EQ(c->local_rank, 1);
  EXPECT_EQ(c->local_size, 2);
}

// srun: the step's tasks (not the job's), and this node's share of them as the local size, so
// that a step across nodes is not taken for a one-host job (which would meet on each node's own
// /tmp file store and time out).
TEST_F(ConfigTest, SlurmStepLayout) {
  Set("SLURM_PROCID", "3");
  Set("SLURM_NTASKS", "8");  // the job's
  Set("SLURM_STEP_NUM_TASKS", "4");
  Set("SLURM_LOCALID", "1");
  Set("SLURM_STEP_TASKS_PER_NODE", "2(x2)");
  Set("SLURM_NODEID", "1");
  StatusOr<Config> c = Config::FromEnvironment();
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ASSERT_TRUE(c->Finalize().ok());
  EXPECT_EQ(c->size, 4);
  EXPECT_EQ(c->local_rank, 1);
  EXPECT_EQ(c->local_size, 2);
  EXPECT_EQ(c->SourceOf("local_size"), "SLURM_STEP_TASKS_PER_NODE");

  Set("SLURM_PROCID", "3");
  Set("SLURM_LOCALID", "0");
  Set("SLURM_STEP_TASKS_PER_NODE", "3,1");  // node 1 runs rank 3 alone
  c = Config::FromEnvironment();
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ASSERT_TRUE(c->Finalize().ok());
  EXPECT_EQ(c->local_size, 1);

  unsetenv("SLURM_NODEID");
  c = Config::FromEnvironment();
  EXPECT_EQ(c.status().code(), Code::kInvalidArgument);
  EXPECT_NE(c.status().message().find("SLURM_NODEID"), std::string::npos) << c.status().message();

  for (const char* node : {" 1", "+1", "1 "}) {  // blanks and signs are not Slurm's
    Set("SLURM_NODEID", node);
    c = Config::FromEnvironment();
    EXPECT_EQ(c.status().code(), Code::kInvalidArgument) << "SLURM_NODEID='" << node << "'";
  }

  Set("SLURM_NODEID", "0");
  // "2(" once made the parser read past the end of the item: with a long item (on the heap),
  // AddressSanitizer reports a heap-buffer-overflow in strtol.
  for (const char* bad : {"2(x", "2(", "0000000000000000000000002(", "x2", "2(x0)", "2,,2",
                          "2(x2)y", "2(x2)y)", "99999999999", ""}) {
    Set("SLURM_STEP_TASKS_PER_NODE", bad);
    if (*bad == '\0') continue;  // unset: no local size, as before
    c = Config::FromEnvironment();
    EXPECT_EQ(c.status().code(), Code::kInvalidArgument) << bad;
  }
}

// torchrun's restarts keep the run id: each round is a job of its own.
TEST_F(ConfigTest, TorchrunRestartsAreJobsOfTheirOwn) {
  Set("RANK", "0");
  Set("WORLD_SIZE", "2");
  Set("TORCHELASTIC_RUN_ID", "run42");
  Set("TORCHELASTIC_RESTART_COUNT", "0");
  StatusOr<Config> c = Config::FromEnvironment();
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->job_id, "run42");
  Set("TORCHELASTIC_RESTART_COUNT", "2");
  c = Config::FromEnvironment();
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->job_id, "run42/restart2");
  Set("CONCORD_JOB_ID", "mine");  // named by hand: as given
  c = Config::FromEnvironment();
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->job_id, "mine");
}

TEST_F(ConfigTest, MoreLocalRanksThanRanksAreRefused) {
  Set("RANK", "0");
  Set("WORLD_SIZE", "4");
  Set("LOCAL_RANK", "0");
  Set("LOCAL_WORLD_SIZE", "8");
  Status s = ReadAndFinalize();
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_NE(s.message().find("LOCAL_WORLD_SIZE = 8: the number of ranks on this host must be at "
                             "most the number of ranks, 4 (from WORLD_SIZE)"),
            std::string::npos)
      << s.message();
}

// Settings made in C++ (not from a variable) are named by their member; the C API names its
// fields the same way through `sources` (tests/c_api).
TEST_F(ConfigTest, SettingsMadeInCodeAreNamedByTheirMember) {
  Config c;
  c.timeout_s = std::nan("");
  Status s = c.Finalize();
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_NE(s.message().find("timeout_s = nan: the timeout must be in (0, 86400] seconds"),
            std::string::npos)
      << s.message();

  c = Config();
  c.compression = "zstd:level=99";
  c.sources["compression"] = "concord_config_t.compression";
  s = c.Finalize();
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_EQ(s.message(),
            "concord_config_t.compression = 'zstd:level=99': unknown compressor 'zstd' (known: "
            "none, fp16, bf16, topk)");

  c = Config();
  c.compression = "";  // "" is "none"
  EXPECT_TRUE(c.Finalize().ok());
  EXPECT_EQ(c.SourceOf("lanes"), "lanes");
}

TEST_F(ConfigTest, FromEnvironmentNotesEachVariableItRead) {
  Set("RANK", "1");
  Set("CONCORD_SIZE", "2");
  Set("CONCORD_LANES", "3");
  StatusOr<Config> c = Config::FromEnvironment();
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->SourceOf("rank"), "RANK");
  EXPECT_EQ(c->SourceOf("size"), "CONCORD_SIZE");
  EXPECT_EQ(c->SourceOf("lanes"), "CONCORD_LANES");
  EXPECT_EQ(c->SourceOf("timeout_s"), "timeout_s");  // not set: the default
}

}  // namespace
}  // namespace concord
