/* LD_PRELOAD shim for concord_perf_check_test.py: concord_allreduce as the library's, except that
 * a float32 allreduce named "perf.allreduce.*" (concord-perf's sweep rows) comes back with its
 * first element off by one, so that concord-perf's check of its results has a wrong one to find.
 * Everything else (its timing reductions, other ops) is left alone. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <string.h>

#include "concord/concord.h"

typedef concord_status_t (*allreduce_fn)(concord_comm_t, const char*, const concord_tensor_t*,
                                         const concord_tensor_t*, const concord_allreduce_opts_t*);

__attribute__((visibility("default"))) concord_status_t concord_allreduce(
    concord_comm_t comm, const char* name, const concord_tensor_t* input,
    const concord_tensor_t* output, const concord_allreduce_opts_t* opts) {
  allreduce_fn real = (allreduce_fn)dlsym(RTLD_NEXT, "concord_allreduce");
  concord_status_t s = real(comm, name, input, output, opts);
  if (s == CONCORD_SUCCESS && name != NULL && strncmp(name, "perf.allreduce.", 15) == 0 &&
      input->dtype == CONCORD_FLOAT32 && input->ndim == 1 && input->shape[0] > 0) {
    float* data = (float*)(output != NULL && output->data != NULL ? output->data : input->data);
    data[0] += 1.0f;
  }
  return s;
}
