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
