"""``rangestream inspect URL``: what a dataset holds, read from its manifest alone."""

from __future__ import annotations

import argparse
import json
from typing import Any

from rangestream.cli.options import add_location_arguments, storage_options
from rangestream.io.process import run_blocking
from rangestream.io.store import open_store
from rangestream.layout.manifest import ROOT_KEY, parse_root


def register(commands: Any) -> None:
    parser = commands.add_parser("inspect", help="print a dataset's kind, schema and sizes")
    add_location_arguments(parser, default_url=None)
    parser.add_argument("--json", action="store_true", help="print the manifest as JSON")
    parser.set_defaults(run=run)


def run(arguments: argparse.Namespace) -> int:
    from rangestream.errors import DatasetNotFoundError

    store = open_store(arguments.url, storage_options(arguments))

    async def fetch() -> bytes:
        try:
            return await store.get(ROOT_KEY)
        finally:
            await store.aclose()

    try:
        raw = run_blocking(fetch())
    except FileNotFoundError as error:
        raise DatasetNotFoundError(f"no dataset at {arguments.url}") from error
    manifest = parse_root(raw, f"{arguments.url}/{ROOT_KEY}")
    if arguments.json:
        print(json.dumps(manifest.to_attributes(), indent=2))
        return 0
    print(f"dataset   {arguments.url}")
    print(f"kind      {manifest.kind}")
    print(f"commit    {manifest.commit_id}")
    print(f"schema    {json.dumps(manifest.schema)}")
    print(f"shards    {len(manifest.shard_ids)}")
    for name, layout in manifest.arrays.items():
        total = int(manifest.lengths[name].sum())
        print(
            f"array     {name}: {total} rows of {layout.row_nbytes} B, dtype {layout.dtype}, "
            f"{layout.chunk_rows} rows/chunk, {layout.block_rows} rows/block"
        )
    return 0
