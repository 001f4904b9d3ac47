"""``rangestream convert INPUT... --to URL --preset P --tokenizer T``: tokenize into a dataset."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from rangestream.cli.options import add_store_arguments, retry_policy, storage_options


def register(commands: Any) -> None:
    from rangestream.ingest.inputs import DEFAULT_SPLIT_BYTES
    from rangestream.ingest.preset import TOO_LONG, Fields
    from rangestream.ingest.presets import PRESETS

    parser = commands.add_parser(
        "convert",
        help="tokenize JSONL, Parquet or text files into a dataset (presets seq, sft, dpo, grpo)",
    )
    parser.add_argument(
        "inputs", nargs="+", metavar="INPUT", help="files, globs, directories or URLs"
    )
    parser.add_argument("--to", dest="url", required=True, help="dataset URL to write")
    parser.add_argument("--preset", required=True, choices=sorted(PRESETS))
    parser.add_argument(
        "--tokenizer",
        required=True,
        help="'bytes', a tokenizer.json or a local tokenizer directory",
    )
    parser.add_argument("--workers", type=int, help="worker processes (default: the usable cores)")
    parser.add_argument(
        "--scheduler", help="run the tasks on this Dask scheduler (tcp://host:port)"
    )
    add_store_arguments(parser)  # for the inputs and the output alike
    for name in (f.name for f in Fields.__dataclass_fields__.values()):
        parser.add_argument(f"--{name}-field", dest=f"field_{name}", metavar="NAME",
                            help=f"input field holding the {name} (default {name!r})")  # fmt: skip
    parser.add_argument("--max-len", type=int, help="longest record, in tokens")
    parser.add_argument("--too-long", choices=TOO_LONG, default="error",
                        help="what to do with longer documents (default: error)")  # fmt: skip
    parser.add_argument("--max-row-bytes", type=int, metavar="BYTES",
                        help="longest input row; a longer one is a bad row (default: 64 "
                        "bytes per --max-len token, at least 1 MiB; 256 MiB without "
                        "--max-len)")  # fmt: skip
    parser.add_argument("--skip-bad", action="store_true", help="skip bad rows, listing them")
    parser.add_argument("--rejects", help="where to list skipped rows (default URL/rejects.jsonl)")
    parser.add_argument("--eos-token", help="end-of-text token (default: the tokenizer's)")
    parser.add_argument("--chat-template", help="file holding a Jinja chat template")
    parser.add_argument("--input-format", choices=["jsonl", "parquet", "text"])
    parser.add_argument("--split-bytes", type=int, default=DEFAULT_SPLIT_BYTES, metavar="BYTES",
                        help="bytes of plain JSONL per split (one task, one shard; "
                        "default: %(default)s)")  # fmt: skip
    parser.add_argument("--resume", action="store_true", help="continue an interrupted conversion")
    parser.add_argument("--overwrite", action="store_true", help="replace a dataset at URL")
    parser.add_argument(
        "--append", action="store_true", help="add the inputs as new shards of the dataset at URL"
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.set_defaults(run=run)


def run(arguments: argparse.Namespace) -> int:
    from rangestream.ingest import convert

    fields = {
        key.removeprefix("field_"): value
        for key, value in vars(arguments).items()
        if key.startswith("field_") and value is not None
    }
    client = None
    executor = None
    if arguments.scheduler:
        from distributed import Client

        client = Client(arguments.scheduler)
        executor = client.get_executor()
    try:
        summary = convert(
            arguments.inputs,
            arguments.url,
            preset=arguments.preset,
            tokenizer=arguments.tokenizer,
            workers=arguments.workers,
            executor=executor,
            fields=fields,
            max_len=arguments.max_len,
            too_long=arguments.too_long,
            max_row_bytes=arguments.max_row_bytes,
            skip_bad=arguments.skip_bad,
            rejects=arguments.rejects,
            eos_token=arguments.eos_token,
            chat_template=arguments.chat_template,
            storage_options=storage_options(arguments),
            input_format=arguments.input_format,
            split_bytes=arguments.split_bytes,
            overwrite=arguments.overwrite,
            mode="append" if arguments.append else None,
            resume=arguments.resume,
            progress=not arguments.no_progress,
            retry=retry_policy(arguments),
        )
    finally:
        if client is not None:
            client.close()
    print(summary, file=sys.stdout)
    return 0
