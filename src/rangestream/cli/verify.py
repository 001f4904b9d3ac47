"""``rangestream verify URL``: scan a dataset for damage; exit 1 if any is found.

Reads check only the chunks they touch; this reads every block of the committed version
and checks every checksum and index invariant (see ``rangestream.storage.verify``), with
a progress bar on stderr and a report on stdout.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from rangestream.cli.options import add_location_arguments, storage_options

#: Exit status when the scan found damage (2 is an error that stopped the scan itself).
EXIT_DAMAGED = 1


def register(commands: Any) -> None:
    parser = commands.add_parser(
        "verify", help="check every checksum and index invariant of a dataset"
    )
    parser.add_argument("dataset", nargs="?", help="dataset URL (or give --url)")
    add_location_arguments(parser, default_url="")
    parser.add_argument(
        "--concurrency", type=int, default=8, help="blocks fetched at once (bounds memory)"
    )
    parser.set_defaults(run=run, parser=parser)


def run(arguments: argparse.Namespace) -> int:
    from tqdm import tqdm

    from rangestream.storage.verify import verify_dataset

    url = arguments.dataset or arguments.url
    if not url:
        arguments.parser.error("give the dataset URL, as an argument or with --url")
    if arguments.concurrency < 1:
        arguments.parser.error("--concurrency must be at least 1")
    with tqdm(unit="block", desc="verify", file=sys.stderr) as bar:

        def set_total(total: int) -> None:
            bar.total = total
            bar.refresh()

        report = verify_dataset(
            url,
            storage_options(arguments),
            progress=bar.update,
            on_total=set_total,
            max_concurrency=arguments.concurrency,
        )
    for line in report.lines():
        print(line)
    return 0 if report.ok else EXIT_DAMAGED
