/*
 * Checks for the tests that are plain programs over the C API rather than gtest binaries (C99 or
 * C++): the C API test, the multi-process tests run by a launcher, the MPI lifetime test.
 *
 * Contract: a failed check counts one failure and prints one line to stderr, then the program
 * goes on, so one run shows every failure; the program reports at its end (CheckFailures()) and
 * exits non-zero when there were any. A line reads
 *   "rank 2: FAIL conformance.cc:120: s == CONCORD_SUCCESS: allreduce 'x': timeout"
 * where "rank 2" is the context the program set (its rank, or the phase it is in) and the text
 * after the condition is CHECKF's message. Launcher-run tests reject output lines matching
 * "rank N: FAIL", so a process-level failure fails the test even when the exit status cannot
 * (tests/mp/CMakeLists.txt). Only the first CHECK_MAX_PRINTED failures are printed; all count.
 *
 * The state is static in this header: include it from one source file per program, and check
 * from one thread at a time.
 */
#ifndef CONCORD_TESTS_COMMON_CHECK_H_
#define CONCORD_TESTS_COMMON_CHECK_H_

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "concord/concord.h"

#define CHECK_MAX_PRINTED 30

#if defined(__GNUC__)
#define CHECK_PRINTF_FORMAT(fmt, first) __attribute__((format(printf, fmt, first)))
#else
#define CHECK_PRINTF_FORMAT(fmt, first)
#endif

static int check_failures_ = 0;
static char check_context_[128] = "";

/* Sets what every later failure line starts with ("rank 3", a phase's name). */
static inline void CheckSetContext(const char* format, ...) CHECK_PRINTF_FORMAT(1, 2);
static inline void CheckSetContext(const char* format, ...) {
  va_list args;
  va_start(args, format);
  vsnprintf(check_context_, sizeof(check_context_), format, args);
  va_end(args);
}

/* Failures so far. */
static inline int CheckFailures(void) {
  return check_failures_;
}

/* Counts a failure at file:line and prints it as one line (one write: lines of ranks sharing a
 * pipe stay whole). `condition` or the formatted message may be empty. */
static inline void CheckFail(const char* file, int line, const char* condition, const char* format,
                             ...) CHECK_PRINTF_FORMAT(4, 5);
static inline void CheckFail(const char* file, int line, const char* condition, const char* format,
                             ...) {
  char message[1024];
  const char* base = strrchr(file, '/');
  va_list args;
  if (++check_failures_ > CHECK_MAX_PRINTED) return;
  va_start(args, format);
  vsnprintf(message, sizeof(message), format, args);
  va_end(args);
  fprintf(stderr, "%s%sFAIL %s:%d%s%s%s%s\n", check_context_, check_context_[0] ? ": " : "",
          base ? base + 1 : file, line, condition[0] ? ": " : "", condition, message[0] ? ": " : "",
          message);
  if (check_failures_ == CHECK_MAX_PRINTED) {
    fprintf(stderr, "%s%s(later failures are counted, not printed)\n", check_context_,
            check_context_[0] ? ": " : "");
  }
}

/* CHECK(cond): a failure when cond is false. */
#define CHECK(cond)                                              \
  do {                                                           \
    if (!(cond)) CheckFail(__FILE__, __LINE__, #cond, "%s", ""); \
  } while (0)

/* CHECKF(cond, format, ...): the same, with a printf-style message saying what was seen. */
#define CHECKF(cond, ...)                                           \
  do {                                                              \
    if (!(cond)) CheckFail(__FILE__, __LINE__, #cond, __VA_ARGS__); \
  } while (0)

/* FAILF(format, ...): a failure found by the test's own logic (no single condition to name). */
#define FAILF(...) CheckFail(__FILE__, __LINE__, "", __VA_ARGS__)

/* CHECK_STATUS(expr, want): expr, a concord_status_t, equals want; the line names both. */
#define CHECK_STATUS(expr, want)                                                              \
  do {                                                                                        \
    const concord_status_t check_got_ = (expr);                                               \
    const concord_status_t check_want_ = (want);                                              \
    if (check_got_ != check_want_) {                                                          \
      CheckFail(__FILE__, __LINE__, #expr, "returned %d (%s), want %d (%s)", (int)check_got_, \
                concord_status_string(check_got_), (int)check_want_,                          \
                concord_status_string(check_want_));                                          \
    }                                                                                         \
  } while (0)

#endif /* CONCORD_TESTS_COMMON_CHECK_H_ */
