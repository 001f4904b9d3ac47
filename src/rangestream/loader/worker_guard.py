"""Workers that die with the training process, whatever killed it.

A DataLoader worker that outlives its main process (``os._exit``, ``SIGKILL``, a crashed
``torchrun`` rank) blocks forever at exit: the queue's feeder thread waits to write into a
full pipe nobody reads, and ``python train.py | grep ...`` never finishes. Two guards,
installed first thing in every worker (before the user's ``worker_init_fn`` and before any
sample is read):

* on Linux, ``prctl(PR_SET_PDEATHSIG, SIGKILL)``: the kernel kills the worker the moment
  the process that started it ends (the main process, or the forkserver, which ends with
  it);
* everywhere, a daemon thread that checks every :data:`WATCH_SECONDS` whether the main
  process is gone (its parent changed, or the main pid no longer runs) and then leaves with
  ``os._exit``, which skips the feeder thread's join.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import signal
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["WATCH_SECONDS", "WorkerStart", "install_guards", "main_process_alive"]

WATCH_SECONDS = 0.5
"""How often a worker checks that its main process still lives."""

_PR_SET_PDEATHSIG = 1
_installed = False


def main_process_alive(main_pid: int, parent_pid: int) -> bool:
    """Whether the process ``main_pid`` runs and this process's parent is still
    ``parent_pid`` (a dead parent hands its children to another)."""
    if os.getppid() != parent_pid:
        return False
    try:
        os.kill(main_pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a killed process not yet reaped is a zombie: gone all the same
        with open(f"/proc/{main_pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return True


def _set_death_signal() -> None:
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def install_guards(main_pid: int) -> None:
    """Make this worker end with the main process ``main_pid`` (once per process)."""
    global _installed
    if _installed:
        return
    _installed = True
    parent_pid = os.getppid()
    _set_death_signal()
    if not main_process_alive(main_pid, parent_pid):  # died before the guard was set
        os._exit(1)

    def watch() -> None:
        stop = threading.Event()
        while not stop.wait(WATCH_SECONDS):
            if not main_process_alive(main_pid, parent_pid):
                os._exit(1)

    threading.Thread(target=watch, name="rangestream-parent-watch", daemon=True).start()


@dataclass(frozen=True)
class WorkerStart:
    """The loader's ``worker_init_fn``: the guards, then the user's own function.

    Picklable (a module-level class) so ``spawn`` and ``forkserver`` workers get it.
    """

    main_pid: int
    user_init: Callable[[int], Any] | None = None

    def __call__(self, worker_id: int) -> None:
        install_guards(self.main_pid)
        if self.user_init is not None:
            self.user_init(worker_id)
