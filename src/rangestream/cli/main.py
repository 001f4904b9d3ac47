"""Entry point of the ``rangestream`` command: one subcommand per module of this package.

Every subcommand takes the dataset URL as its positional argument and the options of
``cli/options.py``. Every failure ends the same way: one line on stderr naming the
command and what failed, exit status 2 (``verify`` uses 1 for damage it found), never a
traceback. Library errors say what is wrong in their message; anything else (an error of
a client library the library did not foresee) is shown as its type and message.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import sys
from collections.abc import Sequence

from rangestream.errors import RangestreamError

#: Exit status of a command that failed (argparse uses 2 for usage errors too).
EXIT_FAILED = 2
#: Set to print the traceback of an unexpected error as well (for bug reports).
DEBUG_ENVIRONMENT = "RANGESTREAM_DEBUG"


def _version() -> str:
    from rangestream import __version__

    return __version__


def main(argv: Sequence[str] | None = None) -> int:
    from rangestream.cli import cache, convert, demo, gc, inspect, verify

    parser = argparse.ArgumentParser(
        prog="rangestream", description="Stream training data out of object storage."
    )
    parser.add_argument("--version", action="version", version=f"rangestream {_version()}")
    commands = parser.add_subparsers(dest="command", required=True)
    for module in (convert, demo, inspect, verify, gc, cache):
        module.register(commands)
    arguments = parser.parse_args(argv)
    handler = _show_warnings(arguments.command)
    try:
        return int(arguments.run(arguments) or 0)
    except KeyboardInterrupt as interrupted:
        # what was interrupted says how far it got and how to go on (its notes)
        notes = " ".join(getattr(interrupted, "__notes__", ()))
        _fail(arguments.command, f"interrupted. {notes}".strip())
        return 130
    except RangestreamError as error:
        _fail(arguments.command, str(error))
    except Exception as error:  # a client library's own error: still one line
        if os.environ.get(DEBUG_ENVIRONMENT):
            raise
        _fail(arguments.command, f"{type(error).__name__}: {error}")
    finally:
        if handler is not None:
            logging.getLogger("rangestream").removeHandler(handler)
    return EXIT_FAILED


#: ``overwrite=True (--overwrite)`` in a library message: the command shows the flag only.
_ARGUMENT_AND_FLAG = re.compile(r"\b[a-z_]+=(?:True|'[a-z]+')\s+\((--[a-z-]+)\)")


def _show_warnings(command: str) -> logging.Handler | None:
    """Print the library's warnings (an endpoint retried while unreachable) on stderr,
    prefixed as the command's other messages are; a logging setup of the caller's wins.
    Returns the handler added, which ``main`` removes when the command ends."""
    logger = logging.getLogger("rangestream")
    if logger.handlers or logging.getLogger().handlers:
        return None
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(f"rangestream {command}: %(message)s"))
    handler.setLevel(logging.WARNING)
    logger.addHandler(handler)
    return handler


def _fail(command: str, message: str) -> None:
    line = " ".join(message.split())  # one line, whatever the message holds
    line = _ARGUMENT_AND_FLAG.sub(r"\1", line)
    print(f"rangestream {command}: {line}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
