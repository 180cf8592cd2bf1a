// What the C++ API tests share: ranks as threads of this process (tests/common/ranks.h), each with
// its own concord::Communicator over a file store private to the call, so everything below the
// API is real (TCP control plane, Gloo over loopback).
#pragma once

#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <functional>
#include <string>

#include "concord/concord.hpp"
#include "gtest/gtest.h"
#include "tests/common/ranks.h"

namespace concord::harness {

// Runs body(comm) on `size` ranks; `job` names the job (and its store directory). A
// concord::Error escaping a body fails the test with its status and message.
inline void RunCommunicators(int size, const std::string& job,
                             const std::function<void(concord::Communicator&)>& body) {
  static std::atomic<int> calls{0};
  const std::string path =
      "/tmp/concord-" + job + "-" + std::to_string(getpid()) + "-" + std::to_string(calls++);
  const std::string dir = "file://" + path;
  RunRanks(size, [&](int r) {
    try {
      concord_config_t config;
      concord_config_init(&config);
      config.rank = r;
      config.size = size;
      config.store = dir.c_str();
      config.job_id = job.c_str();
      config.timeout_s = 20;
      concord::Communicator comm(config);
      body(comm);
    } catch (const concord::Error& e) {
      ADD_FAILURE() << e.what() << " (status " << e.status() << ")";
    }
  });
  std::filesystem::remove_all(path);
}

}  // namespace concord::harness
