"""``rangestream cache DIR [--clear] [--json]``: what a node-local byte cache holds.

DIR defaults to ``RANGESTREAM_CACHE_DIR``. Prints the bytes its entries take (what the
budget bounds), the entries and bytes per dataset, and the hit rate over every process
that used it; ``--clear`` deletes every entry and count (readers still running simply miss).
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from rangestream.errors import CommandLineError


def register(commands: Any) -> None:
    parser = commands.add_parser(
        "cache", help="show (with --clear empty) a byte cache directory: size, datasets, hits"
    )
    parser.add_argument("directory", nargs="?", help="the cache directory "
                        "(default: $RANGESTREAM_CACHE_DIR)")  # fmt: skip
    parser.add_argument("--clear", action="store_true", help="delete every entry and count")
    parser.add_argument("--json", action="store_true", help="print a JSON object for scripts")
    parser.set_defaults(run=run)


def run(arguments: argparse.Namespace) -> int:
    from rangestream.io.cache import CACHE_DIR_ENV, clear_cache, summarize_cache

    directory = arguments.directory or os.environ.get(CACHE_DIR_ENV)
    if not directory:
        raise CommandLineError(f"name a cache directory (or set {CACHE_DIR_ENV})")
    try:
        summary = summarize_cache(directory)
        freed = clear_cache(directory) if arguments.clear else None
    except FileNotFoundError as error:
        raise CommandLineError(str(error)) from error
    if arguments.json:
        report = summary.to_json()
        if freed is not None:
            report["cleared_bytes"] = freed
        print(json.dumps(report, indent=2))
        return 0
    print(f"cache {summary.directory}: {summary.bytes:,} bytes in {summary.entries:,} entries")
    for url, (entries, nbytes) in sorted(summary.datasets.items()):
        print(f"  {url}: {entries:,} entries, {nbytes:,} bytes")
    asked = summary.hits + summary.misses
    print(f"hits {summary.hits:,} of {asked:,} requests ({summary.hit_rate:.1%}), "
          f"{summary.bytes_served:,} bytes served; "
          f"{summary.dropped:,} damaged entries dropped")  # fmt: skip
    if freed is not None:
        print(f"cleared {freed:,} bytes")
    return 0
