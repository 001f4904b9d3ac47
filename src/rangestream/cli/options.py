"""Command-line flags shared by subcommands: the dataset URL and how to reach its store."""

from __future__ import annotations

import argparse
from typing import Any


def add_location_arguments(parser: argparse.ArgumentParser, *, default_url: str | None) -> None:
    parser.add_argument(
        "--url",
        default=default_url,
        required=default_url is None,
        help="dataset URL: a local path, s3://bucket/prefix, memory://name, any fsspec URL",
    )
    parser.add_argument(
        "--endpoint-url",
        help="S3-compatible endpoint (MinIO, SeaweedFS); credentials come from the usual "
        "AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY environment variables",
    )


def storage_options(arguments: argparse.Namespace) -> dict[str, Any]:
    if not arguments.endpoint_url:
        return {}
    return {"client_kwargs": {"endpoint_url": arguments.endpoint_url}}
