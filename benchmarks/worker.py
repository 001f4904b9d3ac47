"""Worker subprocess: prepare data for, or measure, one system at one location.

Two more modes serve the report's other sections: ``replay-service`` (the S3 ceiling,
``benchmarks/s3_ceiling.py``: a long-lived process the measuring workers hand each
repeat's GETs to, right after the repeat) and ``order`` (one loader's emitted order for the shuffle
quality, ``benchmarks/shuffle_quality.py``).

``python -m benchmarks.worker SPEC.json OUT.json`` (run by the orchestrator, possibly with
another interpreter such as the MosaicML virtualenv's). Results are written to OUT.json after
every workload, so a worker killed at its timeout still leaves what it finished.

This module and everything it imports must run under the MosaicML virtualenv too: standard
library and numpy only at import time; each system imports its own packages.
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from benchmarks.config import DATASET_OF_WORKLOAD, LOADER_WORKLOADS, RunConfig
from benchmarks.measure import (
    Cursor,
    WorkloadResult,
    dir_mb,
    peak_rss_mb,
    reset_peak_rss,
    timed_repeats,
    verify,
    verify_in_stream,
)
from benchmarks.s3_ceiling import InlineReplay, mean_in_flight, peak_in_flight, save_log
from benchmarks.s3env import ProxyRecorder, S3Endpoint, proxy_stats
from benchmarks.systems.base import Location, Support, System, Unavailable
from benchmarks.workloads import TokensData, load_dataset, load_windows

PREPARED_MARKER = ".prepared.json"  # written last: a family/dataset dir without it is redone


def _load_system(module: str, cls: str) -> System:
    return getattr(importlib.import_module(module), cls)()


def _write(out: Path, payload: dict[str, Any]) -> None:
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(payload, indent=1))
    os.replace(tmp, out)


def prepare(spec: dict[str, Any], out: Path) -> dict[str, Any]:
    """Write the system's format of every dataset it needs; skip those already prepared."""
    config = RunConfig.from_json(spec["config"])
    system = _load_system(spec["module"], spec["cls"])
    result: dict[str, Any] = {"system": system.name, "datasets": {}}
    try:
        system.check_available()
    except Unavailable as exc:
        result["unavailable"] = str(exc)
        return result
    data_key = config.data_key()
    for dataset in spec["datasets"]:
        target = Path(spec["prepared_root"]) / system.family / dataset
        marker = target / PREPARED_MARKER
        if marker.exists() and json.loads(marker.read_text()).get("data_key") == data_key:
            result["datasets"][dataset] = {"cached": True}
            continue
        if target.exists():
            shutil.rmtree(target)
        target.mkdir(parents=True)
        # every workload of the dataset, not only this run's: the marker outlives the run
        wanted = [w for w, ds in DATASET_OF_WORKLOAD.items() if ds == dataset]
        if not any(system.supports(w, loc) for w in wanted for loc in ("local", "s3")):
            marker.write_text(json.dumps({"data_key": data_key, "unsupported": True}))
            continue
        t0 = time.perf_counter()
        data = load_dataset(config.data_dir, dataset, config.sizes)
        system.prepare(data, target, config)
        seconds = time.perf_counter() - t0
        marker.write_text(json.dumps({"data_key": data_key, "seconds": seconds}))
        result["datasets"][dataset] = {"cached": False, "seconds": seconds}
        _write(out, result)
    return result


def _location(
    system: System,
    spec: dict[str, Any],
    kind: str,
    endpoint: S3Endpoint | None,
    dataset: str,
    tag: str,
) -> Location:
    """Where ``system`` reads ``dataset``, with a fresh, empty cache directory."""
    cache = Path(spec["cache_root"]) / f"{system.name}-{kind}-{tag}"
    if cache.exists():
        shutil.rmtree(cache)
    cache.mkdir(parents=True)
    return Location(
        kind=kind,
        local_dir=Path(spec["prepared_root"]) / system.family / dataset,
        cache_dir=cache,
        s3_url=(
            f"s3://{endpoint.bucket}/{spec['s3_prefix']}/{system.family}/{dataset}"
            if endpoint
            else None
        ),
        endpoint=endpoint,
    )


