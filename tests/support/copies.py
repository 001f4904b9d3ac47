"""The ``copies`` fixture: run a mapped-read test with each row copier.

Reads copy rows with ``rangestream.layout.copy.copy_rows``, ``copy_piece`` and
``copy_bytes`` (mapped documents): the compiled helper when it is built, numpy otherwise;
both must give the same arrays and counts.
Executors take the copier when they are made, so the fixture sets it before the test opens
anything. A missing
compiled helper fails the "compiled" case rather than skipping it, so a CI run cannot pass
green without it.
"""

from __future__ import annotations

from typing import Any

import pytest

from rangestream.layout import copy as row_copy

__all__ = ["Copies", "copies"]


class Copies:
    """Which row copy the test runs with, and the calls the compiled one received."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.calls = 0


@pytest.fixture(params=["compiled", "numpy"])
def copies(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Copies:
    used = Copies(request.param)
    if request.param == "numpy":
        monkeypatch.setattr(row_copy, "copy_rows", row_copy.numpy_copy_rows)
        monkeypatch.setattr(row_copy, "copy_piece", row_copy.numpy_copy_piece)
        monkeypatch.setattr(row_copy, "copy_bytes", row_copy.numpy_copy_bytes)
        return used
    assert row_copy.compiled(), (
        "rangestream.layout._chunked is not built: install a C compiler, then reinstall"
    )
    compiled_rows, compiled_piece = row_copy.copy_rows, row_copy.copy_piece
    compiled_bytes = row_copy.copy_bytes

    def counted_rows(*args: Any) -> None:
        used.calls += 1
        compiled_rows(*args)

    def counted_piece(*args: Any) -> int:
        status = compiled_piece(*args)
        if status == 0:
            used.calls += len(args[1])  # one copy per output
        return status

    def counted_bytes(*args: Any) -> bytes | int:
        got = compiled_bytes(*args)
        if type(got) is bytes:
            used.calls += 1
        return got

    monkeypatch.setattr(row_copy, "copy_rows", counted_rows)
    monkeypatch.setattr(row_copy, "copy_bytes", counted_bytes)
    monkeypatch.setattr(row_copy, "copy_piece", counted_piece)
    return used
