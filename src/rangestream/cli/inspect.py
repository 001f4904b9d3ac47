"""``rangestream inspect URL``: what a dataset holds, in a user's words (``--json``)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from rangestream.cli.options import (
    add_location_arguments,
    dataset_url,
    retry_policy,
    storage_options,
)


def register(commands: Any) -> None:
    parser = commands.add_parser(
        "inspect",
        help="print what a dataset holds: kind, schema, counts, size, version, orphans",
    )
    add_location_arguments(parser, default_url=None)
    parser.add_argument("--json", action="store_true", help="print a JSON object for scripts")
    parser.set_defaults(run=run)


def run(arguments: argparse.Namespace) -> int:
    from rangestream.storage.maintenance.summary import summarize_dataset

    summary = summarize_dataset(
        dataset_url(arguments), storage_options(arguments), retry=retry_policy(arguments)
    )
    if arguments.json:
        print(json.dumps(summary.to_json(), indent=2))
    else:
        for line in summary.lines():
            print(line)
    return 0
