"""Command-line flags every subcommand shares: the dataset URL and how to reach its store.

One calling convention: ``rangestream COMMAND URL [--endpoint-url URL]
[--storage-option KEY=VALUE ...] [--timeout SECONDS]``. Storage options are what a
storage's ``storage_options`` takes (fsspec's, s3fs's for S3); a dotted key reaches into a
nested option (``client_kwargs.region_name=eu-west-1``) and a value that parses as JSON is
taken as such (``anon=true``, ``config_kwargs={"connect_timeout": 3}``).
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from rangestream.errors import CommandLineError
from rangestream.io.retry import RetryPolicy
from rangestream.io.stores import is_local_url


def add_location_arguments(parser: argparse.ArgumentParser, *, default_url: str | None) -> None:
    """The positional ``URL`` (optional when ``default_url`` is given) and how to reach it."""
    help_text = "dataset URL: a local path, s3://bucket/prefix, memory://name, any fsspec URL"
    if default_url is None:
        parser.add_argument("url", metavar="URL", nargs="?", help=help_text)
    else:
        parser.add_argument(
            "url", metavar="URL", nargs="?", help=f"{help_text} (default: {default_url})"
        )
    parser.set_defaults(default_url=default_url)
    # the earlier spelling, still accepted so that scripts keep working
    parser.add_argument("--url", dest="url_option", help=argparse.SUPPRESS)
    add_store_arguments(parser)


def add_store_arguments(parser: argparse.ArgumentParser) -> None:
    """How to reach a store: ``--endpoint-url``, ``--storage-option``, ``--timeout``."""
    parser.add_argument(
        "--endpoint-url",
        help="S3-compatible endpoint (MinIO, SeaweedFS); credentials come from the usual "
        "AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY environment variables or from "
        "--storage-option key=... --storage-option secret=...",
    )
    parser.add_argument(
        "--storage-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a storage option (repeatable); KEY may be dotted "
        "(client_kwargs.region_name=eu-west-1), VALUE is JSON if it parses, else a string",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="how long to keep retrying a failing or unreachable store (default: "
        f"{RetryPolicy().total_timeout:g})",
    )


def dataset_url(arguments: argparse.Namespace) -> str:
    """The dataset URL of the command line, checked to name a possible dataset."""
    positional, option = arguments.url, arguments.url_option
    if positional and option and positional != option:
        raise CommandLineError(f"two dataset URLs given: {positional!r} and --url {option!r}")
    url = positional or option or arguments.default_url
    if not url:
        raise CommandLineError("give the dataset URL, e.g. rangestream inspect s3://bucket/data")
    if is_local_url(url):
        path = url.split("://", 1)[-1] if "://" in url else url
        if os.path.exists(path) and not os.path.isdir(path):
            raise CommandLineError(f"{url} is a file; a dataset is a directory")
    return url


def storage_options(arguments: argparse.Namespace) -> dict[str, Any]:
    """The storage options of ``--storage-option`` and ``--endpoint-url``."""
    options: dict[str, Any] = {}
    for item in arguments.storage_option:
        key, separator, text = item.partition("=")
        if not separator or not key:
            raise CommandLineError(f"--storage-option takes KEY=VALUE, got {item!r}")
        try:
            value: Any = json.loads(text)
        except ValueError:
            value = text
        target = options
        *parents, name = key.split(".")
        for parent in parents:
            nested = target.setdefault(parent, {})
            if not isinstance(nested, dict):
                raise CommandLineError(f"--storage-option {key}: {parent!r} is not a mapping")
            target = nested
        target[name] = value
    if arguments.endpoint_url:
        client_kwargs = options.setdefault("client_kwargs", {})
        if not isinstance(client_kwargs, dict):
            raise CommandLineError("--storage-option client_kwargs must be a mapping")
        client_kwargs["endpoint_url"] = arguments.endpoint_url
    return options


def retry_policy(arguments: argparse.Namespace) -> RetryPolicy:
    """The library's default policy, with ``--timeout`` as its total time if given."""
    if arguments.timeout is None:
        return RetryPolicy()
    if arguments.timeout <= 0:
        raise CommandLineError(f"--timeout must be positive, got {arguments.timeout}")
    return RetryPolicy(
        total_timeout=arguments.timeout, request_timeout=min(30.0, arguments.timeout)
    )
