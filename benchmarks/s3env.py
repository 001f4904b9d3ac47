"""The S3 side of a run: a local SeaweedFS server, the latency proxy in front, uploads.

Both come from the test kit (``testkit/`` at the repository root, the library's own test
infrastructure, not installed with it), so the benchmark and the tests measure against the
same server set-up and the same proxy. This module is also imported by workers under the
MosaicML interpreter, where rangestream is not installed: :class:`S3Endpoint` and
:func:`proxy_stats` use the standard library only, and ``testkit`` is imported only when the
orchestrator starts the environment.
"""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from benchmarks.config import REPO_ROOT

ACCESS_KEY = "benchaccesskey"
SECRET_KEY = "benchsecretkey0123456789"
REGION = "us-east-1"
BUCKET = "bench"
CONTROL_PREFIX = "/__proxy__"  # testkit.proxy.CONTROL_PREFIX
STATS_PATH = f"{CONTROL_PREFIX}/stats"


@dataclass(frozen=True)
class S3Endpoint:
    """How a client reaches the bucket; JSON-serialisable for worker subprocesses."""

    proxy_url: str  # through the latency proxy: what measured clients use
    direct_url: str  # the server itself: uploads and the fall-back for clients without proxy
    stats_url: str  # the proxy's counters
    bucket: str = BUCKET
    access_key: str = ACCESS_KEY
    secret_key: str = SECRET_KEY
    region: str = REGION
    latency_ms: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def control_url(self) -> str:
        """The proxy's own endpoints (counters, request log)."""
        return self.stats_url.removesuffix("/stats")

    def env(self, *, direct: bool = False) -> dict[str, str]:
        """Environment variables that point boto3-based clients at this endpoint."""
        url = self.direct_url if direct else self.proxy_url
        return {
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_DEFAULT_REGION": self.region,
            "AWS_REGION": self.region,
            "AWS_ENDPOINT_URL": url,
            "AWS_ENDPOINT_URL_S3": url,
            "S3_ENDPOINT_URL": url,  # MosaicML Streaming reads this one
            "AWS_EC2_METADATA_DISABLED": "true",
        }


def proxy_stats(stats_url: str) -> dict[str, Any]:
    """One snapshot of the proxy's counters (not counted by the proxy itself)."""
    with urllib.request.urlopen(stats_url, timeout=10) as resp:
        return json.loads(resp.read())


def _proxy_post(url: str) -> dict[str, Any]:
    request = urllib.request.Request(url, method="POST")
    with urllib.request.urlopen(request, timeout=60) as resp:
        return json.loads(resp.read())


class ProxyRecorder:
    """The proxy's request log, cut into phases (warm-up, then each timed repeat).

    :meth:`restart` drops what was logged so far; each :meth:`cut` appends the requests
    completed since the previous cut as one phase. A phase is a list of the proxy's entries
    (``testkit.request_log.LoggedRequest`` as JSON): the exact (key, byte range) sequence
    the S3 ceiling replays. Standard library only, for workers in any interpreter.
    """

    def __init__(self, endpoint: S3Endpoint) -> None:
        self._url = endpoint.control_url + "/log"
        self.phases: list[list[dict[str, Any]]] = []
        self.dropped = 0
        #: called with each phase, its windows and seconds right after it is cut (the S3
        #: ceiling's replay of that repeat); what it sends through the proxy is dropped
        self.after_cut: Callable[[list[dict[str, Any]], int, float], None] | None = None

    def start(self) -> None:
        _proxy_post(self._url + "/start")
        self.phases = []

    def restart(self) -> None:
        self._take()
        self.phases = []

    def cut(self, windows: int = 0, seconds: float = 0.0) -> None:
        phase = self._take()
        self.phases.append(phase)
        if self.after_cut is not None:
            self.after_cut(phase, windows, seconds)
            self._take()  # the replay's own GETs, and nothing of the system's repeats

    def stop(self) -> None:
        _proxy_post(self._url + "/stop")

    def _take(self) -> list[dict[str, Any]]:
        got = _proxy_post(self._url + "/take")
        self.dropped = int(got.get("dropped", 0))
        return list(got["requests"])


