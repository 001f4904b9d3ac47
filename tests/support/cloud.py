"""GCS and Azure fixtures: one emulator each per session, a fresh prefix per test.

``gcp-storage-emulator`` (PyPI, in memory) stands in for Google Cloud Storage and Azurite
(npm, installed by ``make install`` into ``.ci/node``) for Azure Blob Storage; both are
started on loopback only when a test needs them, and never skipped: without them the
tests that need them error out. ``cloud_location`` runs a test on both; ``cloud_proxy``
puts a counting ``LatencyProxy`` in front of the test's emulator.

The GCS emulator ignores ``ifGenerationMatch``: rangestream's probe finds commits there
unconditional and refuses them, so tests that write to it declare one writer at a time
(``RANGESTREAM_SINGLE_WRITER=1``), as a user of such a server would; the race test checks
the refusal instead. Azurite honours ``If-Match`` / ``If-None-Match``: no declaration.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from rangestream.io.conditional_writes import SINGLE_WRITER_ANY_ENV, SINGLE_WRITER_ENV
from support.s3 import Location
from testkit import LatencyProxy
from testkit.azurite import Azurite
from testkit.gcs_emulator import GcsEmulator

__all__ = [
    "CloudLocation",
    "azure_location",
    "azurite",
    "cloud_location",
    "cloud_proxy",
    "gcs_emulator",
    "gcs_location",
]

BUCKET = "rangestream-tests"
#: The services of ``cloud_location``, by the id tests are run as.
SERVICES = ("gcs", "azure")


@dataclass(frozen=True)
class CloudLocation(Location):
    """A fresh prefix on one emulator; ``options_for(url)`` points at another endpoint (a
    proxy in front of the same emulator)."""

    service: str = "gcs"
    endpoint_url: str = ""

    def options_for(self, endpoint_url: str) -> dict[str, Any]:
        if self.service == "gcs":
            return GcsEmulator.storage_options_for(endpoint_url)
        return Azurite.storage_options_for(endpoint_url)

    @property
    def conditional_writes(self) -> bool:
        """Whether the emulator honours its service's preconditions (Azurite does)."""
        return self.service == "azure"


@pytest.fixture(scope="session")
def gcs_emulator() -> Iterator[GcsEmulator]:
    with GcsEmulator() as emulator:
        emulator.create_bucket(BUCKET)
        yield emulator


@pytest.fixture(scope="session")
def azurite() -> Iterator[Azurite]:
    with Azurite() as emulator:
        emulator.create_container(BUCKET)
        yield emulator


def _prefix(request: pytest.FixtureRequest) -> str:
    name = "".join(c if c.isalnum() or c in "-_" else "-" for c in request.node.name)
    return f"{name[:60]}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def gcs_location(
    request: pytest.FixtureRequest, gcs_emulator: GcsEmulator, monkeypatch: pytest.MonkeyPatch
) -> CloudLocation:
    """A fresh ``gs://`` prefix; one writer at a time is declared (see the module doc)."""
    monkeypatch.setenv(SINGLE_WRITER_ANY_ENV, "1")
    return CloudLocation(
        url=f"gs://{BUCKET}/{_prefix(request)}", storage_options=gcs_emulator.storage_options,
        service="gcs", endpoint_url=gcs_emulator.endpoint_url,
    )  # fmt: skip


@pytest.fixture
def azure_location(
    request: pytest.FixtureRequest, azurite: Azurite, monkeypatch: pytest.MonkeyPatch
) -> CloudLocation:
    """A fresh ``az://`` prefix; commits are conditional there, nothing is declared."""
    monkeypatch.delenv(SINGLE_WRITER_ANY_ENV, raising=False)
    monkeypatch.delenv(SINGLE_WRITER_ENV, raising=False)
    return CloudLocation(
        url=f"az://{BUCKET}/{_prefix(request)}", storage_options=azurite.storage_options,
        service="azure", endpoint_url=azurite.endpoint_url,
    )  # fmt: skip


@pytest.fixture(params=SERVICES)
def cloud_location(request: pytest.FixtureRequest) -> CloudLocation:
    """The same test on GCS (its emulator) and on Azure (Azurite)."""
    location: CloudLocation = request.getfixturevalue(f"{request.param}_location")
    return location


def counting_proxy(location: CloudLocation) -> Iterator[LatencyProxy]:
    """A counting proxy (no delay, no faults) in front of ``location``'s emulator, for a
    fixture to yield from; open the location with ``location.options_for(proxy.endpoint_url)``."""
    with LatencyProxy(location.endpoint_url, delay=0.0) as proxy:
        yield proxy


@pytest.fixture
def cloud_proxy(cloud_location: CloudLocation) -> Iterator[LatencyProxy]:
    """``counting_proxy`` in front of ``cloud_location``'s emulator."""
    yield from counting_proxy(cloud_location)
