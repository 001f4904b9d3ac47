"""Write ``docs/benchmarks.md`` and ``docs/benchmarks.png`` from a run's results JSON.

Every number printed comes from the results file; the text around them only says what was
measured and how. Ratios are taken against the physical limit of the same workload: raw
numpy memmap slicing on local disk, and over S3 the system's own GETs replayed by the better
of two lean clients at the same concurrency (``benchmarks/s3_ceiling.py``), so the table
reads as "how close to the limit", not as raw speed.
"""

from __future__ import annotations

import importlib.util
import json
import math
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from benchmarks import shuffle_quality
from benchmarks.config import (
    DOCS_DIR,
    LOADER_BATCH,
    LOADER_WORKERS,
    LOADER_WORKLOADS,
    OBJECT_BYTES,
    WORKLOADS,
)
from benchmarks.ingest import RESULTS as INGEST_RESULTS
from benchmarks.ingest import VOCAB_SIZE
from benchmarks.measure import LANE_WINDOWS, Measurement, WorkloadResult
from benchmarks.report_targets import issue30_targets
from benchmarks.s3_ceiling import CLIENTS, best_replay, repeat_ratios, replay_rate
from benchmarks.workloads import TOKEN_DTYPE

LOCAL_BASELINE = "raw-memmap"
LOADER_TABLE_WORKLOADS = ("tokens-sequential", *LOADER_WORKLOADS)  # where DataLoader rows run
LOADER_PEER = "litdata-loader"  # the loader the other loader rows are compared with
EPOCH_TOKENS = 10**12  # issue 20 prices a shuffled epoch of this many tokens
S3_GET_PRICE = 0.40 / 1e6  # USD per GET, S3 Standard list price
# Loaders whose adapter times its cold open together with the first batch out of the loader;
# the others' "first window" is a dataset item read before any loader exists.
FIRST_BATCH_TIMED = ("rangestream-loader", "litdata-loader")  # and their variants

DASH = "\u2013"  # en dash: "no value" in the tables, and ranges

WORKLOAD_TITLES = {
    "tokens-random": "Token windows, random order",
    "tokens-sequential": "Token windows, sequential order",
    "tokens-shuffled": "Token windows, a shuffled epoch through the DataLoaders",
    "temporal": "Temporal windows (64 frames of features + pose)",
    "documents": "Documents, random read_many batches",
}


SHORT_TITLES = {
    "tokens-random": "token windows, random",
    "tokens-sequential": "token windows, sequential",
    "tokens-shuffled": "token windows, shuffled loaders",
    "temporal": "temporal windows (features + pose)",
    "documents": "document batches (read_many)",
}


def _fmt(x: float | None, digits: int = 0) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return DASH
    if digits == 0:
        return f"{x:,.0f}"
    return f"{x:,.{digits}f}"


def _ratio(x: float, base: float | None) -> str:
    if not base:
        return DASH
    return f"{x / base:.2f}x"


def _by_workload(results: list[WorkloadResult]) -> dict[str, list[WorkloadResult]]:
    out: dict[str, list[WorkloadResult]] = defaultdict(list)
    for r in results:
        out[r.workload].append(r)
    return out


def _baseline_local(rows: list[WorkloadResult]) -> float | None:
    for r in rows:
        if r.system == LOCAL_BASELINE and r.status == "ok" and r.measurements:
            return r.measurements[0].windows_per_s
    return None


Replays = dict[tuple[str, str, int], dict[str, Any]]


def _replays(data: dict[str, Any]) -> Replays:
    """The S3 ceiling's replays by (system, workload, concurrency)."""
    return {
        (r["system"], r["workload"], int(r["concurrency"])): r for r in data.get("replays") or []
    }


def _repeat_ratios(r: WorkloadResult, m: Measurement, replays: Replays) -> list[float]:
    """Repeat by repeat, the system's windows/s over its own GETs' faster replay of that
    repeat (replayed right after it)."""
    replay = replays.get((r.system, r.workload, m.concurrency))
    if not replay or replay.get("error"):
        return []
    return repeat_ratios(replay, [float(x["rate"]) for x in m.samples])


def _replay_ratio(r: WorkloadResult, m: Measurement, replays: Replays) -> float | None:
    """The median over repeats of the per-repeat ratio to the replay, or None without one."""
    ratios = _repeat_ratios(r, m, replays)
    return statistics.median(ratios) if ratios else None


def _ratio_cell(r: WorkloadResult, m: Measurement, replays: Replays) -> str:
    """E.g. ``0.91x (0.85-0.97)``: the per-repeat ratios' median and range."""
    ratios = _repeat_ratios(r, m, replays)
    if not ratios:
        return DASH
    return f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}{DASH}{max(ratios):.2f})"


def _check(r: WorkloadResult, m: Measurement | None) -> str:
    if r.verified is None:
        return DASH
    mark = "exact" if r.exact else "equiv."
    # Bytes returned must equal the windows' payload for exact systems; equivalent jobs may
    # return other amounts by design (whole aligned blocks, whole records).
    ok = r.verified and not (m and m.payload_mismatch and r.exact)
    return f"{mark} ✓" if ok else f"{mark} ✗ MISMATCH"


def _table(rows: list[WorkloadResult], notes: dict[str, int], replays: Replays) -> list[str]:
    base = _baseline_local(rows)
    out = [
        f"| system | where | conc. | windows/s median (min{DASH}max) | vs limit | requests /window "
        "| bytes fetched /payload byte | first window (cold) | client CPU µs /window "
        "| peak RSS MB | cache MB | check |",
        "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|",
    ]
    order = {"local": 0, "s3": 1}
    for r in sorted(rows, key=lambda r: (order.get(r.location, 2), r.system)):
        ref = ""
        if r.note:
            key = f"{r.label}: {r.note}"
            notes.setdefault(key, len(notes) + 1)
            ref = f" [{notes[key]}]"
        name = f"{r.label}{ref}"
        if r.status != "ok" or not r.measurements:
            reason = r.error or r.status
            if r.status == "unsupported":
                continue
            key = f"{r.label} ({r.location}): {r.status}: {reason}"
            notes.setdefault(key, len(notes) + 1)
            out.append(
                f"| {r.label} [{notes[key]}] | {r.location} | {DASH} | **{r.status}** "
                + f"| {DASH} " * 8
                + "|"
            )
            continue
        for m in r.measurements:
            if r.location == "local":
                vs = _ratio(m.windows_per_s, base) + " memmap" if base else DASH
            else:
                own = _ratio_cell(r, m, replays)
                vs = f"{own} own GETs" if own != DASH else DASH
            ttfw = f"{r.ttfw_s * 1000:,.1f} ms" if r.ttfw_s is not None else DASH
            if r.open_requests is not None:
                ttfw += f" ({r.open_requests} req)"
            out.append(
                "| "
                + " | ".join(
                    [
                        name,
                        r.location,
                        str(m.concurrency),
                        f"{_fmt(m.windows_per_s)} ({_fmt(m.windows_per_s_min)}{DASH}"
                        f"{_fmt(m.windows_per_s_max)})",
                        vs,
                        _fmt(m.requests_per_window, 3),
                        _fmt(m.bytes_per_payload_byte, 3),
                        ttfw,
                        _fmt(m.cpu_us_per_window, 1),
                        _fmt(r.peak_rss_mb),
                        _fmt(r.disk_mb, 1),
                        _check(r, m),
                    ]
                )
                + " |"
            )
    return out


