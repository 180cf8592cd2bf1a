"""concord.Communicator.join from Python: uneven epochs where rank r runs 2 + r steps, then joins;
each step's average over the ranks still stepping (an allreduce and a reduce to the last rank,
which steps longest), the rows of the ranks still stepping (an allgather and a gather to it), and
the last rank to join."""
import numpy as np


def test_uneven_epochs_end_with_join(comm):
    steps = 2 + comm.rank
    for step in range(steps):
        stepping = [r for r in range(comm.size) if step < 2 + r]
        x = np.full(33, comm.rank + step, dtype=np.float32)
        out = comm.allreduce(x, name="avg", op="average")
        want = sum(r + step for r in stepping) / len(stepping)
        assert np.allclose(out, want), (step, out[0], want)
        rows = comm.allgather(np.full((comm.rank + 1, 2), comm.rank, dtype=np.int64), name="rows")
        assert [int(v) for v in rows[:, 0]] == [r for r in stepping for _ in range(r + 1)]
        # To the last rank, which has not joined: a joined rank contributes the identity / no rows.
        last = comm.size - 1
        got = comm.reduce(x, root=last, name="red", op="max")
        assert (got is None) == (comm.rank != last)
        if got is not None:
            assert np.all(got == max(r + step for r in stepping)), (step, got[0])
        rows = comm.gather(np.full((comm.rank + 1, 2), comm.rank, dtype=np.int64), root=last,
                           name="gath")
        if comm.rank == last:
            assert [int(v) for v in rows[:, 0]] == [r for r in stepping for _ in range(r + 1)]
        comm.end_step()
    assert comm.join() == comm.size - 1
    # A second epoch, even: every rank contributes again.
    assert comm.allreduce(np.ones(3, dtype=np.float64), name="even")[0] == comm.size
