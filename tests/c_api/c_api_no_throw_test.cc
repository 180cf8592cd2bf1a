// No C++ exception crosses the C API (include/concord/concord.h), std::bad_alloc included: with
// every allocation of the calling thread failing, each call below returns a status (SYSTEM, "out
// of memory") instead of throwing into its C caller, where an exception is std::terminate. This
// program replaces the global operator new so that it can make the test thread's allocations fail
// (the engine's threads allocate as usual); ranks and communicators are those of the C API alone.
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>

#include "concord/concord.h"
#include "gtest/gtest.h"

namespace {

thread_local bool t_fail_new = false;  // this thread's allocations fail while set

// Makes the calling thread's allocations fail while it lives.
class NoMemory {
 public:
  NoMemory() { t_fail_new = true; }
  ~NoMemory() { t_fail_new = false; }
  NoMemory(const NoMemory&) = delete;
  NoMemory& operator=(const NoMemory&) = delete;
};

// Runs call() without memory: its status, or the failure of the test when it threw.
template <typename F>
auto WithoutMemory(const char* what, F&& call) -> decltype(call()) {
  try {
    NoMemory none;
    return call();
  } catch (...) {
    ADD_FAILURE() << "an exception escaped " << what << " through the C API";
    return decltype(call())();
  }
}

concord_comm_t InitSingle() {
  concord_config_t c;
  concord_config_init(&c);
  c.rank = 0;
  c.size = 1;
  c.local_rank = 0;
  c.local_size = 1;
  c.timeout_s = 20;
  concord_comm_t comm = nullptr;
  EXPECT_EQ(concord_init_config(&c, &comm), CONCORD_SUCCESS) << concord_comm_last_error(nullptr);
  return comm;
}

TEST(CApiNoThrowTest, OutOfMemoryIsAStatusNeverAnException) {
  concord_comm_t comm = InitSingle();
  ASSERT_NE(comm, nullptr);
  int rank = -5;
  // A failure first, so this thread has its last-error entry (its text then needs no new node).
  ASSERT_EQ(concord_comm_rank(comm, nullptr), CONCORD_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(WithoutMemory("concord_comm_rank", [&] { return concord_comm_rank(comm, nullptr); }),
            CONCORD_ERR_SYSTEM);
  EXPECT_NE(std::strstr(concord_comm_last_error(comm), "out of memory"), nullptr)
      << concord_comm_last_error(comm);
  EXPECT_EQ(rank, -5);

  float x[2] = {1, 2};
  int64_t shape[1] = {2};
  const concord_tensor_t t = {x, CONCORD_FLOAT32, 1, shape, CONCORD_DEVICE_CPU};
  EXPECT_EQ(WithoutMemory("concord_allreduce",
                          [&] { return concord_allreduce(comm, "oom", &t, nullptr, nullptr); }),
            CONCORD_ERR_SYSTEM);
  EXPECT_EQ(WithoutMemory("concord_recv", [&] { return concord_recv(comm, nullptr, 0, 0); }),
            CONCORD_ERR_SYSTEM);

  concord_request_t r = nullptr;
  ASSERT_EQ(concord_allreduce_async(comm, "done", &t, nullptr, nullptr, nullptr, nullptr, &r),
            CONCORD_SUCCESS);
  ASSERT_EQ(concord_wait(r, -1), CONCORD_SUCCESS);
  // The request's own refusals: making their message needs memory.
  EXPECT_EQ(WithoutMemory("concord_wait", [&] { return concord_wait(r, std::nan("")); }),
            CONCORD_ERR_SYSTEM);
  EXPECT_EQ(
      WithoutMemory("concord_request_output_shape",
                    [&] { return concord_request_output_shape(r, nullptr, nullptr, nullptr); }),
      CONCORD_ERR_SYSTEM);
  // With memory, the refusal's message is kept; copying it out without memory cannot throw.
  ASSERT_EQ(concord_wait(r, std::nan("")), CONCORD_ERR_INVALID_ARGUMENT);
  ASSERT_NE(std::strstr(concord_request_error(r), "NaN"), nullptr);
  const char* text =
      WithoutMemory("concord_request_error", [&] { return concord_request_error(r); });
  EXPECT_NE(text, nullptr);
  concord_request_free(r);
  EXPECT_EQ(concord_finalize(comm), CONCORD_SUCCESS);
}

}  // namespace

// The global allocation functions of this program (the library's allocations come here too).
void* operator new(std::size_t bytes) {
  if (t_fail_new) throw std::bad_alloc();
  if (void* p = std::malloc(bytes == 0 ? 1 : bytes)) return p;
  throw std::bad_alloc();
}
// Not inlined: gcc, seeing free() on what operator new returned, warns of a mismatch
// (-Wmismatched-new-delete at -O1) that these replacements make right.
__attribute__((noinline)) void operator delete(void* p) noexcept {
  std::free(p);
}
__attribute__((noinline)) void operator delete(void* p, std::size_t) noexcept {
  std::free(p);
}