def _support(system: System, workload: str, kind: str) -> Support | None:
    """How ``system`` runs ``workload`` at ``kind``; loader workloads take only systems that
    return windows in an order of their own (shuffled DataLoaders)."""
    support = system.supports(workload, kind)
    if workload in LOADER_WORKLOADS and support is not None and not support.any_order:
        return None
    return support


def _prime(
    system: System,
    spec: dict[str, Any],
    config: RunConfig,
    kind: str,
    endpoint: S3Endpoint | None,
) -> float | None:
    """Open one dataset once and read a window, untimed, before any measured cold open.

    The first open in a process pays one-time costs (botocore loading its service models,
    thread pools, native runtimes) that the next open does not. Priming once per worker
    makes every workload's "first window" the same measurement: a cold dataset open with an
    empty cache, in a process whose libraries are initialised. Returns the priming time.
    """
    for workload in spec["workloads"]:
        if _support(system, workload, kind) is None:
            continue
        system.workload = workload
        dataset = DATASET_OF_WORKLOAD[workload]
        location = _location(system, spec, kind, endpoint, dataset, "prime")
        t0 = time.perf_counter()
        try:
            system.open(load_dataset(config.data_dir, dataset, config.sizes), location)
            system.fetch(load_windows(config.data_dir, workload, config.sizes), 0)
        except Exception:
            traceback.print_exc()  # the measured open will fail the same way and say so
            return None
        finally:
            try:
                system.close()
            finally:
                shutil.rmtree(location.cache_dir, ignore_errors=True)
        return time.perf_counter() - t0
    return None


def _replay_session(
    spec: dict[str, Any], recorder: ProxyRecorder | None, res: WorkloadResult, c: int
) -> InlineReplay | None:
    """The replay of this measurement's GETs after each of its repeats (S3 rows)."""
    address = spec.get("replay_service")
    if recorder is None or not address:
        return None
    meta = {
        "system": res.system,
        "label": res.label,
        "workload": res.workload,
        "concurrency": c,
        "own_concurrency": res.own_concurrency,
    }
    session = InlineReplay(address, meta)
    recorder.after_cut = session
    return session


