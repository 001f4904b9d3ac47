"""The lean read client takes its configuration from where botocore takes it, so reads (lean
client) and writes (s3fs) of one storage go to the same endpoint, signed for the same region,
over the same TLS: each setting is checked by what a recording proxy in front of the test
server sees (the Host, the SigV4 credential scope, https or not) for a write and a read.

Before, a profile's region signed writes for eu-west-1 and reads for us-east-1; a profile's
``endpoint_url`` sent writes to the endpoint and reads to AWS; ``AWS_CA_BUNDLE`` failed
every read's certificate check, retried for two minutes as "unreachable".
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.recording_proxy import RecordingProxy, recording_proxy

from rangestream.io import S3Store
from rangestream.io.process import run_blocking
from rangestream.io.s3 import _LeanReads
from rangestream.io.s3_options import lean_read_config
from testkit import S3Endpoint

AWS_SETTINGS = (
    "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_REGION", "AWS_DEFAULT_REGION",
    "AWS_PROFILE", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE", "AWS_CA_BUNDLE",
    "AWS_IGNORE_CONFIGURED_ENDPOINT_URLS", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
)  # fmt: skip


@pytest.fixture
def aws_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> pytest.MonkeyPatch:
    """No AWS setting of the machine's; an empty config file unless a test writes one."""
    for name in AWS_SETTINGS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "credentials"))
    return monkeypatch


@pytest.fixture
def proxy(s3_server: S3Endpoint, s3_bucket: str) -> Iterator[RecordingProxy]:
    with recording_proxy(s3_server.endpoint_url) as recording:
        yield recording


def profile(tmp_path: Path, text: str) -> None:
    (tmp_path / "config").write_text(text)


def write_then_read(
    url: str, options: dict[str, Any], proxy: RecordingProxy
) -> tuple[bytes, list[Any], list[Any]]:
    """A PUT through s3fs, then a range read through the lean client, as a storage does."""
    store = S3Store(url, options)
    assert isinstance(store._reads, _LeanReads)
    data = uuid.uuid4().bytes * 100

    async def run() -> bytes:
        try:
            await store.put("obj", data)
            writes = len(proxy.requests)
            got = await store.get_range("obj", 10, 1000)
            return got, writes
        finally:
            await store.aclose()

    got, writes = run_blocking(run())
    assert got == data[10:1000]
    return got, proxy.requests[:writes], proxy.requests[writes:]


def keys(s3_server: S3Endpoint) -> dict[str, Any]:
    return {"key": s3_server.access_key, "secret": s3_server.secret_key}


def test_the_profiles_region_signs_reads_as_it_signs_writes(
    aws_env: pytest.MonkeyPatch, tmp_path: Path, proxy: RecordingProxy, s3_server: S3Endpoint,
    s3_bucket: str,
) -> None:  # fmt: skip
    profile(tmp_path, "[default]\nregion = eu-west-1\n")
    options = {**keys(s3_server), "client_kwargs": {"endpoint_url": proxy.endpoint_url}}
    _, writes, reads = write_then_read(f"s3://{s3_bucket}/cfg-{uuid.uuid4().hex}", options, proxy)
    assert {r.region for r in writes} == {r.region for r in reads} == {"eu-west-1"}


def test_region_name_wins_over_the_profile_for_reads_and_writes(
    aws_env: pytest.MonkeyPatch, tmp_path: Path, proxy: RecordingProxy, s3_server: S3Endpoint,
    s3_bucket: str,
) -> None:  # fmt: skip
    profile(tmp_path, "[default]\nregion = eu-west-1\n")
    aws_env.setenv("AWS_DEFAULT_REGION", "ap-south-1")  # the environment wins over the file
    client_kwargs = {"endpoint_url": proxy.endpoint_url, "region_name": "us-west-2"}
    options = {**keys(s3_server), "client_kwargs": client_kwargs}
    _, writes, reads = write_then_read(f"s3://{s3_bucket}/cfg-{uuid.uuid4().hex}", options, proxy)
    assert {r.region for r in writes} == {r.region for r in reads} == {"us-west-2"}
    assert lean_read_config({"key": "k", "secret": "s"}).region == "ap-south-1"  # type: ignore[union-attr]


@pytest.mark.parametrize("where", ["profile", "services", "env-s3", "env-global"])
def test_a_configured_endpoint_takes_reads_and_writes_alike(
    where: str, aws_env: pytest.MonkeyPatch, tmp_path: Path, proxy: RecordingProxy,
    s3_server: S3Endpoint, s3_bucket: str,
) -> None:  # fmt: skip
    url = proxy.endpoint_url
    if where == "profile":
        profile(tmp_path, f"[default]\nendpoint_url = {url}\n")
    elif where == "services":
        profile(
            tmp_path, f"[default]\nservices = here\n[services here]\ns3 =\n  endpoint_url = {url}\n"
        )
    else:
        aws_env.setenv("AWS_ENDPOINT_URL_S3" if where == "env-s3" else "AWS_ENDPOINT_URL", url)
    _, writes, reads = write_then_read(
        f"s3://{s3_bucket}/cfg-{uuid.uuid4().hex}", keys(s3_server), proxy
    )
    host = url.split("://", 1)[1]
    assert writes and reads
    assert {r.host for r in writes} == {r.host for r in reads} == {host}
    assert {r.path.split("/")[1] for r in reads} == {s3_bucket}  # path style on a custom one


def test_a_ca_bundle_from_the_environment_or_the_profile_is_trusted_by_reads_and_writes(
    aws_env: pytest.MonkeyPatch, tmp_path: Path, s3_server: S3Endpoint, s3_bucket: str
) -> None:
    with recording_proxy(s3_server.endpoint_url, tls_dir=tmp_path) as tls:
        assert tls.ca_bundle is not None
        options = {**keys(s3_server), "client_kwargs": {"endpoint_url": tls.endpoint_url}}
        aws_env.setenv("AWS_CA_BUNDLE", str(tls.ca_bundle))
        _, writes, reads = write_then_read(f"s3://{s3_bucket}/tls-{uuid.uuid4().hex}", options, tls)
        assert writes and reads and all(r.tls for r in writes + reads)
        aws_env.delenv("AWS_CA_BUNDLE")
        profile(tmp_path, f"[default]\nca_bundle = {tls.ca_bundle}\n")
        tls.requests.clear()
        _, writes, reads = write_then_read(f"s3://{s3_bucket}/tls-{uuid.uuid4().hex}", options, tls)
        assert writes and reads and all(r.tls for r in writes + reads)


def test_the_profiles_addressing_style_is_the_lean_clients(
    aws_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    profile(tmp_path, "[default]\ns3 =\n  addressing_style = path\n")
    config = lean_read_config({"key": "k", "secret": "s"})
    assert config is not None and config.addressing_style == "path"
    virtual = {"s3": {"addressing_style": "virtual"}}
    explicit = lean_read_config({"key": "k", "secret": "s", "config_kwargs": virtual})
    assert explicit is not None and explicit.addressing_style == "virtual"
    profile(tmp_path, "[default]\ns3 =\n  use_accelerate_endpoint = true\n")
    assert lean_read_config({"key": "k", "secret": "s"}) is None  # not reproduced: s3fs reads
