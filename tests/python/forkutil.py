"""Test helper: run a function in a forked child, with a time limit."""
import os
import time


def in_forked_child(check, limit_s=20):
    """Forks; the child runs check() (which returns a list of failures as text), then the exit
    handlers sys.exit() would run, and exits. Returns (the child's wait status, its report), or
    (None, "did not exit") after killing a child still running after limit_s."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            import atexit
            os.close(read)
            failures = check()
            os.write(write, "\n".join(failures).encode())
            atexit._run_exitfuncs()  # they must not touch the parent's Concord engine
            code = 0
        finally:
            os._exit(code)
    os.close(write)
    deadline = time.monotonic() + limit_s
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            os.close(read)
            return None, "did not exit within %d s" % limit_s
        time.sleep(0.02)
    with os.fdopen(read) as f:
        return status, f.read()


def refused_in_child(failures, what, call, errors):
    """Appends to failures unless call() raises a ConcordError (errors: concord's) with status
    NOT_INITIALIZED saying this process was forked from its parent."""
    try:
        call()
        failures.append("%s did not raise" % what)
    except errors.ConcordError as e:
        if e.status != errors.Status.ERR_NOT_INITIALIZED or "forked" not in e.message or \
                str(os.getppid()) not in e.message:
            failures.append("%s raised %r" % (what, e))
