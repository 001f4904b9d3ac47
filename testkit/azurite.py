"""Azure Blob Storage on loopback: Azurite (the npm package ``azurite``), blob service only.

Installed project-locally by ``make install`` (``npm ci --prefix .ci/node``, into a
gitignored directory); ``RANGESTREAM_AZURITE`` may name another ``azurite-blob`` binary.
It serves the well-known development account ``devstoreaccount1`` at
``http://127.0.0.1:PORT/devstoreaccount1`` and honours ``If-Match`` / ``If-None-Match``.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from testkit.emulator_process import EmulatorError, EmulatorProcess

__all__ = ["ACCOUNT_KEY", "ACCOUNT_NAME", "AZURITE_DIR", "Azurite", "find_azurite"]

#: Azurite's development account (public, documented by Microsoft; not a secret).
ACCOUNT_NAME = "devstoreaccount1"
ACCOUNT_KEY = (
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)
#: Where ``make install`` puts it (``npm ci --prefix``).
AZURITE_DIR = Path(__file__).resolve().parent.parent / ".ci" / "node"


def find_azurite() -> str:
    """The ``azurite-blob`` executable: ``RANGESTREAM_AZURITE``, the project's, or PATH's."""
    named = os.environ.get("RANGESTREAM_AZURITE")
    candidates = [named] if named else []
    candidates += [str(AZURITE_DIR / "node_modules" / ".bin" / "azurite-blob")]
    found = shutil.which("azurite-blob")
    candidates += [found] if found else []
    for candidate in candidates:
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    raise EmulatorError(
        "azurite-blob was not found: run `make install` (npm ci --prefix .ci/node, from "
        "its package-lock.json) or set RANGESTREAM_AZURITE"
    )


class Azurite(EmulatorProcess):
    """``azurite-blob`` on a free port, data in a private directory."""

    name = "azurite"

    def command(self, root: Path) -> list[str]:
        return [
            find_azurite(), "--blobHost", "127.0.0.1", "--blobPort", str(self.port),
            "--location", str(root), "--skipApiVersionCheck", "--loose", "--silent",
        ]  # fmt: skip

    @staticmethod
    def connection_string_for(endpoint_url: str) -> str:
        """The connection string of the account at ``endpoint_url`` (Azurite or a proxy)."""
        return (
            f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT_NAME};AccountKey={ACCOUNT_KEY};"
            f"BlobEndpoint={endpoint_url.rstrip('/')}/{ACCOUNT_NAME};"
        )

    @classmethod
    def storage_options_for(cls, endpoint_url: str) -> dict[str, Any]:
        """adlfs options for the account at ``endpoint_url``."""
        return {"connection_string": cls.connection_string_for(endpoint_url)}

    @property
    def storage_options(self) -> dict[str, Any]:
        return self.storage_options_for(self.endpoint_url)

    def create_container(self, name: str) -> None:
        from azure.storage.blob import BlobServiceClient

        with BlobServiceClient.from_connection_string(
            self.connection_string_for(self.endpoint_url)
        ) as client:
            client.create_container(name)
