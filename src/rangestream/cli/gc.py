"""``rangestream gc URL [--yes]``: list, and delete, versions no reader can reach."""

from __future__ import annotations

import argparse
import json
import re
from typing import Any

from rangestream.cli.options import (
    add_location_arguments,
    dataset_url,
    retry_policy,
    storage_options,
)
from rangestream.errors import CommandLineError

_DURATION = re.compile(r"^\s*(\d+(?:\.\d*)?)\s*([smhd]?)\s*$")
_SECONDS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def register(commands: Any) -> None:
    from rangestream.storage.maintenance.gc import DEFAULT_GRACE_SECONDS

    parser = commands.add_parser(
        "gc",
        help="list (with --yes delete) the versions of a dataset that no reader can reach",
    )
    add_location_arguments(parser, default_url=None)
    parser.add_argument("--yes", action="store_true", help="delete them (default: list only)")
    parser.add_argument(
        "--grace",
        default=f"{DEFAULT_GRACE_SECONDS / 3600:g}h",
        metavar="DURATION",
        help="keep versions written more recently than this (a write may still be running): "
        "seconds, or a number with s, m, h or d (default: %(default)s)",
    )
    parser.add_argument("--json", action="store_true", help="print a JSON object for scripts")
    parser.set_defaults(run=run)


def parse_duration(text: str) -> float:
    match = _DURATION.match(text)
    if match is None:
        raise CommandLineError(f"--grace takes a duration such as 30m, 24h or 7d, got {text!r}")
    return float(match.group(1)) * _SECONDS[match.group(2)]


def run(arguments: argparse.Namespace) -> int:
    from rangestream.storage.maintenance.gc import collect_garbage

    report = collect_garbage(
        dataset_url(arguments),
        storage_options(arguments),
        grace=parse_duration(arguments.grace),
        delete=arguments.yes,
        retry=retry_policy(arguments),
    )
    if arguments.json:
        print(json.dumps(report.to_json(), indent=2))
    else:
        for line in report.lines():
            print(line)
    return 0
