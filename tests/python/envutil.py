"""Test helper: run something with environment variables set, restoring them afterwards."""
import os


def with_env(env, make):
    """make() with the variables in `env` set (a value of None removes one), restored after."""
    saved = {k: os.environ.get(k) for k in env}
    try:
        for k, v in env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        return make()
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def import_torch():
    """torch, or the test (or module) skipped saying "torch is not installed" (ctest's skip regex).
    Under CONCORD_CI=1 (scripts/test.sh: scripts/setup.sh has installed python3-torch) a torch
    that cannot be imported fails instead, so a broken set-up is not a row of skips."""
    import pytest
    if os.environ.get("CONCORD_CI") != "1":
        return pytest.importorskip("torch", reason="torch is not installed for this Python "
                                   "(apt-get install python3-torch)")
    try:
        import torch
    except ImportError as e:
        pytest.fail("CONCORD_CI=1 and torch cannot be imported (%s): scripts/setup.sh installs "
                    "python3-torch" % e, pytrace=False)
    return torch
