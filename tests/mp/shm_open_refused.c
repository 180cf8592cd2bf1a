/* A preload (LD_PRELOAD) for the shared-memory set-up's failure paths: shm_open fails with EACCES,
 * as where /dev/shm is not writable, on the pretend host that CONCORD_TEST_SHM_REFUSED_HOST names
 * (matched against CONCORD_HOST_ID), or everywhere when it is unset. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

__attribute__((visibility("default"))) int shm_open(const char* name, int oflag, mode_t mode) {
  const char* refused = getenv("CONCORD_TEST_SHM_REFUSED_HOST");
  const char* host = getenv("CONCORD_HOST_ID");
  if (refused == NULL || (host != NULL && strcmp(refused, host) == 0)) {
    errno = EACCES;
    return -1;
  }
  int (*real)(const char*, int, mode_t) =
      (int (*)(const char*, int, mode_t))dlsym(RTLD_NEXT, "shm_open");
  return real(name, oflag, mode);
}
