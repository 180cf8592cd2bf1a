// Config: what the environment of each launcher yields, precedence, and malformed values.
#include "core/config.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <string>
#include <vector>

#include "backends/backend.h"

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
                             "CONCORD_LOG_LEVEL",
                             "CONCORD_STALL_WARNING_S",
                             "CONCORD_STALL_SHUTDOWN_S"}) {
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

TEST_F(ConfigTest, MalformedValuesNameTheVariable) {
  const std::vector<std::pair<const char*, const char*>> bad = {
      {"CONCORD_RANK", "one"},
      {"WORLD_SIZE", "4x"},
      {"CONCORD_TIMEOUT_S", "soon"},
      {"CONCORD_CYCLE_TIME_MS", ""},
      {"MASTER_PORT", "99999999999999999999"},
      {"CONCORD_TIMEOUT_S", "inf"}};
  for (const auto& [name, value] : bad) {
    ClearAll();
    Set(name, value);
    StatusOr<Config> c = Config::FromEnvironment();
    if (std::string(value).empty()) {  // an empty variable counts as unset
      EXPECT_TRUE(c.ok());
      continue;
    }
    ASSERT_FALSE(c.ok()) << name << "=" << value;
    EXPECT_EQ(c.status().code(), Code::kInvalidArgument);
    EXPECT_NE(c.status().message().find(name), std::string::npos) << c.status().message();
  }
}

TEST_F(ConfigTest, OutOfRangeValuesAreRefusedByFinalize) {
  struct Case {
    const char* name;
    const char* value;
  };
  for (const Case& k :
       {Case{"CONCORD_TIMEOUT_S", "0"}, Case{"CONCORD_CACHE_CAPACITY", "-1"},
        Case{"CONCORD_LOG_LEVEL", "9"}, Case{"CONCORD_FUSION_THRESHOLD", "-5"},
        Case{"CONCORD_INLINE_THRESHOLD", "-1"}, Case{"CONCORD_INLINE_THRESHOLD", "262145"},
        Case{"CONCORD_DIRECT_THRESHOLD", "-2"}, Case{"CONCORD_LANES", "0"},
        Case{"CONCORD_LANES", "9"}, Case{"CONCORD_STALL_WARNING_S", "0"},
        Case{"MASTER_PORT", "70000"}}) {
    ClearAll();
    Set(k.name, k.value);
    StatusOr<Config> c = Config::FromEnvironment();
    ASSERT_TRUE(c.ok()) << k.name;
    EXPECT_EQ(c->Finalize().code(), Code::kInvalidArgument) << k.name << "=" << k.value;
  }
  ClearAll();
  Set("CONCORD_RANK", "4");
  Set("CONCORD_SIZE", "4");
  StatusOr<Config> c = Config::FromEnvironment();
  ASSERT_TRUE(c.ok());
  const Status s = c->Finalize();
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_NE(s.message().find("rank 4"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace concord
