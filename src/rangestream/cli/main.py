"""Entry point of the ``rangestream`` command: one subcommand per module of this package."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from rangestream.errors import RangestreamError


def main(argv: Sequence[str] | None = None) -> int:
    from rangestream.cli import convert, demo, inspect, verify

    parser = argparse.ArgumentParser(
        prog="rangestream", description="Stream training data out of object storage."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    for module in (convert, demo, inspect, verify):
        module.register(commands)
    arguments = parser.parse_args(argv)
    try:
        return int(arguments.run(arguments) or 0)
    except RangestreamError as error:
        print(f"rangestream {arguments.command}: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
