"""A Google Cloud Storage emulator on loopback: ``gcp-storage-emulator`` (PyPI), in memory.

It speaks the JSON API gcsfs uses (media downloads with ``Range``, multipart uploads,
listings) without credentials (``token="anon"``). It does not implement preconditions:
``ifGenerationMatch`` is accepted and ignored, so rangestream's probe finds that commits
there are not conditional (tests say so for this emulator).
"""

from __future__ import annotations

import json
import sys
import urllib.request
from pathlib import Path
from typing import Any

from testkit.emulator_process import EmulatorError, EmulatorProcess

__all__ = ["GcsEmulator"]


class GcsEmulator(EmulatorProcess):
    """``gcp-storage-emulator start --in-memory`` on a free port; ``storage_options`` for
    gcsfs, ``create_bucket`` through the JSON API."""

    name = "gcs emulator"
    ready_path = "/storage/v1/b"

    def command(self, root: Path) -> list[str]:
        script = Path(sys.executable).parent / "gcp-storage-emulator"
        if not script.exists():
            raise EmulatorError("gcp-storage-emulator was not found: install the dev extra")
        return [str(script), "start", "--host", "127.0.0.1", "--port", str(self.port),
                "--in-memory", "--quiet"]  # fmt: skip

    @property
    def storage_options(self) -> dict[str, Any]:
        return self.storage_options_for(self.endpoint_url)

    @staticmethod
    def storage_options_for(endpoint_url: str) -> dict[str, Any]:
        """gcsfs options for the emulator (or a proxy in front of it) at ``endpoint_url``."""
        return {"endpoint_url": endpoint_url, "token": "anon", "project": "rangestream-test"}

    def create_bucket(self, name: str) -> None:
        request = urllib.request.Request(
            f"{self.endpoint_url}/storage/v1/b?project=rangestream-test",
            data=json.dumps({"name": name}).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        urllib.request.urlopen(request, timeout=10).close()
