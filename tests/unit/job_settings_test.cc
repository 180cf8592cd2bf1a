// Job settings: what rank 0 gives and how every other rank compares it with its own, through the
// store and through a backend's broadcast (MPI's way). Ranks of different builds are refused by
// name, whatever rank 0's bytes hold, never waited on or read as settings.
#include "core/job_settings.h"

#include <gtest/gtest.h>

#include <chrono>
#include <random>
#include <string>
#include <thread>

#include "base/wire_version.h"
#include "rendezvous/hash_store.h"
#include "tests/unit/inproc_transport.h"

namespace concord {
namespace {

Config RankConfig(int rank) {
  Config c;
  c.rank = rank;
  c.size = 2;
  return c;
}

// Rank 0's blob with setting `name` given `value`, or without it (value nullptr).
std::string Edited(const std::string& name, const char* value) {
  std::string blob;
  for (const auto& [n, v] : JobSettings(RankConfig(0))) {
    if (n != name) {
      blob += n + "=" + v + "\n";
    } else if (value != nullptr) {
      blob += n + "=" + value + "\n";
    }
  }
  return blob;
}

// What a build from before wire versions gave: the same settings without the build's two.
std::string BlobBeforeWireVersions() {
  std::string blob;
  for (const auto& [n, v] : JobSettings(RankConfig(0))) {
    if (n.rfind("Concord ", 0) != 0) blob += n + "=" + v + "\n";
  }
  return blob;
}

void ExpectRefused(const Status& s, const std::string& says) {
  EXPECT_EQ(s.code(), Code::kInvalidArgument) << s.ToString();
  EXPECT_NE(s.message().find(says), std::string::npos) << s.ToString();
}

TEST(JobSettingsTest, TheBuildComesFirstAndTheBlobIsItsLines) {
  const auto settings = JobSettings(RankConfig(0));
  ASSERT_GE(settings.size(), 3u);
  EXPECT_EQ(settings[0].first, "Concord wire version");
  EXPECT_EQ(settings[0].second, std::to_string(kWireVersion));
  EXPECT_EQ(settings[1].first, "Concord version");
  std::string lines;
  for (const auto& [n, v] : settings) lines += n + "=" + v + "\n";
  EXPECT_EQ(JobSettingsBlob(RankConfig(0)), lines);
}

TEST(JobSettingsTest, SameSettingsAreAccepted) {
  EXPECT_TRUE(CompareJobSettings(RankConfig(1), JobSettingsBlob(RankConfig(0))).ok());
}

TEST(JobSettingsTest, ASettingThatDiffersIsNamedWithBothValues) {
  Config rank0 = RankConfig(0);
  rank0.lanes = 3;
  Config rank1 = RankConfig(1);
  rank1.lanes = 2;
  ExpectRefused(CompareJobSettings(rank1, JobSettingsBlob(rank0)),
                "CONCORD_LANES must be the same on every rank: rank 0 has '3', rank 1 has '2'");
}

TEST(JobSettingsTest, ABuildFromBeforeWireVersionsIsRefusedAsAnotherBuild) {
  const Status s = CompareJobSettings(RankConfig(1), BlobBeforeWireVersions());
  ExpectRefused(s,
                "rank 0 and rank 1 run different builds of Concord: rank 0's job settings "
                "give no Concord wire version");
  ExpectRefused(s, "rank 1 runs Concord " + std::to_string(CONCORD_VERSION_MAJOR));
  ExpectRefused(s, "give every rank the same libconcord");
}

TEST(JobSettingsTest, AnotherWireVersionIsRefusedNamingIt) {
  const std::string other = std::to_string(kWireVersion + 1);
  ExpectRefused(CompareJobSettings(RankConfig(1), Edited("Concord wire version", other.c_str())),
                "run different builds of Concord: rank 0 has Concord wire version " + other +
                    " (rank 1 runs Concord");
}

TEST(JobSettingsTest, AnotherVersionIsRefusedNamingIt) {
  ExpectRefused(CompareJobSettings(RankConfig(1), Edited("Concord version", "9.8.7")),
                "run different builds of Concord: rank 0 has Concord version 9.8.7");
}

TEST(JobSettingsTest, SettingsOneBuildComparesAndTheOtherDoesNotAreRefusedAsAnotherBuild) {
  ExpectRefused(CompareJobSettings(RankConfig(1), Edited("CONCORD_SHM", nullptr)),
                "rank 0's job settings do not give CONCORD_SHM");
  ExpectRefused(
      CompareJobSettings(RankConfig(1), JobSettingsBlob(RankConfig(0)) + "CONCORD_LATER=4\n"),
      "rank 0's job settings also give CONCORD_LATER (it compares settings this build does not "
      "know)");
}

// Bytes that are not this build's blob: refused, whatever they are; never accepted, never a crash.
TEST(JobSettingsTest, MalformedBytesAreRefused) {
  const std::string mine = JobSettingsBlob(RankConfig(0));
  for (const std::string& bytes :
       {std::string(), std::string("\n\n"), std::string("=\n="), std::string("\0\0\0", 3),
        mine.substr(0, mine.size() - 1), mine + "\n", mine.substr(0, mine.size() / 2),
        std::string("Concord wire version\nConcord version\n")}) {
    const Status s = CompareJobSettings(RankConfig(1), bytes);
    EXPECT_EQ(s.code(), Code::kInvalidArgument) << testing::PrintToString(bytes);
    EXPECT_NE(s.message().find("run different builds of Concord"), std::string::npos)
        << s.ToString();
  }
  std::mt19937 random(7);
  for (int i = 0; i < 2000; ++i) {
    std::string bytes = mine;
    for (int flips = 1 + static_cast<int>(random() % 3); flips > 0; --flips) {
      bytes[random() % bytes.size()] = static_cast<char>(random() % 256);
    }
    if (bytes == mine) continue;
    EXPECT_EQ(CompareJobSettings(RankConfig(1), bytes).code(), Code::kInvalidArgument);
  }
}

// Through the store, as a start compares: an older rank 0's settings end rank 1's start at once.
TEST(JobSettingsTest, AStoreStartRefusesAnOlderRank0AtOnce) {
  const auto timeout = std::chrono::seconds(30);
  HashStore store;
  ASSERT_TRUE(CheckJobSettings(RankConfig(0), &store, "job/comm0", Deadline::After(timeout)).ok());
  EXPECT_TRUE(CheckJobSettings(RankConfig(1), &store, "job/comm0", Deadline::After(timeout)).ok());

  ASSERT_TRUE(store.Set("job/comm1/settings", BlobBeforeWireVersions()).ok());
  const auto start = std::chrono::steady_clock::now();
  ExpectRefused(CheckJobSettings(RankConfig(1), &store, "job/comm1", Deadline::After(timeout)),
                "run different builds of Concord");
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
}

// Through a backend's broadcast (the MPI start): rank 0 broadcasts the length, then the blob.
TEST(JobSettingsTest, ABroadcastStartComparesRank0sSettings) {
  for (const bool older : {false, true}) {
    InProcWorld world(2, std::chrono::seconds(10));
    auto rank0 = world.MakeBackend(0);
    auto rank1 = world.MakeBackend(1);
    Status rank0_done;
    std::thread rank0_thread([&] {
      if (!older) {
        rank0_done = CheckJobSettings(RankConfig(0), rank0.get());
        return;
      }
      std::string blob = BlobBeforeWireVersions();
      uint64_t length = blob.size();
      rank0_done = rank0->Broadcast(&length, sizeof(length), 0);
      if (rank0_done.ok()) rank0_done = rank0->Broadcast(blob.data(), blob.size(), 0);
    });
    const Status rank1_done = CheckJobSettings(RankConfig(1), rank1.get());
    rank0_thread.join();
    EXPECT_TRUE(rank0_done.ok()) << rank0_done.ToString();
    if (older) {
      ExpectRefused(rank1_done, "run different builds of Concord");
    } else {
      EXPECT_TRUE(rank1_done.ok()) << rank1_done.ToString();
    }
  }
}

}  // namespace
}  // namespace concord
