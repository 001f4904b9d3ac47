"""The S3 fixtures in tests/support/s3.py: what core tests are allowed to rely on."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import fsspec
import pytest
from support.s3 import ENV_ENDPOINT, Location, S3Location, external_endpoint_from_env

from testkit import S3Endpoint

TESTS_DIR = Path(__file__).resolve().parents[1]
REPO_ROOT = TESTS_DIR.parent
SRC_DIR = REPO_ROOT / "src"


def test_location_is_an_empty_place_that_accepts_writes(location: Location) -> None:
    fs, path = fsspec.core.url_to_fs(location.url, **location.storage_options)
    assert not fs.exists(path) or fs.ls(path) == []

    fs.pipe(f"{path}/probe.bin", b"payload")

    assert fs.cat(f"{path}/probe.bin") == b"payload"
    assert location.is_s3 == location.url.startswith("s3://")


def test_s3_url_is_a_fresh_prefix_named_after_the_test(s3_url: S3Location, s3_bucket: str) -> None:
    assert s3_url.url.startswith(f"s3://{s3_bucket}/test_s3_url_is_a_fresh_prefix_named_after")
    assert s3_url.storage_options["client_kwargs"]["endpoint_url"].startswith("http")
    fs, path = fsspec.core.url_to_fs(s3_url.url, **s3_url.storage_options)
    assert not fs.exists(path)


def test_external_endpoint_without_credentials_is_an_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(ENV_ENDPOINT, "http://127.0.0.1:9")
    for name in (
        "RANGESTREAM_TEST_S3_KEY",
        "RANGESTREAM_TEST_S3_SECRET",
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
    ):
        monkeypatch.delenv(name, raising=False)

    with pytest.raises(RuntimeError, match="no credentials"):
        external_endpoint_from_env()


def test_external_endpoint_falls_back_to_the_standard_aws_variables(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(ENV_ENDPOINT, "http://127.0.0.1:9")
    monkeypatch.delenv("RANGESTREAM_TEST_S3_KEY", raising=False)
    monkeypatch.delenv("RANGESTREAM_TEST_S3_SECRET", raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "aws-key")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "aws-secret")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-west-3")

    assert external_endpoint_from_env() == S3Endpoint(
        endpoint_url="http://127.0.0.1:9",
        access_key="aws-key",
        secret_key="aws-secret",
        region="eu-west-3",
    )


def test_unstartable_seaweedfs_fails_the_run_instead_of_skipping(tmp_path: Path) -> None:
    # A CI run must never go green with its S3 tests silently skipped.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake_weed = bin_dir / "weed"
    fake_weed.write_text("#!/bin/sh\necho 'weed: cannot start' >&2\nexit 1\n")
    fake_weed.chmod(0o755)
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "conftest.py").write_text('pytest_plugins = ("support.s3",)\n')
    (suite / "test_needs_s3.py").write_text(
        textwrap.dedent(
            """
            def test_uses_s3(s3_url):
                assert s3_url.url.startswith("s3://")
            """
        )
    )
    env = {k: v for k, v in os.environ.items() if k != ENV_ENDPOINT}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = os.pathsep.join([str(SRC_DIR), str(TESTS_DIR), str(REPO_ROOT)])

    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(suite)],
        cwd=suite,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert result.returncode == 1, result.stdout + result.stderr
    assert "1 error" in result.stdout
    assert "skipped" not in result.stdout
    assert "weed: cannot start" in result.stdout