def _targets(by_w: dict[str, list[WorkloadResult]], replays: Replays) -> list[str]:
    """The targets of issue #6 / #4, with the rangestream figures where they exist."""

    def best(rows: list[WorkloadResult], prefix: str, location: str, c: int | None = None):
        cands = [
            (m, r)
            for r in rows
            if r.system.startswith(prefix) and r.location == location and r.status == "ok"
            for m in r.measurements
            if c is None or m.concurrency == c
        ]
        return max(cands, key=lambda mr: mr[0].windows_per_s) if cands else (None, None)

    lines = ["| target | measured | met |", "|---|---|---|"]

    def add(target: str, value: str | None, met: bool | None) -> None:
        shown = value if value is not None else "not measured (rangestream not available)"
        flag = DASH if met is None else ("yes" if met else "**no**")
        lines.append(f"| {target} | {shown} | {flag} |")

    rows = by_w.get("tokens-random", [])
    base = _baseline_local(rows)
    m, _ = best(rows, "rangestream", "local")
    add(
        "local random token windows ≥ 0.5x raw memmap",
        f"{m.windows_per_s / base:.2f}x" if m and base else None,
        (m.windows_per_s / base >= 0.5) if m and base else None,
    )
    m, _ = best(rows, "rangestream-dataset", "local", 1)
    add(
        "local random token windows through the path users call, "
        "`StreamDataset(...).sync_reader()[i]`, ≥ 0.8x raw memmap",
        f"{m.windows_per_s / base:.2f}x" if m and base else None,
        (m.windows_per_s / base >= 0.8) if m and base else None,
    )
    m, r = best(rows, "rangestream", "s3")
    # a window crossing a block boundary may cost one more request: allow that share
    crossing = 2 * 2049 * 4 / OBJECT_BYTES
    add(
        f"S3 random token windows: 1.0 request per window (+ ≤ {crossing:.3f} for windows "
        "crossing a block boundary)",
        _fmt(m.requests_per_window, 3) if m else None,
        (m.requests_per_window is not None and m.requests_per_window <= 1.0 + crossing)
        if m
        else None,
    )
    add(
        "S3 random token windows: ≤ 1.2 bytes fetched per payload byte",
        _fmt(m.bytes_per_payload_byte, 3) if m else None,
        (m.bytes_per_payload_byte is not None and m.bytes_per_payload_byte <= 1.2) if m else None,
    )
    add(
        "S3 random token windows: first window < 0.1 s from a cold open",
        f"{r.ttfw_s * 1000:.0f} ms" if r and r.ttfw_s is not None else None,
        (r.ttfw_s < 0.1) if r and r.ttfw_s is not None else None,
    )
    rows = by_w.get("temporal", [])
    base = _baseline_local(rows)
    m, _ = best(rows, "rangestream-sync", "local", 1)
    lit, _ = best(rows, "litdata-window", "local", 1)
    add(
        "temporal local sync ≥ 0.8x raw memmap",
        f"{m.windows_per_s / base:.2f}x" if m and base else None,
        (m.windows_per_s / base >= 0.8) if m and base else None,
    )
    add(
        "temporal local sync ≥ 2x LitData read_window",
        f"{m.windows_per_s / lit.windows_per_s:.2f}x" if m and lit else None,
        (m.windows_per_s >= 2 * lit.windows_per_s) if m and lit else None,
    )
    m, r = best(rows, "rangestream-async", "s3", 16)
    lit, _ = best(rows, "litdata-window", "s3", 16)
    own = _replay_ratio(r, m, replays) if m and r else None
    add(
        "temporal S3, 16 concurrent: ≥ LitData aread_window windows/s",
        f"{m.windows_per_s / lit.windows_per_s:.2f}x" if m and lit else None,
        (m.windows_per_s >= lit.windows_per_s) if m and lit else None,
    )
    add(
        "temporal S3, 16 concurrent: ≥ 0.9x the ceiling (its own GETs replayed)",
        f"{own:.2f}x" if own is not None else None,
        (own >= 0.9) if own is not None else None,
    )
    add(
        "temporal S3, 16 concurrent: no more requests per window than LitData",
        (f"{_fmt(m.requests_per_window, 2)} vs {_fmt(lit.requests_per_window, 2)}")
        if m and lit
        else None,
        (
            m.requests_per_window is not None
            and lit.requests_per_window is not None
            and m.requests_per_window <= lit.requests_per_window
        )
        if m and lit
        else None,
    )
    return lines


def _is_loader(system: str) -> bool:
    return system.endswith("-loader") or "-loader-" in system


def _loader_rows(by_w: dict[str, list[WorkloadResult]]) -> list[WorkloadResult]:
    return [
        r
        for w in LOADER_TABLE_WORKLOADS
        for r in by_w.get(w, [])
        if _is_loader(r.system) and r.status != "unsupported"
    ]


def _epoch_gets(requests_per_window: float | None, stride: int) -> str:
    """GETs of a 10^12-token epoch at this rate, and their S3 list price."""
    if requests_per_window is None:
        return DASH
    gets = EPOCH_TOKENS / stride * requests_per_window
    return f"{gets:.2g} (${gets * S3_GET_PRICE:,.2f})"


