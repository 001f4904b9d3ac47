"""``rangestream demo``: the README's main job, locally and on S3, in a fresh process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from support.s3 import S3Location

from testkit import S3Endpoint

SMALL = ["--tokens", "200000", "--shards", "2", "--sequence-length", "256"]


def run_demo(
    arguments: list[str], env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", "from rangestream.cli.main import main; raise SystemExit(main())",
         "demo", *arguments, *SMALL],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **(env or {})},
    )  # fmt: skip


def check(result: subprocess.CompletedProcess[str]) -> None:
    assert result.returncode == 0, result.stderr
    assert "wrote 200,000 tokens in 2 shards" in result.stdout
    assert "streamed 776 windows of 256 tokens with 2 workers" in result.stdout
    # nothing logged on the way (an s3fs session closed on the wrong loop used to be)
    assert "Traceback" not in result.stderr and "never retrieved" not in result.stderr


def test_the_demo_writes_and_streams_a_local_dataset(tmp_path: Path) -> None:
    check(run_demo([str(tmp_path / "tokens")]))


def test_the_demo_writes_and_streams_on_s3_with_credentials_from_the_environment(
    s3_url: S3Location, s3_server: S3Endpoint
) -> None:
    env = {
        "AWS_ACCESS_KEY_ID": s3_server.access_key,
        "AWS_SECRET_ACCESS_KEY": s3_server.secret_key,
    }
    check(run_demo([s3_url.url, "--endpoint-url", s3_server.endpoint_url], env))
