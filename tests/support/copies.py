"""The ``copies`` fixture: run a mapped-read test with each way of copying rows.

Mapped reads copy rows with the compiled ``rangestream.layout.chunked.copy_rows`` when it
is built and with numpy otherwise; both must give the same arrays and counts. Readers take
``chunked.copy_rows`` when they are made, so the fixture sets it before the test opens
anything. A missing compiled helper fails the "compiled" case rather than skipping it, so a
CI run cannot pass green without it.
"""

from __future__ import annotations

from typing import Any

import pytest

from rangestream.layout import chunked

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
        monkeypatch.setattr(chunked, "copy_rows", None)
        return used
    compiled = chunked.copy_rows
    assert compiled is not None, (
        "rangestream.layout._chunked is not built: install a C compiler, then reinstall"
    )

    def counted(*args: Any) -> None:
        used.calls += 1
        compiled(*args)

    monkeypatch.setattr(chunked, "copy_rows", counted)
    return used
