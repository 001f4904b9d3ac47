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
    from rangestream.errors import DatasetNotFoundError
    from rangestream.storage.maintenance.summary import summarize_dataset

    url, options = dataset_url(arguments), storage_options(arguments)
    try:
        summary = summarize_dataset(url, options, retry=retry_policy(arguments))
    except DatasetNotFoundError:
        writing = in_progress(url, options)
        if writing is None:
            raise
        summary = None  # a first write, not committed yet: show what it has done
    else:
        writing = in_progress(url, options)
    if arguments.json:
        document = summary.to_json() if summary is not None else {"dataset": url}
        print(json.dumps({**document, "in_progress": writing}, indent=2))
        return 0
    for line in summary.lines() if summary is not None else [f"dataset   {url} (no commit yet)"]:
        print(line)
    if writing is not None:
        print(in_progress_line(writing))
    return 0


def in_progress(url: str, options: dict[str, Any]) -> dict[str, Any] | None:
    """The write in progress at ``url`` (its session file), or ``None``: when it started,
    the splits it has written, its last heartbeat and whether its lease holds."""
    import time

    from rangestream.io.process import run_blocking
    from rangestream.io.stores import open_store
    from rangestream.storage.core.live_versions import read_lease
    from rangestream.storage.core.store_errors import library_errors

    async def read() -> dict[str, Any] | None:
        store = open_store(url, options)
        try:
            lease = await read_lease(store)
            if lease is None:
                return None
            parts = [k for k in await store.list(f"{lease.prefix}/parts") if k.endswith(".json")]
        finally:
            await store.aclose()
        now = time.time()
        return {
            "commit_id": lease.commit_id,
            "started": lease.started,
            "splits": lease.splits,
            "splits_done": len(parts),
            "heartbeat_age_seconds": None if lease.heartbeat is None else now - lease.heartbeat,
            "running": lease.until > now,
        }

    with library_errors(f"reading {url}/in_progress/session.json"):
        return run_blocking(read())


def in_progress_line(writing: dict[str, Any]) -> str:
    of = f" of {writing['splits']}" if writing["splits"] is not None else ""
    age = writing["heartbeat_age_seconds"]
    beat = "" if age is None else f", last heartbeat {age:.0f} s ago"
    state = "running" if writing["running"] else "stopped: convert --resume continues it"
    return (
        f"writing   {writing['commit_id']} since {writing['started']}: "
        f"{writing['splits_done']}{of} splits written{beat} ({state})"
    )
