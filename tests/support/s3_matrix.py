"""The S3 server matrix: the correctness core runs on SeaweedFS, moto server and rclone.

Every S3 test runs on the session's SeaweedFS (or the external endpoint). Tests marked
``s3_core`` (range reads, windows exact, listings, commits, conflicts, gc, verify) also run
on moto server and rclone ``serve s3``: their ``s3_server`` fixture is parametrised
(``[moto]``, ``[rclone]`` cases; a test on ``location`` gets ``[s3-moto]``, ``[s3-rclone]``
beside ``[local]`` and ``[s3]``). ``RANGESTREAM_TEST_S3_MATRIX`` lists the extra servers
(default ``moto,rclone``; empty for SeaweedFS only).

``@pytest.mark.s3_limit("moto", "why")`` marks a test that server cannot pass for a
documented reason of that server: that case is an expected failure (strict: a server that
starts passing it shows up; ``strict=False`` for a race the server loses only sometimes).
rclone ignores ``If-Match`` / ``If-None-Match``, so commits
there are refused unless one writer at a time is declared: its cases run with
``RANGESTREAM_S3_SINGLE_WRITER=1``, as a user of rclone would, and the concurrent-commit
tests carry an ``s3_limit`` for it (tests/storage/test_conditional_commits.py shows the
refusal instead).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

__all__ = ["EXTRA_KINDS", "MATRIX_ENV", "NO_SERVER", "SEAWEEDFS", "extra_kinds"]

MATRIX_ENV = "RANGESTREAM_TEST_S3_MATRIX"
SEAWEEDFS = "seaweedfs"
NO_SERVER = "none"
EXTRA_KINDS = ("moto", "rclone")
_SINGLE_WRITER_ENV = "RANGESTREAM_S3_SINGLE_WRITER"


def extra_kinds() -> list[str]:
    """The servers the ``s3_core`` tests run on besides SeaweedFS."""
    named = os.environ.get(MATRIX_ENV)
    if named is None:
        return list(EXTRA_KINDS)
    kinds = [kind.strip() for kind in named.split(",") if kind.strip()]
    unknown = set(kinds) - set(EXTRA_KINDS)
    if unknown:
        raise pytest.UsageError(f"{MATRIX_ENV}: unknown S3 servers {sorted(unknown)}")
    return kinds


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "s3_core: also run on moto server and rclone serve s3 (the S3 matrix)"
    )
    config.addinivalue_line(
        "markers", "s3_limit(kind, reason): a documented limit of that S3 server (xfail there)"
    )


@pytest.hookimpl(tryfirst=True)  # before parametrize marks and fixture params are applied
def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if metafunc.definition.get_closest_marker("s3_core") is None:
        return
    kinds = extra_kinds()
    names = metafunc.fixturenames
    if "location" in names:
        # the local case starts no server, unless the test also asks for one itself
        local = SEAWEEDFS if "s3_server" in names else NO_SERVER
        if "s3_server" not in names:
            names.append("s3_server")  # so each case picks its server
        cases = [("local", local), ("s3", SEAWEEDFS), *[("s3", kind) for kind in kinds]]
        ids = ["local", "s3", *[f"s3-{kind}" for kind in kinds]]
        # a mark, not metafunc.parametrize: pytest then leaves out the fixture's own params
        metafunc.definition.add_marker(
            pytest.mark.parametrize(("location", "s3_server"), cases, ids=ids, indirect=True)
        )
    elif "s3_server" in names:
        metafunc.parametrize("s3_server", [SEAWEEDFS, *kinds], indirect=True, scope="session")


def _kind(item: pytest.Item) -> str:
    callspec = getattr(item, "callspec", None)
    return str(callspec.params.get("s3_server", SEAWEEDFS)) if callspec else SEAWEEDFS


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        kind = _kind(item)
        for mark in item.iter_markers("s3_limit"):
            limited, reason = mark.args
            if limited == kind:
                strict = bool(mark.kwargs.get("strict", True))  # False: may pass by luck
                item.add_marker(pytest.mark.xfail(reason=f"{kind}: {reason}", strict=strict))


@pytest.fixture(autouse=True)
def _server_declarations(request: pytest.FixtureRequest) -> Iterator[None]:
    """On rclone, declare one writer at a time, as its users must (it ignores conditions)."""
    if _kind(request.node) != "rclone":
        yield
        return
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(_SINGLE_WRITER_ENV, "1")
        yield