class S3Environment:
    """SeaweedFS plus the latency proxy, both from the test kit, for one run.

    The server is :class:`testkit.SeaweedFSServer` (the one the library's tests use); the
    proxy is :class:`testkit.LatencyProxy` started as its own process, from the repository
    root (``python -m testkit.proxy``), so that its CPU is not charged to the measured
    client and workers in any interpreter read its counters over HTTP.
    """

    def __init__(self, work_dir: Path, latency_ms: float) -> None:
        self.work_dir = work_dir
        self.latency_ms = latency_ms
        self._server: Any = None
        self._proxy: subprocess.Popen[bytes] | None = None
        self._proxy_log: Any = None
        self.endpoint: S3Endpoint | None = None

    def __enter__(self) -> S3Environment:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> S3Endpoint:
        from testkit import SeaweedFSServer

        self._server = SeaweedFSServer(
            access_key=ACCESS_KEY, secret_key=SECRET_KEY, region=REGION
        ).start()
        self._server.create_bucket(BUCKET)
        direct = self._server.endpoint_url
        self._proxy_log = open(self.work_dir / "proxy.log", "wb")  # noqa: SIM115 - closed in close()
        self._proxy = subprocess.Popen(
            [
                sys.executable, "-m", "testkit.proxy", "--upstream", direct,
                "--delay-ms", str(self.latency_ms), "--port", "0",
            ],
            stdout=subprocess.PIPE, stderr=self._proxy_log, cwd=REPO_ROOT,
            start_new_session=True,
        )  # fmt: skip
        assert self._proxy.stdout is not None
        line = self._proxy.stdout.readline().decode().strip()  # the bound endpoint, or EOF
        if not line.startswith("http"):
            raise RuntimeError(f"latency proxy did not start; see {self.work_dir / 'proxy.log'}")
        self.endpoint = S3Endpoint(
            proxy_url=line,
            direct_url=direct,
            stats_url=f"{line}{STATS_PATH}",
            latency_ms=self.latency_ms,
        )
        return self.endpoint

    def upload_dir(self, local: Path, prefix: str) -> int:
        """Upload every file under ``local`` to ``s3://bench/<prefix>/``; return bytes sent.

        Uploads go straight to the server: they are set-up, not measured.
        """
        assert self.endpoint is not None
        client = s3_client(self.endpoint.direct_url)
        total = 0
        for path in sorted(p for p in local.rglob("*") if p.is_file()):
            rel = path.relative_to(local).as_posix()
            if rel.startswith(".") or "/." in rel:
                continue  # harness markers (.prepared.json) are not part of the dataset
            client.upload_file(str(path), BUCKET, f"{prefix}/{rel}")
            total += path.stat().st_size
        return total

    def warm(self, prefix: str) -> int:
        """Read every object under ``prefix`` once, straight from the server.

        SeaweedFS answers the first GET of a freshly written object several hundred ms late
        (its filer/volume caches are cold); real S3 has no such first-touch cost. Touching
        every object once after upload keeps that server artefact out of every system's
        "first window" figure, equally for all.
        """
        assert self.endpoint is not None
        client = s3_client(self.endpoint.direct_url)
        n = 0
        paginator = client.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=BUCKET, Prefix=prefix):
            for obj in page.get("Contents", []):
                body = client.get_object(Bucket=BUCKET, Key=obj["Key"])["Body"]
                while body.read(1 << 20):
                    pass
                n += 1
        return n

    def close(self) -> None:
        if self._proxy is not None:
            if self._proxy.poll() is None:
                self._proxy.terminate()
                try:
                    self._proxy.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    self._proxy.kill()
                    self._proxy.wait(timeout=5)
            if self._proxy.stdout is not None:
                self._proxy.stdout.close()
            self._proxy = None
        if self._proxy_log is not None:
            self._proxy_log.close()
            self._proxy_log = None
        if self._server is not None:
            self._server.stop()
            self._server = None


def s3_client(url: str) -> Any:
    """A boto3 client for set-up work (bucket creation, uploads, listings)."""
    import boto3
    from botocore.config import Config

    return boto3.client(
        "s3",
        endpoint_url=url,
        aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=SECRET_KEY,
        region_name=REGION,
        config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 5}),
    )


def objects_bytes(url: str, prefix: str) -> tuple[int, int, int]:
    """(count, total bytes, largest object) under ``prefix``: shows the SeaweedFS piece risk."""
    client = s3_client(url)
    count = total = largest = 0
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix):
        for obj in page.get("Contents", []):
            count += 1
            total += obj["Size"]
            largest = max(largest, obj["Size"])
    return count, total, largest
