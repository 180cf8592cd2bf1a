"""A rank whose training loop raises: the package's exit-time finalize tells the other ranks at
once, so their pending allreduce fails naming it and the whole job ends in seconds, not at the
finalize barrier's timeout (run with --timeout 30; the test allows 10 s).

Rank 1 raises in step 2 before submitting; the others report the error they got and exit 3."""
import sys
import time

import numpy as np

import concord

comm = concord.init()
for step in range(4):
    if comm.rank == 1 and step == 2:
        raise RuntimeError("rank 1 fails in step 2")
    x = np.full(5, comm.rank + step, dtype=np.float32)
    start = time.monotonic()
    try:
        comm.allreduce(x, name="x")
    except concord.ConcordError as e:
        print("EXIT_TEST rank %d: step %d: %s: after %.2f s" %
              (comm.rank, step, e, time.monotonic() - start), flush=True)
        sys.exit(3)
print("EXIT_TEST rank %d: no error" % comm.rank, flush=True)
