"""Test and benchmark infrastructure: a local S3 server and a latency/fault-injecting proxy.

Shipped inside the package (rather than under tests/) so benchmarks and downstream projects
can measure rangestream against real S3 semantics with the same tools its own tests use.
Importing it requires the ``dev`` extra only for ``SeaweedFSServer`` (the ``weed`` binary).
"""

from rangestream.testing.proxy import FaultConfig, FaultKind, LatencyProxy, ProxyStats
from rangestream.testing.seaweedfs import (
    DEFAULT_ACCESS_KEY,
    DEFAULT_REGION,
    DEFAULT_SECRET_KEY,
    S3Endpoint,
    SeaweedFSError,
    SeaweedFSServer,
    find_weed_binary,
    validate_bucket_name,
)

__all__ = [
    "DEFAULT_ACCESS_KEY",
    "DEFAULT_REGION",
    "DEFAULT_SECRET_KEY",
    "FaultConfig",
    "FaultKind",
    "LatencyProxy",
    "ProxyStats",
    "S3Endpoint",
    "SeaweedFSError",
    "SeaweedFSServer",
    "find_weed_binary",
    "validate_bucket_name",
]