def measure(spec: dict[str, Any], out: Path) -> dict[str, Any]:
    """Measure every requested workload of one system at one location."""
    config = RunConfig.from_json(spec["config"])
    system = _load_system(spec["module"], spec["cls"])
    location_kind: str = spec["location"]
    endpoint = S3Endpoint(**spec["endpoint"]) if spec.get("endpoint") else None
    results: list[dict[str, Any]] = []
    replays: list[dict[str, Any]] = []  # the S3 ceiling, one per measurement over S3
    report: dict[str, Any] = {"system": system.name, "results": results, "replays": replays}
    try:
        system.check_available()
    except Unavailable as exc:
        for workload in spec["workloads"]:
            results.append(
                WorkloadResult(
                    system=system.name,
                    label=system.label,
                    workload=workload,
                    location=location_kind,
                    status="unavailable",
                    error=str(exc),
                ).to_json()
            )
        return report
    prime_s = _prime(system, spec, config, location_kind, endpoint)
    for workload in spec["workloads"]:
        support = _support(system, workload, location_kind)
        system.workload = workload
        res = WorkloadResult(
            system=system.name, label=system.label, workload=workload, location=location_kind
        )
        if support is None:
            res.status = "unsupported"
            results.append(res.to_json())
            continue
        res.note, res.exact = support.note, support.exact
        res.own_concurrency = support.own_concurrency
        res.process_prime_s = prime_s
        dataset = DATASET_OF_WORKLOAD[workload]
        location = _location(system, spec, location_kind, endpoint, dataset, workload)
        cache = location.cache_dir
        stats: Any = (lambda: proxy_stats(endpoint.stats_url)) if endpoint else None
        if stats is None and system.io_counters() is not None:
            stats = system.io_counters  # the library's own counts (local rows)
        # over S3 the proxy logs every request, for the ceiling's replay of this sequence
        recorder = ProxyRecorder(endpoint) if endpoint else None
        try:
            data = load_dataset(config.data_dir, dataset, config.sizes)
            windows = load_windows(config.data_dir, workload, config.sizes)
            reset_peak_rss()
            s0 = stats() if stats else None
            t0 = time.perf_counter()
            system.open(data, location)
            system.fetch(windows, 0)
            res.ttfw_s = time.perf_counter() - t0
            if stats and s0:
                res.open_requests = int(stats()["requests"] - s0["requests"])
            if support.any_order:
                assert isinstance(data, TokensData)
                res.verified = verify_in_stream(
                    lambda i, w=windows: system.fetch(w, i),
                    data,
                    windows,
                    config.budget.verify_windows,
                    support.exact,
                )
            else:
                res.verified = verify(
                    lambda i, w=windows: system.fetch(w, i),
                    lambda i, d=data, w=windows: system.truth(d, w, i),
                    windows,
                    config.budget.verify_windows,
                )
            cursor = Cursor(windows.count, start=1)
            if recorder is not None:
                recorder.start()
            for c in config.concurrency:
                if c not in support.concurrency:
                    continue
                session = _replay_session(spec, recorder, res, c)
                m = timed_repeats(
                    lambda ids, cc, w=windows: system.read(w, ids, cc),
                    windows,
                    cursor,
                    c,
                    config.budget,
                    stats,
                    recorder,
                )
                if session is not None:
                    recorder.after_cut = None  # type: ignore[union-attr]
                    replays.append(session.finish())
                if recorder is not None:
                    log = Path(spec["gets_root"]) / f"{system.name}-{workload}-c{c}.json"
                    save_log(log, recorder.phases, {"dropped": recorder.dropped})
                    m.get_log = str(log)
                    timed = [e for phase in recorder.phases[1:] for e in phase]
                    m.peak_in_flight = peak_in_flight(timed)
                    m.mean_in_flight = mean_in_flight(
                        timed, sum(float(s["seconds"]) for s in m.samples)
                    )
                res.measurements.append(m)
                _write(out, {**report, "results": [*results, res.to_json()]})
            res.peak_rss_mb = peak_rss_mb()
            res.disk_mb = dir_mb(cache)
            res.later_epoch_first_batch_s = system.later_epoch_first_batches()
        except Exception as exc:  # reported in the table, never hidden
            res.status = "error"
            where = traceback.extract_tb(exc.__traceback__)[-1]
            res.error = (
                f"{type(exc).__name__}: {exc} (at {Path(where.filename).name}:{where.lineno} "
                f"in {where.name})"
            )
            res.peak_rss_mb = peak_rss_mb()
            traceback.print_exc()
        finally:
            try:
                system.close()
            except Exception:
                traceback.print_exc()
            if recorder is not None:
                try:
                    recorder.stop()
                except Exception:
                    traceback.print_exc()
            shutil.rmtree(cache, ignore_errors=True)
        results.append(res.to_json())
        _write(out, report)
    return report


def main(argv: list[str]) -> int:
    spec_path, out_path = Path(argv[0]), Path(argv[1])
    spec = json.loads(spec_path.read_text())
    if spec["mode"] == "replay-service":
        from benchmarks.s3_ceiling import serve

        result = serve(spec, lambda partial: _write(out_path, partial))
    elif spec["mode"] == "order":
        from benchmarks.shuffle_quality import emit

        result = emit(spec["name"], spec["tokens"], spec["epochs"], Path(spec["work"]))
    else:
        result = prepare(spec, out_path) if spec["mode"] == "prepare" else measure(spec, out_path)
    _write(out_path, result)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
