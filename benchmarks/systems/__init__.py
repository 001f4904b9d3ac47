"""Registry of measured systems.

Entries name a module and class rather than importing them: the orchestrator must not
import the peers (torch, litdata, MosaicML's packages live in other environments), and a
system whose package is missing must still get its row ("not available") in the table.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SystemEntry:
    """Where a system lives and where it runs."""

    name: str
    module: str
    cls: str
    family: str  # systems of one family share prepared data
    locations: tuple[str, ...]
    interpreter: str = "main"  # "main" (this Python) or "mosaic" (benchmarks/.work/venv-mosaic)
    in_quick: bool = True  # False: context-only systems skipped by --quick to keep it short


REGISTRY: tuple[SystemEntry, ...] = (
    SystemEntry("raw-memmap", "benchmarks.systems.raw", "RawMemmap", "raw", ("local",)),
    SystemEntry("raw-pread", "benchmarks.systems.raw", "RawPread", "raw", ("local",)),
    # rangestream: readers and the DataLoader (see rangestream_systems.py)
    SystemEntry(
        "rangestream-sync", "benchmarks.systems.rangestream_systems", "RangestreamSync",
        "rangestream", ("local", "s3"),
    ),
    SystemEntry(
        "rangestream-dataset", "benchmarks.systems.rangestream_systems", "RangestreamDataset",
        "rangestream", ("local",),
    ),
    SystemEntry(
        "rangestream-async", "benchmarks.systems.rangestream_systems", "RangestreamAsync",
        "rangestream", ("local", "s3"),
    ),
    SystemEntry(
        "rangestream-loader", "benchmarks.systems.rangestream_systems", "RangestreamLoader",
        "rangestream", ("local", "s3"),
    ),
    SystemEntry(
        "rangestream-loader-block", "benchmarks.systems.rangestream_systems",
        "RangestreamBlockLoader", "rangestream", ("local", "s3"),
    ),
    SystemEntry(
        "rangestream-loader-mixed", "benchmarks.systems.rangestream_systems",
        "RangestreamMixedLoader", "rangestream", ("local", "s3"),
    ),
    SystemEntry(
        "litdata-window", "benchmarks.systems.litdata_systems", "LitDataWindow",
        "litdata-window", ("local", "s3"),
    ),
    SystemEntry(
        "litdata-dataset", "benchmarks.systems.litdata_systems", "LitDataDataset",
        "litdata-dataset", ("local", "s3"),
    ),
    SystemEntry(
        "litdata-loader", "benchmarks.systems.litdata_systems", "LitDataLoader",
        "litdata-dataset", ("local", "s3"),
    ),
    # Amazon's S3 Connector for PyTorch (S3 only; see s3torch_systems.py)
    SystemEntry(
        "s3torch-map", "benchmarks.systems.s3torch_systems", "S3TorchMap", "s3torch", ("s3",),
    ),
    SystemEntry(
        "s3torch-iterable", "benchmarks.systems.s3torch_systems", "S3TorchIterable", "s3torch",
        ("s3",),
    ),
    SystemEntry(
        "mosaic-dataset", "benchmarks.systems.mosaic_systems", "MosaicDataset", "mosaic",
        ("local", "s3"), interpreter="mosaic",
    ),
    SystemEntry(
        "mosaic-loader", "benchmarks.systems.mosaic_systems", "MosaicLoader", "mosaic",
        ("local", "s3"), interpreter="mosaic",
    ),
)  # fmt: skip

BY_NAME = {e.name: e for e in REGISTRY}
