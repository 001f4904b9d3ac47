"""``rangestream verify URL``: scan a dataset for damage; exit 1 if any is found.

Reads check only the chunks they touch; this reads every block of the committed version
and checks every checksum and index invariant (see ``rangestream.storage.maintenance.verify``), with
a progress bar on stderr and a report on stdout.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from rangestream.cli.options import (
    add_location_arguments,
    dataset_url,
    retry_policy,
    storage_options,
)
from rangestream.errors import CommandLineError

#: Exit status when the scan found damage (2 is an error that stopped the scan itself).
EXIT_DAMAGED = 1


def register(commands: Any) -> None:
    parser = commands.add_parser(
        "verify", help="check every checksum and index invariant of a dataset"
    )
    add_location_arguments(parser, default_url=None)
    parser.add_argument(
        "--concurrency", type=int, default=8, help="blocks fetched at once (bounds memory)"
    )
    parser.add_argument("--json", action="store_true", help="print a JSON object for scripts")
    parser.set_defaults(run=run)


def run(arguments: argparse.Namespace) -> int:
    from tqdm import tqdm

    from rangestream.storage.maintenance.verify import verify_dataset

    url = dataset_url(arguments)
    if arguments.concurrency < 1:
        raise CommandLineError(f"--concurrency must be at least 1, got {arguments.concurrency}")
    bars: list[Any] = []  # made once the scan starts: a failure before it prints one line

    def set_total(total: int) -> None:
        bars.append(tqdm(total=total, unit="block", desc="verify", file=sys.stderr))

    def update(count: int) -> None:
        if bars:
            bars[0].update(count)

    try:
        report = verify_dataset(
            url,
            storage_options(arguments),
            progress=update,
            on_total=set_total,
            max_concurrency=arguments.concurrency,
            retry=retry_policy(arguments),
        )
    finally:
        for bar in bars:
            bar.close()
    if arguments.json:
        print(json.dumps(report_json(report), indent=2))
    else:
        for line in report.lines():
            print(line)
    return 0 if report.ok else EXIT_DAMAGED


def report_json(report: Any) -> dict[str, Any]:
    """A ``VerifyReport`` as ``verify --json`` prints it (the same facts as its lines)."""
    return {
        "dataset": report.url,
        "kind": report.kind,
        "commit": report.commit_id,
        "ok": report.ok,
        "checked": {"shards": report.shards, "arrays": report.arrays, "blocks": report.blocks,
                    "chunks": report.chunks, "bytes": report.bytes},
        "problems": [{"where": p.where, "message": p.message} for p in report.problems],
        "orphans": [{"prefix": o.prefix, "objects": o.objects, "bytes": o.bytes}
                    for o in report.orphans],
    }  # fmt: skip
