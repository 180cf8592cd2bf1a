"""Test helper: Ctrl-C (SIGINT) while a wait blocks."""
import os
import signal
import threading
import time


def interrupted_wait(wait, after_s=0.3, within_s=2.5):
    """Calls wait() on the main thread with SIGINT sent to this process after_s seconds in. Returns
    the failures as text: wait() returned instead of raising KeyboardInterrupt, or ended more than
    within_s seconds after the signal."""
    failures = []
    timer = threading.Timer(after_s, os.kill, (os.getpid(), signal.SIGINT))
    began = time.monotonic()
    timer.start()
    try:
        wait()
        failures.append("wait() returned instead of raising")
    except KeyboardInterrupt:
        pass
    finally:
        timer.cancel()
    waited = time.monotonic() - began
    if waited > after_s + within_s:
        failures.append("wait() ended %.2f s after it began" % waited)
    return failures
