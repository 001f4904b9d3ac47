"""One emulator process on a free loopback port, killed with its process group.

The GCS and Azure emulators (``gcp_storage_emulator``, ``azurite``) and the S3 servers of
the matrix (``s3_servers``: moto, rclone; ready once an S3 client lists buckets) share
this: each is a
child in its own session (so ``stop`` kills it and whatever it started), armed with the
parent-death signal on Linux (it dies with an interpreter killed without running atexit),
stopped at exit, its data in a private temporary directory, and ready once it answers HTTP.
"""

from __future__ import annotations

import atexit
import contextlib
import shutil
import socket
import subprocess
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Self

from testkit.seaweedfs import (
    SeaweedFSError,
    _parent_death_signal_hook,
    _retry_until,
    _terminate_group,
)

__all__ = ["EmulatorError", "EmulatorProcess", "free_port"]


class EmulatorError(SeaweedFSError):
    """An emulator could not be found or started (it names why, with its log's tail)."""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class EmulatorProcess:
    """Start ``command(root)`` on ``self.port``; ready when ``ready_path`` answers HTTP."""

    name = "emulator"
    #: A path whose GET must answer (any HTTP status counts: the server is up).
    ready_path = "/"

    def __init__(self, *, startup_timeout: float = 60.0) -> None:
        self._startup_timeout = startup_timeout
        self._process: subprocess.Popen[bytes] | None = None
        self._root: Path | None = None
        self._log: Path | None = None
        self.port = 0

    def command(self, root: Path) -> list[str]:
        raise NotImplementedError

    @property
    def endpoint_url(self) -> str:
        if self._process is None:
            raise EmulatorError(f"the {self.name} is not running; call start() first")
        return f"http://127.0.0.1:{self.port}"

    def log_tail(self, lines: int = 40) -> str:
        if self._log is None or not self._log.exists():
            return ""
        return "\n".join(self._log.read_text(errors="replace").splitlines()[-lines:])

    def start(self) -> Self:
        self._root = Path(tempfile.mkdtemp(prefix=f"rangestream-{self.name.split()[0]}-"))
        (self._root / "data").mkdir()
        self._log = self._root / "server.log"
        self.port = free_port()
        atexit.register(self.stop)
        with open(self._log, "wb") as log:
            self._process = subprocess.Popen(
                self.command(self._root / "data"),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=self._root,
                start_new_session=True,  # its own process group, killed whole by stop()
                preexec_fn=_parent_death_signal_hook(),
            )

        def exited() -> str | None:
            code = None if self._process is None else self._process.poll()
            return None if code is None else f"it exited with {code}:\n{self.log_tail()}"

        answers, done = self.readiness()
        try:
            _retry_until(
                answers,
                timeout=self._startup_timeout,
                what=f"the {self.name} on port {self.port}",
                alive=exited,
            )
        except BaseException:
            self.stop()
            raise
        finally:
            done()
        return self

    def readiness(self) -> tuple[Callable[[], None], Callable[[], None]]:
        """``(check, done)``: ``check`` raises until the server is up; ``done`` frees what
        it used. Here: any HTTP answer from ``ready_path``, whatever its status."""

        def answers() -> None:
            with contextlib.suppress(urllib.error.HTTPError):
                urllib.request.urlopen(self.endpoint_url + self.ready_path, timeout=2).close()

        return answers, lambda: None

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is not None:
            _terminate_group(process, 2.0)
        atexit.unregister(self.stop)
        if self._root is not None:
            shutil.rmtree(self._root, ignore_errors=True)
            self._root = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()
