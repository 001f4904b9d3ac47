"""Watching processes from a test: whether one is gone, waiting for a file another writes."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

__all__ = ["assert_all_end_within", "free_port", "gone", "written"]


def gone(pid: int) -> bool:
    """Whether ``pid`` no longer runs (a zombie not yet reaped counts as gone); Linux."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()[0] in (b"Z", b"X")
    except FileNotFoundError:
        return True


def assert_all_end_within(pids: list[int], seconds: float, what: str) -> None:
    """Fail unless every process of ``pids`` ends within ``seconds``; kills any left over,
    so a failing test leaves nothing behind."""
    deadline = time.monotonic() + seconds
    while not all(gone(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    alive = [pid for pid in pids if not gone(pid)]
    for pid in alive:
        os.kill(pid, 9)
    assert alive == [], f"processes {alive} outlived {what} by more than {seconds} s"


def written(path: Path, timeout: float = 60) -> str:
    """``path``'s text once it exists (another process may still be on its way to write it;
    writers rename a finished file into place)."""
    deadline = time.monotonic() + timeout
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    return path.read_text()


def free_port() -> int:
    """A TCP port on the loopback nobody listens on now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])
