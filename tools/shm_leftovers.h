// Shared-memory segments that ranks of a job left behind: backends/shm names each segment
// /dev/shm/concord-<creator pid>-<n>-<random> and unlinks the name once every rank of its host has
// attached, so a name is left only when ranks died during the set-up (a whole job killed then
// leaves no rank to unlink it). concordrun removes them once the job's ranks are gone.
#pragma once

#include <sys/types.h>

namespace concord {

// Unlinks every /dev/shm/concord-<pid>-* (the segments a rank process `pid` created and did not
// unlink); call only once `pid` has exited. Returns how many were removed; errors are ignored (a
// name another process removed first, a /dev/shm that does not exist). Allocates: not for a
// signal handler.
int RemoveSegmentsOf(pid_t pid);

}  // namespace concord
