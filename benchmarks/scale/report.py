"""The tables, fits and extrapolations of ``docs/scale.md``, from the saved series.

Run: ``python -m benchmarks.scale.report --label after [--before before]``.

Reads ``benchmarks/.work/scale/<label>/*.json`` (and the same series of ``--before`` for the
comparison columns) and prints Markdown. Fits are least squares of ``a + b x`` over the
measured points (``x`` the shards, parts or shards per writer); the extrapolations apply
them, and the exact counts, to a job of 10^8 records in 10^5 shards read by 1,024 ranks of
8 DataLoader workers each, 8 ranks per node.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import numpy as np

from benchmarks.scale import harness

RANKS, WORKERS, RANKS_PER_NODE = 1024, 8, 8
PROCESSES = RANKS * WORKERS  # the processes that open the dataset (each worker opens once)


def load(label: str, series: str) -> dict[str, Any] | None:
    path = harness.WORK / label / f"{series}.json"
    return json.loads(path.read_text()) if path.exists() else None


def fit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """``(a, b)`` of the least-squares line ``a + b x``."""
    b, a = np.polyfit(np.asarray(xs, float), np.asarray(ys, float), 1)
    return float(a), float(b)


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f}"


def mb(nbytes: float) -> str:
    return f"{nbytes / 1e6:.2f}"


def open_tables(after: dict, before: dict | None) -> list[str]:
    out = ["### Opening, by records (one shard; local disk)", ""]
    out.append("| kind | records | requests | bytes | held MB | open ms | open+first ms |")
    out.append("|---|---:|---:|---:|---:|---:|---:|")
    for kind, rows in after["records"].items():
        for n, row in rows.items():
            out.append(
                f"| {kind} | {int(n):,} | {row['open_requests']} | {row['open_bytes']:,} | "
                f"{mb(row['held_open_bytes'])} | {ms(row['open_seconds']['median'])} | "
                f"{ms(row['open_first_seconds']['median'])} |"
            )
    out += ["", "### Opening, by shards (one record each; local disk)", ""]
    out.append(
        "| kind | shards | requests | bytes | held MB | open ms (range) | before: bytes, held MB,"
        " open ms |"
    )
    out.append("|---|---:|---:|---:|---:|---:|---:|")
    for kind, rows in after["shards"].items():
        for n, row in rows.items():
            old = (before or {}).get("shards", {}).get(kind, {}).get(n)
            then = (
                f"{old['open_bytes']:,}, {mb(old['held_open_bytes'])}, "
                f"{ms(old['open_seconds']['median'])}"
                if old
                else ""
            )
            spread = row["open_seconds"]
            out.append(
                f"| {kind} | {int(n):,} | {row['open_requests']} | {row['open_bytes']:,} | "
                f"{mb(row['held_open_bytes'])} | {ms(spread['median'])} "
                f"({ms(spread['min'])}-{ms(spread['max'])}) | {then} |"
            )
    out += ["", "Fits over shards >= 1,000 (a + b x shards):", ""]
    for kind, rows in after["shards"].items():
        points = [(int(n), row) for n, row in rows.items() if int(n) >= 1000]
        if len(points) < 2:
            continue
        xs = [n for n, _ in points]
        t = fit(xs, [r["open_seconds"]["median"] for _, r in points])
        m = fit(xs, [r["held_open_bytes"] for _, r in points])
        b = fit(xs, [r["open_bytes"] for _, r in points])
        out.append(
            f"- {kind}: open {t[0] * 1e3:.2f} ms + {t[1] * 1e9:.0f} ns/shard; held "
            f"{mb(m[0])} MB + {m[1]:.1f} B/shard; fetched {b[0]:,.0f} B + {b[1]:.1f} B/shard"
        )
    if "s3" in after:
        out += ["", "### Opening over SeaweedFS behind a 20 ms proxy", ""]
        out.append("| series | n | requests | bytes | held MB | open ms | open+first ms |")
        out.append("|---|---:|---:|---:|---:|---:|---:|")
        for name, rows in after["s3"].items():
            for n, row in rows.items():
                out.append(
                    f"| {name} | {int(n):,} | {row['open_requests']} | {row['open_bytes']:,} | "
                    f"{mb(row['held_open_bytes'])} | {ms(row['open_seconds']['median'])} | "
                    f"{ms(row['open_first_seconds']['median'])} |"
                )
    return out


def commit_tables(after: dict, before: dict | None) -> list[str]:
    out = ["### Commit, by parts (100 shards each)", ""]
    out.append(
        "| where | parts | commit s (range) | before s | CPU s (range) | before CPU s | "
        "requests (proxy) | in flight |"
    )
    out.append("|---|---:|---:|---:|---:|---:|---|---:|")
    for where in ("local", "local_v1", "s3", "s3_first", "s3_20ms", "s3_20ms_first"):
        # runs before local_v1 existed wrote first-format parts in their local series
        earlier = (before or {}).get(where) or (before or {}).get(where.removesuffix("_v1"), {})
        for n, row in after.get(where, {}).items():
            old = earlier.get(n) or {}
            cells = [where, f"{int(n):,}", spread(row["seconds"])]
            cells.append(f"{old['seconds']['median']:.3f}" if old else "")
            cells.append(spread(row["cpu_seconds"]) if "cpu_seconds" in row else "")
            cells.append(f"{old['cpu_seconds']['median']:.3f}" if "cpu_seconds" in old else "")
            proxy = row.get("proxy") or {}
            cells += [str(proxy.get("requests_by_method", "")), str(proxy.get("max_in_flight", ""))]
            out.append("| " + " | ".join(cells) + " |")
        rows = after.get(where, {})
        if len(rows) >= 2:
            a, b = fit([int(n) for n in rows], [r["seconds"]["median"] for r in rows.values()])
            out.append(f"| {where} fit | | {a * 1e3:.1f} ms + {b * 1e3:.2f} ms/part | | | | | |")
    return out


def spread(seconds: dict[str, float]) -> str:
    """``median (min-max)`` of a ``harness.spread``."""
    return f"{seconds['median']:.3f} ({seconds['min']:.3f}-{seconds['max']:.3f})"


def writer_tables(after: dict, before: dict | None) -> list[str]:
    out = ["### One writer, by shards it owns (1 MiB each, round robin)", ""]
    out.append("| budget | shards | peak MB | store calls | seconds | before: peak MB |")
    out.append("|---|---:|---:|---|---:|---:|")
    for budget, rows in after.items():
        if not isinstance(rows, dict):
            continue
        for n, row in rows.items():
            old = (before or {}).get("default", {}).get(n)
            out.append(
                f"| {budget} | {int(n):,} | {mb(row['peak_bytes'])} | {row['store_calls']} | "
                f"{row['seconds']:.2f} | {mb(old['peak_bytes']) if old else ''} |"
            )
    return out


def disk_tables(after: dict, before: dict | None) -> list[str]:
    out = ["### A one-record shard on disk", ""]
    out.append("| kind | objects | bytes per shard | before |")
    out.append("|---|---:|---:|---:|")
    for kind, row in after.items():
        if not isinstance(row, dict):
            continue
        old = (before or {}).get(kind, {})
        out.append(
            f"| {kind} | {row['objects_per_shard']} | {row['bytes_per_shard']:,} | "
            f"{old.get('bytes_per_shard', 0):,} |"
        )
    return out


def mapped_tables(after: dict, before: dict | None) -> list[str]:
    out = ["### Random local windows, by working set of 64 KiB blocks", ""]
    out.append("| blocks | memmap us | rangestream us (range) | ratio | mapped | before us |")
    out.append("|---:|---:|---:|---:|---:|---:|")
    points = sorted(after["points"].items(), key=lambda item: int(item[0]))
    for n, row in points:
        rs, mm = row["rangestream"]["us_per_window"], row["memmap"]["us_per_window"]
        old = (before or {}).get("points", {}).get(n)
        out.append(
            f"| {int(n):,} | {mm['median']:.2f} | {rs['median']:.2f} ({rs['min']:.2f}-"
            f"{rs['max']:.2f}) | {rs['median'] / mm['median']:.2f} | {row['mapped_blocks']} | "
            f"{old['rangestream']['us_per_window']['median']:.1f} |"
            if old
            else f"| {int(n):,} | {mm['median']:.2f} | {rs['median']:.2f} | | | |"
        )
    small = after["points"]["10"]["rangestream"]["us_per_window"]["median"]
    large = after["points"][str(10**4)]["rangestream"]["us_per_window"]["median"]
    out += ["", f"10^4 blocks over 10 blocks: {large / small:.2f}x (goal: within 2x)."]
    return out


def document_tables(after: dict, before: dict | None) -> list[str]:
    out = [f"### Shuffled documents, {after['documents']:,} documents of ~1 KiB", ""]
    out.append("| shards | reads so far | requests/doc | bytes/payload | before: req, bytes |")
    out.append("|---:|---:|---:|---:|---:|")
    for shards in ("1000", "4"):
        row = after.get(shards)
        if row is None:
            continue
        for end, seg in row["segments"].items():
            old = (before or {}).get(shards, {}).get("segments", {}).get(end)
            then = (
                f"{old['requests_per_document']:.3f}, {old['bytes_over_payload']:.2f}"
                if old
                else ""
            )
            out.append(
                f"| {shards} | {int(end):,} | {seg['requests_per_document']:.3f} | "
                f"{seg['bytes_over_payload']:.2f} | {then} |"
            )
        out.append(f"| {shards} | held by the reader | {mb(row['held_bytes'])} MB | | |")
    return out


def extrapolation(opened: dict, commit: dict | None) -> list[str]:
    """The job of the issue: 10^8 records, 10^5 shards, 1,024 ranks x 8 workers."""
    out = [
        f"### At 10^8 records, 10^5 shards, {RANKS:,} ranks x {WORKERS} workers "
        f"({RANKS_PER_NODE} ranks per node)",
        "",
        "| kind | per process: requests, MB fetched, MB held | per node MB held | "
        "job start: requests, GB fetched |",
        "|---|---|---:|---|",
    ]
    for kind, rows in opened["shards"].items():
        row = rows.get(str(10**5))
        if row is None:
            continue
        per_node = row["held_open_bytes"] * RANKS_PER_NODE * WORKERS
        out.append(
            f"| {kind} | {row['open_requests']}, {mb(row['open_bytes'])}, "
            f"{mb(row['held_open_bytes'])} | {mb(per_node)} | "
            f"{row['open_requests'] * PROCESSES:,}, {row['open_bytes'] * PROCESSES / 1e9:.1f} |"
        )
    if commit and "s3_20ms" in commit and len(commit["s3_20ms"]) >= 2:
        rows = commit["s3_20ms"]
        a, b = fit([int(n) for n in rows], [r["seconds"]["median"] for r in rows.values()])
        parts = PROCESSES
        out += [
            "",
            f"Commit of {parts:,} parts (one per writer) behind 20 ms: "
            f"{a + b * parts:.1f} s by the fit ({a * 1e3:.0f} ms + {b * 1e3:.2f} ms/part).",
        ]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--label", required=True)
    parser.add_argument("--before")
    args = parser.parse_args()

    def pair(series: str) -> tuple[Any, Any]:
        return load(args.label, series), load(args.before, series) if args.before else None

    lines: list[str] = []
    sections = (
        ("open", open_tables),
        ("commit", commit_tables),
        ("writers", writer_tables),
        ("disk", disk_tables),
        ("mapped", mapped_tables),
        ("documents-10000000", document_tables),
    )
    for series, table in sections:
        after, before = pair(series)
        if after is not None:
            lines += [*table(after, before), ""]
    opened = load(args.label, "open")
    if opened is not None:
        lines += extrapolation(opened, load(args.label, "commit"))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
