/* An LD_PRELOAD shim for the timeline's clock test (test_timeline_clock.py): the process whose
 * CONCORD_RANK equals CONCORD_TEST_SKEW_RANK sees its system clock CONCORD_TEST_SKEW_US
 * microseconds ahead (negative: behind), as a rank on a host whose clock is off would; every
 * other process (the other ranks, concordrun) sees the true time. Only the system clock moves:
 * clock_gettime(CLOCK_REALTIME, _COARSE) and gettimeofday. The steady clock, which timeouts and
 * the timeline's timestamps use, is left alone.
 *
 * Checked on Debian 12 (GCC 12's libstdc++, glibc 2.36): std::chrono::system_clock::now() calls
 * clock_gettime(CLOCK_REALTIME) through the PLT of libstdc++.so, so the shim interposes it; the
 * test fails on a library whose clock the shim does not reach (the measured offset would be 0). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>

static int64_t skew_us(void) {
  static int64_t skew = -1;
  if (skew == -1) {
    const char* rank = getenv("CONCORD_RANK");
    const char* want = getenv("CONCORD_TEST_SKEW_RANK");
    const char* us = getenv("CONCORD_TEST_SKEW_US");
    skew = (rank && want && us && strcmp(rank, want) == 0) ? strtoll(us, NULL, 10) : 0;
  }
  return skew;
}

static void add_us(time_t* sec, long* frac, long per_sec, int64_t us) {
  const int64_t scale = per_sec / 1000000; /* 1000 for ns, 1 for us */
  int64_t total = (int64_t)*sec * per_sec + *frac + us * scale;
  *sec = (time_t)(total / per_sec);
  *frac = (long)(total % per_sec);
  if (*frac < 0) {
    *frac += per_sec;
    *sec -= 1;
  }
}

/* Exported: the build hides symbols by default (-fvisibility=hidden). */
#define EXPORT __attribute__((visibility("default")))

EXPORT int clock_gettime(clockid_t id, struct timespec* ts) {
  static int (*real)(clockid_t, struct timespec*);
  if (real == NULL) real = (int (*)(clockid_t, struct timespec*))dlsym(RTLD_NEXT, "clock_gettime");
  const int rc = real(id, ts);
  if (rc == 0 && (id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE)) {
    add_us(&ts->tv_sec, &ts->tv_nsec, 1000000000L, skew_us());
  }
  return rc;
}

EXPORT int gettimeofday(struct timeval* tv, void* tz) {
  static int (*real)(struct timeval*, void*);
  if (real == NULL) real = (int (*)(struct timeval*, void*))dlsym(RTLD_NEXT, "gettimeofday");
  const int rc = real(tv, tz);
  if (rc == 0) add_us(&tv->tv_sec, &tv->tv_usec, 1000000L, skew_us());
  return rc;
}
