"""Test helpers of the timeline tests: the job's world communicator, a directory every rank
writes into, and perf/concord-timeline. Import the fixtures into a test module to use them."""
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import pytest

import concord

TOOL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "perf",
                    "concord-timeline")


@pytest.fixture(scope="module")
def world():
    c = concord.Communicator()
    yield c
    c.finalize()


@pytest.fixture()
def shared_dir(world):
    """A directory every rank writes into (rank 0's, sent to the others), removed afterwards."""
    name = np.zeros(256, np.uint8)
    made = None
    if world.rank == 0:
        made = tempfile.mkdtemp(prefix="concord-timeline-")
        name[:len(made)] = np.frombuffer(made.encode(), np.uint8)
    name = world.broadcast(name, root=0, name="tl.dir")
    path = bytes(name).rstrip(b"\0").decode()
    yield path
    world.barrier()
    if made:
        shutil.rmtree(made)


def run_tool(*args):
    """perf/concord-timeline with `args`: (exit status, its output)."""
    r = subprocess.run([sys.executable, TOOL] + list(args), capture_output=True, text=True,
                       timeout=60)
    return r.returncode, r.stdout + r.stderr