def _loader_table(by_w: dict[str, list[WorkloadResult]], sizes: dict[str, Any]) -> list[str]:
    """Tokens through the DataLoaders, in the units a training loop cares about.

    Same measurements as the loader rows of the sequential and shuffled token tables,
    restated: tokens/s counts the ``window_stride`` new tokens of each row (the +1
    next-token target overlaps the next row), bytes read per token divides what was fetched
    by those tokens, and each loader is compared with LitData's loader at the same location
    in the same order. Over S3, the GETs of a 10^12-token epoch at the measured rate.
    """
    stride = int(sizes["window_stride"])
    row_bytes = int(sizes["window_tokens"]) * TOKEN_DTYPE.itemsize
    rows = _loader_rows(by_w)
    peer = {
        (r.location, r.workload): r for r in rows if r.system == LOADER_PEER and r.status == "ok"
    }
    out = [
        "| loader | order | where | time to first batch | vs LitData | tokens/s median (min"
        f"{DASH}max) | vs LitData | bytes read /token | requests /batch | GETs of a 10^12-token "
        "epoch (S3 list price) | client CPU µs /token | local disk MB |",
        "|---|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    order = {"local": 0, "s3": 1}
    for r in sorted(
        rows,
        key=lambda r: (
            LOADER_TABLE_WORKLOADS.index(r.workload),
            order.get(r.location, 2),
            r.system,
        ),
    ):
        shuffled = "shuffled" if r.workload in LOADER_WORKLOADS else "in order"
        if r.status != "ok" or not r.measurements:
            out.append(
                f"| {r.label} | {shuffled} | {r.location} | **{r.status}** |" + f" {DASH} |" * 8
            )
            continue
        m = r.measurements[0]
        p = peer.get((r.location, r.workload))
        pm = p.measurements[0] if p and p.measurements else None
        ttfb = r.ttfw_s if r.system.startswith(FIRST_BATCH_TIMED) else None
        vs_ttfb = _ratio(ttfb, p.ttfw_s) if p and p is not r and ttfb and p.ttfw_s else DASH
        vs_rate = _ratio(m.windows_per_s, pm.windows_per_s) if pm and p is not r else DASH
        per_token = (
            m.bytes_per_payload_byte * row_bytes / stride
            if m.bytes_per_payload_byte is not None
            else None
        )
        per_batch = (
            m.requests_per_window * LOADER_BATCH if m.requests_per_window is not None else None
        )
        out.append(
            "| "
            + " | ".join(
                [
                    r.label,
                    shuffled,
                    r.location,
                    f"{ttfb * 1000:,.0f} ms" if ttfb is not None else DASH,
                    vs_ttfb,
                    f"{_fmt(m.windows_per_s * stride)} ({_fmt(m.windows_per_s_min * stride)}"
                    f"{DASH}{_fmt(m.windows_per_s_max * stride)})",
                    vs_rate,
                    _fmt(per_token, 2),
                    _fmt(per_batch, 2),
                    _epoch_gets(m.requests_per_window, stride)
                    if r.location == "s3" and not r.disk_mb
                    else (f"{DASH} (local cache)" if r.location == "s3" else DASH),
                    _fmt(m.cpu_us_per_window / stride, 2),
                    _fmt(r.disk_mb, 1),
                ]
            )
            + " |"
        )
    return out


def _loader_targets(by_w: dict[str, list[WorkloadResult]]) -> list[str]:
    """Issue #5's DataLoader goals, for rangestream's loader against LitData's."""
    rows = {
        (r.system, r.location): r
        for r in _loader_rows(by_w)
        if r.status == "ok" and r.workload == "tokens-sequential"
    }
    lines: list[str] = []
    for loc in ("local", "s3"):
        mine, peer = rows.get(("rangestream-loader", loc)), rows.get((LOADER_PEER, loc))
        where = "local disk" if loc == "local" else "S3"
        if not mine or not peer or not mine.measurements or not peer.measurements:
            lines.append(f"| DataLoader ({where}): compared with LitData | not measured | {DASH} |")
            continue
        if mine.ttfw_s is not None and peer.ttfw_s:
            ratio = mine.ttfw_s / peer.ttfw_s
            lines.append(
                f"| DataLoader ({where}): time to first batch ≤ 0.1x LitData's "
                f"| {mine.ttfw_s * 1000:,.0f} ms vs {peer.ttfw_s * 1000:,.0f} ms = {ratio:.2f}x "
                f"| {'yes' if ratio <= 0.1 else '**no**'} |"
            )
        rate = mine.measurements[0].windows_per_s / peer.measurements[0].windows_per_s
        lines.append(
            f"| DataLoader ({where}): tokens/s ≥ LitData's (warm cache) | {rate:.2f}x "
            f"| {'yes' if rate >= 1 else '**no**'} |"
        )
        lines.append(
            f"| DataLoader ({where}): no local disk | {_fmt(mine.disk_mb, 1)} MB "
            f"(LitData {_fmt(peer.disk_mb, 1)} MB) "
            f"| {'yes' if (mine.disk_mb or 0) == 0 else '**no**'} |"
        )
    return lines


def _shuffled_loader_targets(by_w: dict[str, list[WorkloadResult]], replays: Replays) -> list[str]:
    """Issue #20's goals for a shuffled epoch over S3, for rangestream's best shuffled loader
    row against LitData's: the block shuffle's when it ran (the issue's subject; the mixed
    row runs one block shuffle per source), else the fastest."""
    rows = [
        r
        for r in _loader_rows(by_w)
        if r.status == "ok" and r.measurements and r.location == "s3"
        if r.workload in LOADER_WORKLOADS
    ]
    peer = next((r for r in rows if r.system == LOADER_PEER), None)
    mine = [r for r in rows if r.system.startswith("rangestream")]
    if not mine or peer is None:
        return [f"| shuffled DataLoader (S3): compared with LitData | not measured | {DASH} |"]
    block = [r for r in mine if r.system == "rangestream-loader-block"]
    best = block[0] if block else max(mine, key=lambda r: r.measurements[0].windows_per_s)
    m, pm = best.measurements[0], peer.measurements[0]
    rate = m.windows_per_s / pm.windows_per_s
    row = f"shuffled DataLoader (S3), {best.label}"
    lines = [f"| {row}: windows/s ≥ LitData's | {rate:.2f}x | {'yes' if rate >= 1 else '**no**'} |"]
    if m.requests_per_window is not None:
        ok = m.requests_per_window <= 0.01
        lines.append(
            f"| {row}: ≤ 0.01 requests per window | {m.requests_per_window:.3f} "
            f"| {'yes' if ok else '**no**'} |"
        )
    own = _replay_ratio(best, m, replays)
    if own is not None:
        lines.append(
            f"| {row}: ≥ 0.9x the server's ceiling (its own GETs replayed) | {own:.2f}x "
            f"| {'yes' if own >= 0.9 else '**no**'} |"
        )
    lines.append(
        f"| {row}: no local disk | {_fmt(best.disk_mb, 1)} MB "
        f"| {'yes' if (best.disk_mb or 0) == 0 else '**no**'} |"
    )
    if best.ttfw_s is not None and peer.ttfw_s:
        ratio = best.ttfw_s / peer.ttfw_s
        lines.append(
            f"| {row}: time to first batch ≤ 0.5x LitData's | {best.ttfw_s * 1000:,.0f} ms vs "
            f"{peer.ttfw_s * 1000:,.0f} ms = {ratio:.2f}x | {'yes' if ratio <= 0.5 else '**no**'} |"
        )
    return lines


def _shuffle_section(section: dict[str, Any] | None) -> list[str]:
    """Shuffle quality from the emitted orders (``benchmarks/shuffle_quality.py``)."""
    if not section:
        return []
    sq = shuffle_quality
    return [
        "### Shuffle quality: from each loader's emitted order",
        "",
        f"One stream of {section['tokens'] / 1e6:,.0f}M int32 tokens in which token i has value "
        f"i ({section['windows']:,} windows of {sq.WINDOW} tokens at stride {sq.STRIDE}, "
        f"{section['dataset_mib']:,.0f} MiB in "
        f"{math.ceil(section['dataset_mib'] * 2**20 / sq.NEIGHBOURHOOD)} neighbourhoods of "
        f"{sq.NEIGHBOURHOOD >> 20} MiB), read on local disk by one rank with {sq.WORKERS} "
        f"DataLoader workers and batches of {sq.BATCH}, so a window's first token is its "
        "source position. Each system emits its order in its own process and one function "
        "computes every figure from those orders alone: the share of pairs of windows of a "
        f"batch from the same {sq.NEIGHBOURHOOD >> 20} MiB of the source (lower is better; "
        "an ideal shuffle sits at one over the neighbourhoods), the share of consecutive "
        "windows within 4 MiB of each other, and their median distance as a fraction of the "
        f"dataset (higher is better). Mean over {section['epochs']} epoch(s), min{DASH}max "
        "in brackets. *emitted by*: the system's DataLoader. *mixed per worker*: the "
        "windows a worker draws a batch from; *reads*: how the order reads storage.",
        "",
        *sq.render(section),
        "",
    ]


def _shuffle_targets(section: dict[str, Any] | None) -> list[str]:
    """Issue #20: the block shuffle mixes better than LitData's at equal memory."""
    rows = {r["name"]: r for r in (section or {}).get("rows", []) if "error" not in r}
    block, lit = rows.get("rangestream-block-k3-4mib"), rows.get("litdata")
    if not block or not lit:
        return [f"| shuffle quality: block shuffle vs LitData at equal memory | not measured "
                f"| {DASH} |"]  # fmt: skip
    mine, peer = block["same_pairs"][0], lit["same_pairs"][0]
    return [
        "| shuffle quality: block shuffle at LitData's memory (K=3 runs of 4 MiB, 12 MiB) "
        "shares 4 MiB neighbourhoods within a batch less often than LitData's shuffle "
        f"| {mine:.3f} vs {peer:.3f} | {'yes' if mine < peer else '**no**'} |"
    ]


def _spread(values: list[float]) -> str:
    return f"{min(values):,.0f}{DASH}{max(values):,.0f}"


def _ingest_each_row(
    r: dict[str, Any], tokens: int, convert_rate: float, convert_cpu: float
) -> list[str]:
    """The row of LitData with one encode call per document, when it was measured."""
    samples = r.get("litdata_each") or []
    if not samples:
        return []
    rates = [tokens / s["seconds"] for s in samples]
    per_cpu = statistics.median(tokens / s["cpu_s"] for s in samples)
    return [
        f"| LitData, `fn` encoding one document per call (as LitData's examples do) | "
        f"{statistics.median(rates):,.0f} | {_spread(rates)} | "
        f"{convert_rate / statistics.median(rates):.2f}x | {per_cpu:,.0f} | "
        f"{convert_cpu / per_cpu:.2f}x |"
    ]


def ingest_section(r: dict[str, Any], date: str | None = None) -> list[str]:
    """Conversion speed from ``python -m benchmarks ingest``'s results (issue 16)."""
    ceiling_rate = [s["tokens_per_s"] for s in r["ceiling"]]
    ceiling_read = [s["tokens_per_s"] for s in r["ceiling_read"]]
    convert_rate = [s["tokens_per_s"] for s in r["convert"]]
    tokens = r["convert"][0]["tokens"]
    lit_rate = [tokens / s["seconds"] for s in r["litdata"]]
    med = statistics.median
    per_cpu = {
        "ceiling": med(s["tokens_per_cpu_s"] for s in r["ceiling"]),
        "ceiling_read": med(s["tokens_per_cpu_s"] for s in r["ceiling_read"]),
        "convert": med(s["tokens_per_cpu_s"] for s in r["convert"]),
        "litdata": med(tokens / s["cpu_s"] for s in r["litdata"]),
    }
    ratio = {k: per_cpu["convert"] / v for k, v in per_cpu.items()}
    lines = [
        "## Ingestion: `rangestream convert` against the tokenizer and LitData",
        "",
        f"Command: `{r['command']}` (a benchmark of its own, run apart from the one above); "
        f"date: {r.get('date') or date or 'not recorded'}.",
        "",
        f"Machine: {r['machine']}; {r['workers']} worker processes everywhere; "
        f"corpus {r['corpus_mb']} MB of JSONL ({r['documents']:,} documents, "
        f"{tokens:,} tokens with a {VOCAB_SIZE:,}-id byte-level BPE trained on it); "
        f"{len(r['convert'])} repeats, interleaved; medians with the min{DASH}max spread.",
        "",
        "| what | tokens/s | spread | convert / it | tokens per CPU-s | convert / it |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
        f"| tokenizer alone: `encode_batch_fast`, texts in memory, nothing written | "
        f"{med(ceiling_rate):,.0f} | {_spread(ceiling_rate)} | "
        f"{med(convert_rate) / med(ceiling_rate):.2f}x | {per_cpu['ceiling']:,.0f} | "
        f"{ratio['ceiling']:.2f}x |",
        f"| tokenizer with reading + JSON parsing, nothing written | {med(ceiling_read):,.0f} | "
        f"{_spread(ceiling_read)} | {med(convert_rate) / med(ceiling_read):.2f}x | "
        f"{per_cpu['ceiling_read']:,.0f} | {ratio['ceiling_read']:.2f}x |",
        f"| **`rangestream convert --preset seq`** (read, tokenize, write, commit) | "
        f"**{med(convert_rate):,.0f}** | {_spread(convert_rate)} | 1.00x | "
        f"{per_cpu['convert']:,.0f} | 1.00x |",
        f"| LitData 0.2.76 `optimize` + `TokensLoader`, same tokens | {med(lit_rate):,.0f} | "
        f"{_spread(lit_rate)} | {med(convert_rate) / med(lit_rate):.2f}x | "
        f"{per_cpu['litdata']:,.0f} | {ratio['litdata']:.2f}x |",
        *_ingest_each_row(r, tokens, med(convert_rate), per_cpu["convert"]),
        "",
        "Targets (issue 16): convert >= 0.8x the tokenizer-alone ceiling, >= 1.5x LitData. "
        "Tokens per CPU-second (every process and thread of a system, from `getrusage`) is "
        "the view that does not move with the machine's load: on a shared machine the "
        "wall-clock rates move with whatever else runs.",
        "",
        "Stored: rangestream "
        f"{r['convert'][0]['stored_mb']:,.1f} MB ({r['convert'][0]['shards']} shards, uint16 "
        f"tokens), LitData {r['litdata'][0]['stored_mb']:,.1f} MB (int32 tokens as TokensLoader "
        "stores what fn yields).",
        "",
        "Peak RSS of `convert` (a fresh process per size; the parent and its largest worker):",
        "",
        "| corpus | parent MB | largest worker MB |",
        "| ---: | ---: | ---: |",
    ]
    for size, rss in sorted(r["rss"].items(), key=lambda kv: int(kv[0])):
        lines.append(f"| {size} MB | {rss['parent_mb']:,.0f} | {rss['worker_mb']:,.0f} |")
    lines += ["", "Raw results: `benchmarks/.work/ingest/results.json`."]
    return lines


def _ingest_lines() -> list[str]:
    """The ingestion section if ``python -m benchmarks ingest`` left results here."""
    if not INGEST_RESULTS.exists():
        return []
    modified = time.strftime(
        "%Y-%m-%d %H:%M UTC (the results file's time)", time.gmtime(INGEST_RESULTS.stat().st_mtime)
    )
    return ["", *ingest_section(json.loads(INGEST_RESULTS.read_text()), modified)]


# Sections of docs/benchmarks.md that other commands write (their own runs, measured apart
# from `run`), by heading prefix: a rewrite keeps them from the page it replaces, each
# before the first generated heading starting with one of its anchors (none: at the end).
KEPT_SECTIONS: dict[str, tuple[str, ...]] = {
    # python -m benchmarks.cache_epochs (hand-written from its output)
    "### Token windows, two block-shuffled epochs with the byte cache": (
        "### Temporal windows", "### Documents", "### DataLoaders", "### The S3 ceiling",
    ),
    # python -m benchmarks.cloud_requests (hand-written from its output)
    "### Requests and bytes per window on S3, GCS and Azure": (
        "### Temporal windows", "### Documents", "### DataLoaders", "### The S3 ceiling",
    ),
    # python -m benchmarks.integrations_overhead (hand-written from its output)
    "## Training frameworks: loader overhead": ("## Targets", "## Objects on the S3 server"),
    # python -m benchmarks ingest; kept only when its results file is not on this machine
    "## Ingestion": (),
}  # fmt: skip


def _kept_sections(old: str) -> dict[str, list[str]]:
    """The ``KEPT_SECTIONS`` of the page being replaced, each up to the next heading of the
    same or a higher level."""
    lines, out = old.splitlines(), {}
    for prefix in KEPT_SECTIONS:
        level = len(prefix) - len(prefix.lstrip("#"))
        start = next((i for i, x in enumerate(lines) if x.startswith(prefix)), None)
        if start is None:
            continue
        stop = next(
            (
                i
                for i in range(start + 1, len(lines))
                if lines[i].startswith("#") and len(lines[i]) - len(lines[i].lstrip("#")) <= level
            ),
            len(lines),
        )
        out[prefix] = lines[start:stop]
    return out


def _with_kept(lines: list[str], kept: dict[str, list[str]]) -> list[str]:
    """``lines`` with each kept section put back (unless the run generated it itself)."""
    for prefix, block in kept.items():
        if any(x.startswith(prefix) for x in lines):
            continue
        anchors = KEPT_SECTIONS[prefix]
        at = next((i for i, x in enumerate(lines) if anchors and x.startswith(anchors)), None)
        body = [*block]
        while body and not body[-1].strip():
            body.pop()
        lines = [*lines, "", *body] if at is None else [*lines[:at], *body, "", *lines[at:]]
    return lines


def _load_lines(data: dict[str, Any], cores: int) -> list[str]:
    """The machine's 1-minute load average around each measuring worker, if recorded."""
    load = data.get("load") or []
    if not load:
        return ["- Load: not recorded by this run."]
    values = [v for x in load for v in (x["load1_before"], x["load1_after"])]
    busiest = max(load, key=lambda x: max(x["load1_before"], x["load1_after"]))
    return [
        f"- Load: the 1-minute load average around the measuring workers ranged "
        f"{min(values):.2f}{DASH}{max(values):.2f} on {cores} cores (highest around "
        f"{busiest['worker']}). A measuring worker plus the S3 server account for about 1-2; "
        "more means other work shared the machine during the run."
    ]


# colour per project, line/marker per way of using it; the same in every panel
STYLES: dict[str, dict[str, Any]] = {
    "raw-memmap": {"color": "black", "ls": ":", "marker": ""},
    "raw-pread": {"color": "dimgray", "ls": "", "marker": "x"},
    "rangestream-sync": {"color": "tab:red", "ls": "", "marker": "s"},
    "rangestream-dataset": {"color": "tab:red", "ls": "", "marker": "P"},
    "rangestream-async": {"color": "tab:red", "ls": "-", "marker": "o"},
    "rangestream-loader": {"color": "darkred", "ls": "", "marker": "D"},
    "rangestream-loader-block": {"color": "darkred", "ls": "", "marker": "*"},
    "rangestream-loader-mixed": {"color": "darkred", "ls": "", "marker": "v"},
    "litdata-window": {"color": "tab:blue", "ls": "-", "marker": "o"},
    "litdata-dataset": {"color": "tab:blue", "ls": "", "marker": "s"},
    "litdata-loader": {"color": "navy", "ls": "", "marker": "D"},
    "mosaic-dataset": {"color": "tab:green", "ls": "", "marker": "s"},
    "mosaic-loader": {"color": "darkgreen", "ls": "", "marker": "D"},
}


def plot(results: list[WorkloadResult], path: Path, title: str, replays: Replays) -> None:
    """windows/s against concurrency: one row per workload, local and S3 side by side.

    Over S3 each system's own GETs replayed (the ceiling) are drawn in its colour with
    hollow markers on a dotted line.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    by_w = _by_workload(results)
    workloads = [w for w in WORKLOADS if w in by_w]
    locations = ("local", "s3")
    fig, axes = plt.subplots(
        len(workloads), 2, figsize=(13, 3.6 * len(workloads) + 1.6), squeeze=False
    )
    handles: dict[str, Any] = {}
    levels = sorted({m.concurrency for r in results for m in r.measurements}) or [1]
    for row, w in enumerate(workloads):
        for col, loc in enumerate(locations):
            ax = axes[row][col]
            for r in sorted(by_w[w], key=lambda r: r.system):
                if r.location != loc or r.status != "ok" or not r.measurements:
                    continue
                st = STYLES.get(r.system, {"color": "purple", "ls": "-", "marker": "o"})
                xs = [m.concurrency for m in r.measurements]
                ys = [m.windows_per_s for m in r.measurements]
                if r.system == LOCAL_BASELINE:
                    h = ax.axhline(ys[0], color=st["color"], ls=st["ls"], lw=1.5)
                else:
                    err = [
                        [m.windows_per_s - m.windows_per_s_min for m in r.measurements],
                        [m.windows_per_s_max - m.windows_per_s for m in r.measurements],
                    ]
                    h = ax.errorbar(
                        xs, ys, yerr=err, color=st["color"], ls=st["ls"] or "none",
                        marker=st["marker"], ms=6, capsize=3, lw=1.5,
                    )  # fmt: skip
                handles.setdefault(r.label, h)
                ceiling = [
                    (m.concurrency, best[1])
                    for m in r.measurements
                    if (rep := replays.get((r.system, w, m.concurrency)))
                    and (best := best_replay(rep))
                ]
                if loc == "s3" and ceiling:
                    ax.plot(
                        [c for c, _ in ceiling], [v for _, v in ceiling], color=st["color"],
                        ls=":", marker=st["marker"] or "o", mfc="none", ms=7, lw=1,
                    )  # fmt: skip
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xticks(levels)
            ax.set_xticklabels([str(t) for t in levels])
            ax.set_xlim(levels[0] / 1.5, levels[-1] * 1.5)
            ax.set_xlabel("concurrency (windows in flight)")
            ax.set_ylabel("windows/s")
            where = "local disk" if loc == "local" else "S3 (SeaweedFS + proxy)"
            ax.set_title(f"{SHORT_TITLES.get(w, w)} — {where}", fontsize=10)
            ax.grid(True, which="both", alpha=0.3)
    if replays:
        handles["hollow, dotted: the system's own GETs replayed (S3 ceiling)"] = Line2D(
            [], [], color="gray", ls=":", marker="o", mfc="none"
        )
    fig.legend(
        list(handles.values()), list(handles.keys()), loc="lower center", ncol=3, fontsize=9,
        frameon=False,
    )  # fmt: skip
    fig.suptitle(title, fontsize=11)
    legend_rows = math.ceil(len(handles) / 3)
    bottom = (0.3 + 0.22 * legend_rows) / fig.get_figheight()
    fig.tight_layout(rect=(0, bottom, 1, 1 - 0.5 / fig.get_figheight()))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _replay_table(results: list[WorkloadResult], replays: Replays) -> list[str]:
    """The S3 ceiling row by row: each measurement beside its own GETs replayed."""
    measured = {
        (r.system, r.workload, m.concurrency): (r, m)
        for r in results
        if r.location == "s3" and r.status == "ok"
        for m in r.measurements
    }
    order = {w: i for i, w in enumerate(WORKLOADS)}
    out = [
        "| system | workload | conc. | GETs /window | replayed in flight | system in flight: "
        "mean, peak "
        f"| system windows/s | replay windows/s: {' | '.join(CLIENTS)} | system / best replay "
        "| not replayed | check |",
        "|---|---|--:|--:|--:|--:|--:|" + "--:|" * len(CLIENTS) + "--:|--:|---|",
    ]
    for key in sorted(replays, key=lambda k: (order.get(k[1], 9), k[0], k[2])):
        rep = replays[key]
        r, m = measured.get(key, (None, None))
        label = r.label if r else rep.get("label", key[0])
        head = [label, key[1], str(key[2])]
        if rep.get("error"):
            out.append("| " + " | ".join(head) + f" | **error**: {rep['error'][:120]} |")
            continue
        gets, windows = sum(rep["gets"]), sum(rep["windows"])
        cells = []
        for c in CLIENTS:
            err = rep.get("clients", {}).get(c, {}).get("error")
            cells.append(f"error: {err[:60]}" if err else _fmt(replay_rate(rep, c)))
        best = best_replay(rep)
        verified = rep.get("verified")
        check = DASH if verified is None else ("exact ✓" if verified else "✗ MISMATCH")
        out.append(
            "| "
            + " | ".join(
                [
                    *head,
                    _fmt(gets / windows if windows else None, 3),
                    _lanes(rep["lanes"]) if gets else DASH,
                    f"{m.mean_in_flight:.1f}, {m.peak_in_flight}"
                    if m and m.mean_in_flight is not None and m.peak_in_flight is not None
                    else DASH,
                    _fmt(m.windows_per_s) if m else DASH,
                    *cells,
                    _ratio_cell(r, m, replays) if r and m and best else DASH,
                    str(rep["left_out"]),
                    check,
                ]
            )
            + " |"
        )
    return out


def _lanes(lanes: int | list[int]) -> str:
    """GETs the replay kept in flight: one figure, or the range over repeats."""
    if isinstance(lanes, int):
        return str(lanes)
    return str(lanes[0]) if min(lanes) == max(lanes) else f"{min(lanes)}{DASH}{max(lanes)}"


def _spread_line(results: list[WorkloadResult]) -> list[str]:
    """How noisy this run was: the median min-to-max spread of the S3 and local figures."""
    out = []
    for loc, name in (("local", "local"), ("s3", "S3")):
        spreads = [
            (m.windows_per_s_max - m.windows_per_s_min) / m.windows_per_s
            for r in results
            if r.location == loc and r.status == "ok"
            for m in r.measurements
            if m.windows_per_s > 0
        ]
        if spreads:
            spreads.sort()
            mid = spreads[len(spreads) // 2]
            out.append(
                f"- Noise: the median min{DASH}max spread of the {name} figures in this run is "
                f"{mid * 100:.0f}% of the median; ratios closer to 1 than that are ties."
            )
    return out


def write(results_path: Path, md_path: Path | None = None, png_path: Path | None = None) -> None:
    """Render the report and the plot from one results file."""
    data = json.loads(results_path.read_text())
    md_path = md_path or DOCS_DIR / "benchmarks.md"
    png_path = png_path or DOCS_DIR / "benchmarks.png"
    results = [WorkloadResult.from_json(r) for r in data["results"]]
    replays = _replays(data)
    cfg, mach = data["config"], data["machine"]
    sizes, budget = cfg["sizes"], cfg["budget"]
    quick = " (quick mode: small data, short repeats; for development, not for claims)"
    title = (
        f"{mach['cpu']}, {mach['cores']} cores; S3 = SeaweedFS + {cfg['latency_ms']:g} ms/request"
        f"{' [quick]' if cfg['quick'] else ''} — {mach['date']}"
    )
    drawn = False
    if results:  # a run of the shuffle-quality section alone has no windows/s to plot
        if importlib.util.find_spec("matplotlib") is None:
            print(
                "warning: matplotlib is not installed (`python -m benchmarks setup` installs "
                f"it); {md_path} is written without the figure",
                file=sys.stderr,
            )
        else:
            plot(results, png_path, title, replays)
            drawn = True

    lines: list[str] = [
        "# Benchmarks",
        "",
        "Generated by the benchmark harness; do not edit by hand. Rerun with the command below.",
        "",
        f"Command: `{data['command']}`{quick if cfg['quick'] else ''}",
        "",
        f"Date: {mach['date']}; the run took {data['elapsed_s'] / 60:.1f} min.",
        "",
        *([f"![windows/s against concurrency]({png_path.name})", ""] if drawn else []),
        "## Machine",
        "",
        "| | |",
        "|---|---|",
        f"| CPU | {mach['cpu']} |",
        f"| cores | {mach['cores']} |",
        f"| RAM | {mach['ram_gib']} GiB |",
        f"| OS | {mach['os']} |",
        f"| Python | {mach['python']} |",
        f"| S3 server | {mach['weed']} |",
    ]
    for pkg, ver in mach["packages"].items():
        lines.append(f"| {pkg} | {ver} |")
    for pkg, ver in mach["mosaic_venv"].items():
        lines.append(f"| {pkg} (MosaicML venv) | {ver} |")
    lines += [
        "",
        "The S3 server, the latency proxy and the client share these cores: on a 2-core box",
        "client CPU per window is part of every S3 figure, which is why it is reported.",
        "",
        "## How to reproduce",
        "",
        "```",
        "python -m benchmarks setup      # installs the peers (commands below); idempotent",
        data["command"],
        "```",
        "",
        "`setup` runs exactly:",
        "",
        "```",
        *data["install"],
        "```",
        "",
        "## What is measured",
        "",
        f"- Tokens: int32 documents of {sizes['token_doc_min']}..{sizes['token_doc_max']} "
        f"tokens, about {sizes['token_total'] / 1e6:g}M tokens in all; windows of "
        f"{sizes['window_tokens']} tokens; {sizes['random_windows']:,} random starts, or "
        f"sequential starts every {sizes['window_stride']} tokens; the shuffled workload "
        "reads the sequential windows through the DataLoaders in their own shuffled order "
        "(each loader's default shuffle; a row is checked by finding it in the stream).",
        f"- Temporal: {sizes['temporal_records']} records of {sizes['temporal_frames_min']}.."
        f"{sizes['temporal_frames_max']} frames; features (F,256) f32, clock (F,) f64, valid "
        f"(F,) bool, pose (F,7) f32; random {sizes['temporal_window_frames']}-frame windows of "
        "features + pose.",
        f"- Documents: {sizes['documents']:,} documents of {sizes['document_bytes_min']}.."
        f"{sizes['document_bytes_max']} bytes (log-uniform); random batches of "
        f"{sizes['document_batch']} (one `read_many` call is one window).",
        f"- Seeds are fixed (seed {cfg['seed']}); every system reads the same window list.",
        f"- Each figure: median of {budget['repeats']} repeats of ~{budget['repeat_seconds']} s "
        f"after {budget['warmup_seconds']} s of warm-up (min{DASH}max in brackets); a repeat reads "
        "windows further along the list than the previous one.",
        "- *conc.* c: how many windows a system's concurrent read keeps in flight. It is "
        f"called with at least {LANE_WINDOWS} windows per lane (c x {LANE_WINDOWS} window ids "
        "per call, more while calls are fast): a call ends on its slowest window, a barrier "
        "a training loop's prefetching does not have; every system is called the same way.",
        "- *vs limit*: local rows against raw numpy memmap slicing of the same bytes; S3 rows "
        "against the S3 ceiling of that very row: the exact GETs it made (same objects, same "
        "byte ranges, same order, repeat by repeat) replayed by a bare client at the same "
        "concurrency, the faster of two (aiohttp + SigV4, obstore). See *The S3 ceiling* "
        "below.",
        f"- S3: SeaweedFS on loopback behind a proxy adding {cfg['latency_ms']:g} ms per "
        "request and counting requests and bytes (*requests/window*, *bytes fetched/payload "
        f"byte*). Objects are kept ≤ {OBJECT_BYTES // 2**20} MiB, the size SeaweedFS stores in "
        "one piece (range GETs into larger objects are several times slower on SeaweedFS, "
        "unlike real S3).",
        "- *first window (cold)*: open the dataset with an empty cache directory and read the "
        "first window. Each worker first opens one dataset and reads one window untimed, so "
        "one-time process costs (imports, botocore loading its service models, native "
        "runtimes) are not charged to whichever workload happens to come first; the page "
        "cache is warm for local data, and every object was read once after upload (SeaweedFS "
        "is slow on a freshly written object). The requests the cold open made are in brackets.",
        "- Systems that download whole chunks or shards (LitData `StreamingDataset[i]`, "
        "MosaicML) serve later windows from their local cache: once the data set is cached, "
        "their S3 rows measure local reads and make few GETs, so their own GETs take a small "
        "share of their time (a small ratio to their replay), or none (no ratio). Read those "
        "rows with *first window*, *bytes fetched/payload byte* and *cache MB*.",
        "- *client CPU*: CPU time of the measuring process and its live children (DataLoader "
        "workers) per window. *peak RSS*: high-water mark during the workload (children "
        "included). *cache MB*: what the system left in its cache directory.",
        "- *check*: the first windows compared byte for byte with the raw files (exact), or "
        "with what the closest equivalent job must return (equiv.: see the notes).",
        "",
        *_spread_line(results),
        *_load_lines(data, int(mach["cores"])),
        "",
        "## How the peers are set up",
        "",
        "- LitData: installed without torchvision (it is only needed for image datasets). "
        "S3 access is boto3's client built from `storage_options` (`endpoint_url`, keys, "
        "`region_name`), pointed at the proxy. Its range-read path (obstore) is built from "
        "that client's endpoint but without `allow_http`, so an `http://` endpoint fails "
        "with `BadScheme`; the harness adds `allow_http` to LitData's module-level obstore "
        "client options (no public setting exists; real S3 is https).",
        "- MosaicML Streaming: its own virtualenv (numpy < 2.2). S3 endpoint from "
        "`S3_ENDPOINT_URL`, keys from `AWS_*`. `import streaming` imports its vision "
        "datasets and so torchvision, which cannot import beside the CPU torch; an empty "
        "`streaming.vision` module is put in its place (never used here).",
        "- LitData and MosaicML objects are written with chunk/shard limits below 4 MiB, like "
        "rangestream's blocks (see the object table at the end).",
        "",
        "## Results",
        "",
    ]
    notes: dict[str, int] = {}
    by_w = _by_workload(results)
    for w in WORKLOADS:
        if w not in by_w:
            continue
        lines += [f"### {WORKLOAD_TITLES.get(w, w)}", "", *_table(by_w[w], notes, replays), ""]
    loader = _loader_table(by_w, sizes)
    if len(loader) > 2:
        lines += [
            "### DataLoaders: tokens through the training-loop path",
            "",
            f"The loader rows of the sequential and shuffled token tables, restated per token "
            "(*in order*: `shuffle=False`; *shuffled*: each loader's shuffle, a new epoch "
            "order): "
            f"{sizes['window_stride']} new tokens per row ({sizes['window_tokens']} with the "
            f"next-token target), batches of {LOADER_BATCH} rows, {LOADER_WORKERS} worker "
            "processes. *time to first batch* is the cold open timed with the first batch out "
            "of the loader (workers started); MosaicML's adapter does not time it (its "
            "*first window* above is a dataset item). "
            "*bytes read/token* counts what the proxy saw (S3) or what the loader's workers "
            "reported through their collate function (`rangestream.io.process_io_stats`; "
            "LitData reports nothing locally). *local disk*: what the loader left in its cache "
            "directory (LitData downloads whole chunks there from S3; rangestream has none). "
            "*GETs of a 10^12-token epoch*: 10^12 / 2048 windows times the requests per window "
            "measured over S3, priced at S3's $0.40 per million GETs; not given for loaders "
            "that keep a local cache (their timed repeats read it, not S3).",
            "",
            *loader,
            "",
        ]
    if replays:
        lines += [
            "### The S3 ceiling: each system's own GETs replayed",
            "",
            "While each system ran over S3 the proxy logged its requests (object key, byte "
            "range served, status), cut into the warm-up and each timed repeat. Right after "
            "each repeat, before the system's next one, a bare client in a process of its own "
            "replays that repeat's exact sequence on the same objects (the warm-up untimed): "
            "the same keys, the same ranges (open-ended and "
            "suffix ranges as the absolute bytes served), in order; system and replay thus "
            "see the same machine, seconds apart. Synthetic objects would "
            "flatter the ceiling: a SeaweedFS range GET costs with the size of the object "
            "it reads and is cheaper when another GET of the same object is in flight "
            "(docs/design.md). *replayed in flight*: GETs the replay keeps in flight, "
            "`round(c x GETs/window)` (c windows with their GETs together) or, for loaders "
            "that choose their own concurrency, the system's mean in flight as the proxy saw "
            "it (time in flight over the repeats' time, rounded up; the peak is a burst). "
            "*replay windows/s*: the repeat's windows over the time its GETs took "
            "(median over repeats). *system / best replay*, the *vs limit* of the tables "
            "above, is taken repeat by repeat (the system's repeat over the faster client's "
            "replay of it): its median and, in brackets, its range over the repeats; 1.0 "
            "means the system is as fast as its own GETs allow here. *not "
            "replayed*: requests other than successful object GETs (listings, HEADs, errors). "
            "*check*: the first GETs' bytes compared with the prepared files.",
            "",
            *_replay_table(results, replays),
            "",
        ]
    lines += _shuffle_section(data.get("shuffle_quality"))
    if notes:
        lines += ["### Notes", ""]
    for text, n in sorted(notes.items(), key=lambda kv: kv[1]):
        lines.append(f"{n}. {text}")
    lines += [
        "",
        "## Targets (issues #6, #5, #4, #15, #20 and #30; reported, not asserted)",
        "",
        *_targets(by_w, replays),
        *_loader_targets(by_w),
        *(_shuffled_loader_targets(by_w, replays) if LOADER_WORKLOADS[0] in by_w else []),
        *(_shuffle_targets(data.get("shuffle_quality")) if data.get("shuffle_quality") else []),
        *issue30_targets(by_w, replays, _baseline_local),
    ]
    if data.get("uploads"):
        lines += ["", "## Objects on the S3 server", "", "| prefix | objects | MiB | largest MiB |"]
        lines.append("|---|--:|--:|--:|")
        for prefix, u in data["uploads"].items():
            lines.append(
                f"| {prefix} | {u['objects']} | {u['bytes'] / 2**20:.1f} "
                f"| {u['largest'] / 2**20:.2f} |"
            )
    lines += _ingest_lines()
    if data.get("notes"):
        lines += ["", "## Run notes", "", *[f"- {n}" for n in data["notes"]]]
    if md_path.exists():
        lines = _with_kept(lines, _kept_sections(md_path.read_text()))
    md_path.parent.mkdir(parents=True, exist_ok=True)
    md_path.write_text("\n".join(lines) + "\n")
