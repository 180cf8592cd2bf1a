"""A child forked from a rank (os.fork, multiprocessing's "fork"): it has none of the parent's
Concord threads, so the parent's communicator and an operation the parent left in flight raise
ConcordError (NOT_INITIALIZED) naming the parent instead of hanging, and the child's exit
handlers finalize nothing (they used to run the parent's finalize in the child: a crash, or a
hang that kept the parent waiting); the parent's communicator goes on working."""
import os

import numpy as np

from forkutil import in_forked_child, refused_in_child

from concord import errors


def test_forked_child_refuses_the_parents_communicator_and_exits(comm):
    x = np.full(4, comm.rank + 1, np.float32)
    comm.allreduce_(x, name="fork.before")
    # Rank 0 leaves an operation in flight across the fork; the others join it afterwards.
    pending = comm.allreduce_async(np.ones(3, np.float32), name="fork.pending") \
        if comm.rank == 0 else None

    def child():
        failures = []
        refused_in_child(failures, "allreduce",
                         lambda: comm.allreduce(np.ones(2, np.float32), name="fork.child"), errors)
        refused_in_child(failures, "barrier", comm.barrier, errors)
        if pending is not None:
            refused_in_child(failures, "wait on the parent's handle", pending.wait, errors)
            refused_in_child(failures, "poll of the parent's handle", pending.poll, errors)
        comm.finalize()  # nothing to finalize here: no error, and nothing sent
        return failures

    status, report = in_forked_child(child)
    assert status is not None and os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, \
        (status, report)
    assert report == ""
    if pending is None:
        pending = comm.allreduce_async(np.ones(3, np.float32), name="fork.pending")
    assert pending.wait(timeout=20).tolist() == [comm.size] * 3
    comm.allreduce_(x, name="fork.after")
    assert x.tolist() == [sum(range(1, comm.size + 1)) * comm.size] * 4
