"""Ctrl-C and SIGTERM reach pytest's main thread: threads the controller starts block them.

Python runs signal handlers in the main thread only, but the kernel hands a signal sent to
the process to any thread that does not block it.  When one of the controller's other
threads takes it (torch's, started at ``import torch``; the TCPStore's server thread), the
handler's flag is set while the main thread sleeps on in a blocking call (a test's
``time.sleep``, a wait on the ranks), and Ctrl-C or SIGTERM does nothing until that call
returns: the fault suite saw a SIGINT'ed run still asleep 60 s later.  A thread starts with
its creator's signal mask, so :func:`main_thread_only` blocks the two signals in the main
thread while such threads are started, and they keep them blocked.  No torch, no pytest.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

#: The signals a pytest run handles in Python (KeyboardInterrupt; the session's SIGTERM).
HANDLED = frozenset({signal.SIGINT, signal.SIGTERM})


@contextlib.contextmanager
def main_thread_only() -> Iterator[None]:
    """Threads started inside this block never take SIGINT or SIGTERM.  In the main thread,
    a signal that arrives meanwhile waits, and is handled as the block ends; elsewhere (or
    where threads have no signal masks) this does nothing."""
    if (threading.current_thread() is not threading.main_thread()
            or not hasattr(signal, "pthread_sigmask")):
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, HANDLED)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
