/* Installed-package consumer in C: a single-rank allreduce through the C API. */
#include <concord/concord.h>
#include <stdio.h>

int main(void) {
  concord_config_t config;
  concord_comm_t comm = NULL;
  float x[3] = {1, 2, 3};
  int64_t shape[1] = {3};
  concord_tensor_t t;
  concord_status_t s;
  int major = 0, minor = 0, patch = 0;
  concord_version(&major, &minor, &patch);
  concord_config_init(&config);
  config.rank = 0;
  config.size = 1;
  s = concord_init_config(&config, &comm);
  if (s != CONCORD_SUCCESS) {
    fprintf(stderr, "init: %s: %s\n", concord_status_string(s), concord_comm_last_error(NULL));
    return 1;
  }
  t.data = x;
  t.dtype = CONCORD_FLOAT32;
  t.ndim = 1;
  t.shape = shape;
  t.device = CONCORD_DEVICE_CPU;
  s = concord_allreduce(comm, "x", &t, NULL, NULL);
  if (s != CONCORD_SUCCESS || x[0] != 1 || x[2] != 3) {
    fprintf(stderr, "allreduce: %s: %s\n", concord_status_string(s), concord_comm_last_error(comm));
    return 1;
  }
  concord_finalize(comm);
  printf("consumer_c OK (Concord %d.%d.%d)\n", major, minor, patch);
  return 0;
}
