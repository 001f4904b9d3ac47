"""The targets of issue 30, from one run's results (a section of ``docs/benchmarks.md``).

At the server's ceiling on every read path (each row against its own GETs replayed right
after each of its repeats, ``benchmarks/s3_ceiling.py``), ahead of Amazon's S3 connector
for PyTorch on the token workloads both run, and the seed's own calls timed beside the
readers. Reported, not asserted: timings belong to the benchmark, not to tests.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

from benchmarks.measure import Measurement, WorkloadResult
from benchmarks.s3_ceiling import repeat_ratios

DASH = "\u2013"  # en dash, as in report.py
Rows = dict[str, list[WorkloadResult]]
Replays = dict[tuple[str, str, int], dict[str, Any]]


def _pick(
    rows: list[WorkloadResult], systems: tuple[str, ...], location: str, c: int | None = None
) -> tuple[WorkloadResult, Measurement] | None:
    """The fastest measurement of ``systems`` at ``location`` (and concurrency ``c``)."""
    cands = [
        (r, m)
        for r in rows
        if r.system in systems and r.location == location and r.status == "ok"
        for m in r.measurements
        if c is None or m.concurrency == c
    ]
    return max(cands, key=lambda rm: rm[1].windows_per_s) if cands else None


def _own(rm: tuple[WorkloadResult, Measurement] | None, replays: Replays) -> list[float]:
    if rm is None:
        return []
    r, m = rm
    rep = replays.get((r.system, r.workload, m.concurrency))
    if not rep or rep.get("error"):
        return []
    return repeat_ratios(rep, [float(x["rate"]) for x in m.samples])


def _spread(ratios: list[float]) -> str:
    med = statistics.median(ratios)
    return f"{med:.2f}x ({min(ratios):.2f}{DASH}{max(ratios):.2f} over repeats)"


def issue30_targets(by_w: Rows, replays: Replays, memmap: Callable[[list[Any]], Any]) -> list[str]:
    """One table row per target; ``memmap`` gives a workload's raw-memmap windows/s."""
    lines = [
        "",
        "### Issue 30: at the server's ceiling, ahead of s3torchconnector",
        "",
        "Ratios against a row's own GETs are per repeat (replayed right after it): median, "
        "range in brackets.",
        "",
        "| target | measured | met |",
        "|---|---|---|",
    ]

    def add(target: str, value: str | None, met: bool | None) -> None:
        flag = DASH if met is None else ("yes" if met else "**no**")
        lines.append(f"| {target} | {value if value is not None else 'not measured'} | {flag} |")

    def own_target(target: str, rm: Any, bound: float) -> None:
        ratios = _own(rm, replays)
        med = statistics.median(ratios) if ratios else None
        add(target, _spread(ratios) if ratios else None, med >= bound if med is not None else None)

    toks = by_w.get("tokens-random", [])
    for c in (16, 64):
        own_target(
            f"S3 token windows, {c} in flight: ≥ 0.9x own GETs replayed",
            _pick(toks, ("rangestream-async",), "s3", c),
            0.9,
        )
    temporal = by_w.get("temporal", [])
    mine = _pick(temporal, ("rangestream-async",), "s3", 16)
    own_target("S3 temporal windows, 16 in flight: ≥ 0.9x own GETs replayed", mine, 0.9)
    lit = _pick(temporal, ("litdata-window",), "s3", 16)
    add(
        "S3 temporal windows, 16 in flight: ≥ LitData `aread_window`",
        f"{mine[1].windows_per_s / lit[1].windows_per_s:.2f}x" if mine and lit else None,
        mine[1].windows_per_s >= lit[1].windows_per_s if mine and lit else None,
    )
    own_target(
        "S3 documents, 64 `read_many` in flight: ≥ 0.8x own GETs replayed",
        _pick(by_w.get("documents", []), ("rangestream-async",), "s3", 64),
        0.8,
    )
    shuffled = by_w.get("tokens-shuffled", [])
    block = _pick(shuffled, ("rangestream-loader-block",), "s3")
    own_target("S3 block-shuffled loader: ≥ 0.9x own GETs replayed", block, 0.9)
    bpb = block[1].bytes_per_payload_byte if block else None
    add(
        "block shuffle: bytes read per byte of data ≤ 1.2 (S3, 2 workers)",
        f"{bpb:.3f}" if bpb is not None else None,
        bpb <= 1.2 if bpb is not None else None,
    )
    pairs = [
        (
            f"tokens-random c={c}",
            _pick(toks, ("rangestream-async", "rangestream-sync"), "s3", c),
            _pick(toks, ("s3torch-map",), "s3", c),
        )
        for c in (1, 16, 64)
    ]
    pairs.append(
        (
            "tokens-shuffled (loaders)",
            _pick(shuffled, ("rangestream-loader", "rangestream-loader-block"), "s3"),
            _pick(shuffled, ("s3torch-map",), "s3"),
        )
    )
    seq = by_w.get("tokens-sequential", [])
    pairs.append(
        (
            "tokens-sequential (loaders)",
            _pick(seq, ("rangestream-loader",), "s3"),
            _pick(seq, ("s3torch-iterable",), "s3"),
        )
    )
    for name, rs, s3t in pairs:
        if not rs or not s3t:
            add(f"ahead of s3torchconnector, {name}", None, None)
            continue
        speed = rs[1].windows_per_s / s3t[1].windows_per_s
        a, b = rs[1].requests_per_window, s3t[1].requests_per_window
        fewer = a is not None and b is not None and a < b
        add(
            f"ahead of s3torchconnector, {name}: windows/s, and fewer requests per window",
            f"{speed:.2f}x windows/s ({rs[0].system}); requests/window "
            f"{a if a is None else f'{a:.3f}'} vs {b if b is None else f'{b:.3f}'}",
            speed > 1 and fewer,
        )
    base = memmap(temporal)
    seed = _pick(temporal, ("rangestream-dataset",), "local", 1)
    lit_local = _pick(temporal, ("litdata-window",), "local", 1)
    add(
        "seed's call `storage.read_window(r, start, frames, fields)`, local: ≥ 0.9x raw memmap",
        f"{seed[1].windows_per_s / base:.2f}x" if seed and base else None,
        seed[1].windows_per_s >= 0.9 * base if seed and base else None,
    )
    add(
        "seed's call `storage.read_window(...)`, local: ≥ 2x LitData `read_window`",
        f"{seed[1].windows_per_s / lit_local[1].windows_per_s:.2f}x"
        if seed and lit_local
        else None,
        seed[1].windows_per_s >= 2 * lit_local[1].windows_per_s if seed and lit_local else None,
    )
    tok_base = memmap(toks)
    ds = _pick(toks, ("rangestream-dataset",), "local", 1)
    add(
        "seed's call `StreamDataset(...).sync_reader()[i]`, local random tokens (vs raw memmap)",
        f"{ds[1].windows_per_s / tok_base:.2f}x" if ds and tok_base else None,
        None,
    )
    docs = by_w.get("documents", [])
    for name, rows, bound in (
        ("documents `read_many`", docs, 0.5),
        ("token windows", toks, 0.85),
        ("temporal windows", temporal, 0.85),
    ):
        b = memmap(rows)
        got = _pick(rows, ("rangestream-sync",), "local", 1)
        add(
            f"local {name} (sync reader) ≥ {bound}x raw memmap",
            f"{got[1].windows_per_s / b:.2f}x" if got and b else None,
            got[1].windows_per_s >= bound * b if got and b else None,
        )
    later = [
        (label, r.later_epoch_first_batch_s)
        for workload, system, label in (
            ("tokens-shuffled", "rangestream-loader-block", "block shuffle"),
            ("tokens-shuffled", "rangestream-loader", "per-window shuffle"),
            ("tokens-sequential", "rangestream-loader", "in order"),
        )
        for r in by_w.get(workload, [])
        if r.system == system and r.location == "s3" and r.status == "ok"
        if r.later_epoch_first_batch_s
    ]
    add(
        "first batch of every epoch after the first ≤ 100 ms over S3",
        "; ".join(
            f"{label}: at most {max(times) * 1e3:,.0f} ms over {len(times)} later epochs "
            f"(median {statistics.median(times) * 1e3:,.0f} ms)"
            for label, times in later
        )
        if later
        else None,
        all(max(times) <= 0.1 for _label, times in later) if later else None,
    )
    return lines
