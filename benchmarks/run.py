"""The orchestrator behind ``python -m benchmarks run``.

Order of work: generate data (cached) -> prepare each family's format (one worker per family,
cached) -> start SeaweedFS and the latency proxy -> upload prepared data -> one measuring
worker per system and location (over S3 the proxy logs each system's GETs, and a replay
service started with the S3 server replays each timed repeat's GETs with the lean clients
right after that repeat: the S3 ceiling, see ``benchmarks/s3_ceiling.py``) -> one worker
per shuffled loader emitting its order (shuffle quality,
``benchmarks/shuffle_quality.py``) -> write results JSON, ``docs/benchmarks.md`` and the plot.

Workers are subprocesses with timeouts, killed as a process group when late, and the whole
run has a deadline: on a 2-core machine shared with the S3 server, one hung peer must not
take the run (or the other peers' figures) with it.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks import environment
from benchmarks.config import DATASET_OF_WORKLOAD, REPO_ROOT, WORK_DIR, RunConfig
from benchmarks.machine import machine_info
from benchmarks.measure import WorkloadResult
from benchmarks.s3env import S3Environment, objects_bytes
from benchmarks.systems import REGISTRY, SystemEntry
from benchmarks.worker import PREPARED_MARKER
from benchmarks.workloads import generate


@dataclass
class WorkerOutcome:
    """What came back from one worker subprocess."""

    returncode: int | None  # None: killed at its timeout
    seconds: float
    result: dict[str, Any]
    log: Path


def _log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def _python_for(interpreter: str) -> Path | None:
    if interpreter == "mosaic":
        p = environment.mosaic_python()
        return p if p.exists() else None
    return Path(sys.executable)


def _worker_env(interpreter: str, extra: dict[str, str]) -> dict[str, str]:
    env = dict(os.environ)
    paths = [str(REPO_ROOT)]
    if interpreter == "main":
        paths.append(str(REPO_ROOT / "src"))  # rangestream importable without installing it
    env["PYTHONPATH"] = os.pathsep.join([*paths, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["PYTHONUNBUFFERED"] = "1"
    env["TOKENIZERS_PARALLELISM"] = "false"
    env.update(extra)
    return env


def run_worker(
    interpreter: str, spec: dict[str, Any], tag: str, timeout: float, extra_env: dict[str, str]
) -> WorkerOutcome:
    """Run one worker; on timeout kill its whole process group and keep its partial output."""
    d = WORK_DIR / "workers"
    d.mkdir(parents=True, exist_ok=True)
    spec_path, out_path, log = d / f"{tag}.spec.json", d / f"{tag}.out.json", d / f"{tag}.log"
    out_path.unlink(missing_ok=True)
    spec_path.write_text(json.dumps(spec, indent=1))
    python = _python_for(interpreter)
    assert python is not None
    t0 = time.perf_counter()
    with open(log, "wb") as logf:
        proc = subprocess.Popen(
            [str(python), "-m", "benchmarks.worker", str(spec_path), str(out_path)],
            cwd=REPO_ROOT,
            env=_worker_env(interpreter, extra_env),
            stdout=logf,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            rc: int | None = proc.wait(timeout=max(timeout, 1))
        except subprocess.TimeoutExpired:
            rc = None
            for sig in (signal.SIGTERM, signal.SIGKILL):
                try:
                    os.killpg(proc.pid, sig)
                    proc.wait(timeout=10)
                    break
                except (ProcessLookupError, subprocess.TimeoutExpired):
                    continue
    result = json.loads(out_path.read_text()) if out_path.exists() else {}
    return WorkerOutcome(rc, time.perf_counter() - t0, result, log)


def _tail(path: Path, lines: int = 3) -> str:
    try:
        return " | ".join(path.read_text(errors="replace").strip().splitlines()[-lines:])
    except OSError:
        return ""


class Orchestrator:
    """One benchmark run, from data generation to the written report."""

    def __init__(self, config: RunConfig, command: str, deadline_s: float) -> None:
        self.config = config
        self.command = command
        self.deadline = time.monotonic() + deadline_s
        self.results: list[WorkloadResult] = []
        self.replays: list[dict[str, Any]] = []  # the S3 ceiling (s3_ceiling.ReplaySession)
        self.replay_address: str | None = None  # the replay service, once started
        self.shuffle: dict[str, Any] | None = None  # shuffle_quality.quality
        self.notes: list[str] = []
        self.uploads: dict[str, dict[str, Any]] = {}
        # 1-minute load average around each measuring worker: on a small shared machine,
        # other work competing for the cores is part of reading the figures.
        self.load: list[dict[str, Any]] = []
        entries = REGISTRY
        if config.systems:
            wanted = set(config.systems)
            entries = tuple(e for e in REGISTRY if e.name in wanted)
        elif config.quick:
            entries = tuple(e for e in REGISTRY if e.in_quick)
        self.entries = entries

    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    def _base_spec(self, entry: SystemEntry, mode: str) -> dict[str, Any]:
        return {
            "mode": mode,
            "module": entry.module,
            "cls": entry.cls,
            "config": self.config.to_json(),
            "prepared_root": str(self.config.prepared_dir),
            "cache_root": str(WORK_DIR / "cache"),
            "gets_root": str(self.gets_dir),
        }

    @property
    def gets_dir(self) -> Path:
        """The request logs of this run's S3 measurements (the ceiling replays them)."""
        return WORK_DIR / "gets" / self.config.tag

    def _datasets(self) -> list[str]:
        return sorted({DATASET_OF_WORKLOAD[w] for w in self.config.workloads})

    def _prepared(self, family: str) -> bool:
        """Whether every dataset of ``family`` is prepared for the current data (no worker)."""
        key = self.config.data_key()
        for ds in self._datasets():
            marker = self.config.prepared_dir / family / ds / PREPARED_MARKER
            try:
                if json.loads(marker.read_text()).get("data_key") != key:
                    return False
            except (OSError, ValueError):
                return False
        return True

    def _mark_all(self, entry: SystemEntry, location: str, status: str, error: str) -> None:
        for w in self.config.workloads:
            self.results.append(
                WorkloadResult(
                    system=entry.name,
                    label=entry.name,
                    workload=w,
                    location=location,
                    status=status,
                    error=error,
                )
            )

    # ------------------------------------------------------------------ phases

    def prepare(self) -> dict[str, str]:
        """Prepare each family once; return {family: reason} for families that cannot run."""
        unavailable: dict[str, str] = {}
        done: set[str] = set()
        for entry in self.entries:
            if entry.family in done:
                continue
            done.add(entry.family)
            if _python_for(entry.interpreter) is None:
                unavailable[entry.family] = (
                    "MosaicML virtualenv missing (python -m benchmarks setup)"
                )
                continue
            if self._prepared(entry.family):
                continue
            spec = {**self._base_spec(entry, "prepare"), "datasets": self._datasets()}
            _log(f"prepare {entry.family}")
            out = run_worker(
                entry.interpreter,
                spec,
                f"prepare-{entry.family}",
                min(self.config.budget.prepare_timeout_s, max(self.remaining(), 1)),
                {},
            )
            if "unavailable" in out.result:
                unavailable[entry.family] = out.result["unavailable"]
            elif out.returncode != 0:
                unavailable[entry.family] = (
                    f"prepare {'timed out' if out.returncode is None else 'failed'}: "
                    f"{_tail(out.log)}"
                )
            else:
                for ds, info in out.result.get("datasets", {}).items():
                    if not info.get("cached"):
                        _log(f"  {entry.family}/{ds}: {info.get('seconds', 0):.1f} s")
        return unavailable

    def measure(self, unavailable: dict[str, str], s3: S3Environment | None) -> None:
        budget = self.config.budget
        for location in ("local", "s3"):
            for entry in self.entries:
                if location not in entry.locations:
                    continue
                if entry.family in unavailable:
                    self._mark_all(entry, location, "unavailable", unavailable[entry.family])
                    continue
                if location == "s3" and (s3 is None or s3.endpoint is None):
                    self._mark_all(entry, location, "unavailable", "S3 server not started")
                    continue
                timeout = min(budget.worker_timeout_s, self.remaining())
                if timeout < 10:
                    self._mark_all(entry, location, "skipped", "run deadline reached")
                    continue
                spec = {
                    **self._base_spec(entry, "measure"),
                    "location": location,
                    "workloads": list(self.config.workloads),
                    "endpoint": s3.endpoint.to_json() if location == "s3" and s3 else None,
                    "s3_prefix": self.config.tag,
                    "replay_service": self.replay_address if location == "s3" else None,
                }
                env = s3.endpoint.env() if location == "s3" and s3 and s3.endpoint else {}
                _log(f"measure {entry.name} @ {location} (timeout {timeout:.0f} s)")
                load_before = os.getloadavg()[0]
                out = run_worker(
                    entry.interpreter, spec, f"measure-{entry.name}-{location}", timeout, env
                )
                self.load.append(
                    {
                        "worker": f"{entry.name}@{location}",
                        "load1_before": load_before,
                        "load1_after": os.getloadavg()[0],
                    }
                )
                got = [WorkloadResult.from_json(r) for r in out.result.get("results", [])]
                seen = {r.workload for r in got}
                for r in got:
                    _log(f"  {r.workload}: {r.status} {_brief(r)}")
                self.results.extend(got)
                for rep in out.result.get("replays", []):
                    self.replays.append(rep)
                    where = f"{rep['system']} {rep['workload']} c={rep['concurrency']}"
                    _log(f"  replay {where}: {_brief_replay(rep)}")
                for w in self.config.workloads:
                    if w in seen:
                        continue
                    status = "timeout" if out.returncode is None else "error"
                    self.results.append(
                        WorkloadResult(
                            system=entry.name,
                            label=entry.name,
                            workload=w,
                            location=location,
                            status=status,
                            error=f"worker {status} after {out.seconds:.0f} s: {_tail(out.log)}",
                        )
                    )
                    _log(f"  {w}: {status}")

    def start_replay_service(self, s3: S3Environment) -> None:
        """The S3 ceiling's replayer: a process of its own (this interpreter, with the lean
        clients) that each measuring worker hands every repeat's GETs to, right after the
        repeat (``benchmarks/s3_ceiling.py``)."""
        assert s3.endpoint is not None
        d = WORK_DIR / "workers"
        d.mkdir(parents=True, exist_ok=True)
        port_file, log = d / "replay-service.port", d / "replay-service.log"
        port_file.unlink(missing_ok=True)
        spec = {
            "mode": "replay-service",
            "endpoint": s3.endpoint.to_json(),
            "objects_root": str(WORK_DIR / "prepared"),
            "port_file": str(port_file),
        }
        spec_path = d / "replay-service.spec.json"
        spec_path.write_text(json.dumps(spec, indent=1))
        self._replay_log = open(log, "wb")  # noqa: SIM115 (open for the service's lifetime)
        self._replayer = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.worker", str(spec_path), str(d / "replay.out")],
            cwd=REPO_ROOT,
            env=_worker_env("main", {}),
            stdout=self._replay_log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        for _ in range(600):
            if port_file.exists() and port_file.read_text().strip():
                self.replay_address = f"127.0.0.1:{port_file.read_text().strip()}"
                return
            if self._replayer.poll() is not None:
                break
            time.sleep(0.05)
        self.notes.append(f"S3 ceiling: the replay service did not start: {_tail(log)}")

    def stop_replay_service(self) -> None:
        proc = getattr(self, "_replayer", None)
        if proc is None:
            return
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=10)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        self._replay_log.close()
        self._replayer = None

    def shuffle_quality(self) -> None:
        """Each shuffled loader emits its order; one function computes the figures."""
        from benchmarks.shuffle_quality import ORDERS, quality

        sizes = self.config.shuffle
        assert sizes is not None
        work = WORK_DIR / "shuffle" / self.config.tag
        shutil.rmtree(work / "orders", ignore_errors=True)
        errors: dict[str, str] = {}
        for order in ORDERS:
            if _python_for(order.interpreter) is None:
                errors[order.name] = "MosaicML virtualenv missing (python -m benchmarks setup)"
                continue
            timeout = min(self.config.budget.prepare_timeout_s, self.remaining())
            if timeout < 10:
                errors[order.name] = "run deadline reached"
                continue
            spec = {
                "mode": "order",
                "name": order.name,
                "tokens": sizes.tokens,
                "epochs": sizes.epochs,
                "work": str(work),
            }
            out = run_worker(order.interpreter, spec, f"order-{order.name}", timeout, {})
            if out.returncode != 0:
                status = "timed out" if out.returncode is None else "failed"
                errors[order.name] = f"{status}: {_tail(out.log)}"
            _log(f"order {order.name}: {errors.get(order.name, 'ok')} ({out.seconds:.0f} s)")
        self.shuffle = quality(sizes.tokens, sizes.epochs, work, errors)

    def upload(self, s3: S3Environment, unavailable: dict[str, str]) -> None:
        done: set[str] = set()
        assert s3.endpoint is not None
        for entry in self.entries:
            if "s3" not in entry.locations or entry.family in unavailable:
                continue
            if entry.family in done:
                continue
            done.add(entry.family)
            for ds in self._datasets():
                local = self.config.prepared_dir / entry.family / ds
                if not local.exists():
                    continue
                prefix = f"{self.config.tag}/{entry.family}/{ds}"
                t0 = time.perf_counter()
                sent = s3.upload_dir(local, prefix)
                count, _total, largest = objects_bytes(s3.endpoint.direct_url, prefix + "/")
                s3.warm(prefix + "/")
                self.uploads[prefix] = {"objects": count, "bytes": sent, "largest": largest}
                _log(
                    f"upload {prefix}: {count} objects, {sent / 2**20:.1f} MiB, largest "
                    f"{largest / 2**20:.2f} MiB, {time.perf_counter() - t0:.1f} s"
                )

    def run(self) -> Path:
        t0 = time.perf_counter()
        _log(f"data ({self.config.tag})")
        if self.config.workloads:
            generate(self.config)
        shutil.rmtree(self.gets_dir, ignore_errors=True)
        unavailable = self.prepare() if self.config.workloads else {}
        needs_s3 = bool(self.config.workloads) and any(
            "s3" in e.locations and e.family not in unavailable for e in self.entries
        )
        s3: S3Environment | None = None
        try:
            if needs_s3:
                _log("start SeaweedFS + latency proxy")
                s3 = S3Environment(WORK_DIR, self.config.latency_ms)
                try:
                    s3.start()
                    self.upload(s3, unavailable)
                except Exception as exc:
                    self.notes.append(f"S3 set-up failed: {exc}")
                    s3.close()
                    s3 = None
            if s3 is not None:
                self.start_replay_service(s3)
            if self.config.workloads:
                self.measure(unavailable, s3)
        finally:
            self.stop_replay_service()
            if s3 is not None:
                s3.close()
        if self.config.shuffle is not None:
            self.shuffle_quality()
        elapsed = time.perf_counter() - t0
        return self._save(elapsed)

    def _save(self, elapsed: float) -> Path:
        payload = {
            "command": self.command,
            "config": self.config.to_json(),
            "machine": machine_info(environment.mosaic_python()),
            "install": environment.describe_commands(),
            "elapsed_s": elapsed,
            "uploads": self.uploads,
            "load": self.load,
            "notes": self.notes,
            "results": [r.to_json() for r in self.results],
            "replays": self.replays,
            "shuffle_quality": self.shuffle,
        }
        path = WORK_DIR / f"results-{self.config.tag}.json"
        path.write_text(json.dumps(payload, indent=1))
        return path


def _brief_replay(rep: dict[str, Any]) -> str:
    from benchmarks.s3_ceiling import CLIENTS, replay_rate

    if rep.get("error"):
        return f"error: {rep['error'][:160]}"
    if not sum(rep.get("gets", [])):
        return "no GETs in the timed repeats"
    rates = ", ".join(
        f"{c} {rate:,.0f}/s" for c in CLIENTS if (rate := replay_rate(rep, c)) is not None
    )
    lanes = rep["lanes"] if isinstance(rep["lanes"], int) else max(rep["lanes"], default=0)
    return f"{sum(rep['gets'])} GETs, {lanes} lanes: {rates} verified={rep['verified']}"


def _brief(r: WorkloadResult) -> str:
    if r.status != "ok":
        return r.error[:160]
    parts = [f"c={m.concurrency}: {m.windows_per_s:,.0f}/s" for m in r.measurements]
    ttfw = f"ttfw {r.ttfw_s * 1000:.0f} ms" if r.ttfw_s is not None else ""
    return f"{', '.join(parts)} {ttfw} verified={r.verified}"
