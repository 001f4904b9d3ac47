"""Run configuration: sizes, seeds, time budgets and paths, in one place.

Every figure in the report must be reproducible from the command line that produced it, so
all knobs live here as named values and the report prints the ones that were used.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
BENCH_DIR = REPO_ROOT / "benchmarks"
WORK_DIR = BENCH_DIR / ".work"
DOCS_DIR = REPO_ROOT / "docs"
MOSAIC_VENV = WORK_DIR / "venv-mosaic"

# SeaweedFS serves objects above 4 MiB as 4 MiB pieces, which makes range GETs much slower
# (ARCHITECTURE.md). Real S3 has no such cliff, so every system's objects are kept below it.
OBJECT_BYTES = 4 * 1024 * 1024
# Chunk/shard byte limit handed to LitData and MosaicML: below OBJECT_BYTES with room for
# their own headers, so that each of their objects is also served as one piece.
PEER_CHUNK_BYTES = OBJECT_BYTES - 64 * 1024

# The DataLoader rows (rangestream and LitData): worker processes and rows per batch.
LOADER_WORKERS = 2
LOADER_BATCH = 8

WORKLOADS = ("tokens-random", "tokens-sequential", "tokens-shuffled", "temporal", "documents")
#: workloads only DataLoaders run: a shuffled epoch, in the order each loader chooses (the
#: systems return every window of the list once, in their own order: ``Support.any_order``)
LOADER_WORKLOADS = ("tokens-shuffled",)
#: the section of the report measured from emitted orders, not by the timing loop
SHUFFLE_QUALITY = "shuffle-quality"
DATASET_OF_WORKLOAD = {
    "tokens-random": "tokens",
    "tokens-sequential": "tokens",
    "tokens-shuffled": "tokens",
    "temporal": "temporal",
    "documents": "documents",
}


@dataclass(frozen=True)
class DataSizes:
    """Sizes of the generated data; ``quick`` shrinks them for development runs."""

    token_total: int  # approximate total tokens (documents are drawn until reached)
    token_doc_min: int = 50
    token_doc_max: int = 4000
    window_tokens: int = 2049  # 2048 (+1 for the shifted target)
    window_stride: int = 2048  # sequential windows overlap by the +1 token
    random_windows: int = 65536
    temporal_records: int = 200
    temporal_frames_min: int = 300
    temporal_frames_max: int = 1500
    temporal_window_frames: int = 64
    temporal_windows: int = 65536
    documents: int = 10000
    document_bytes_min: int = 64
    document_bytes_max: int = 65536
    document_batch: int = 16
    document_batches: int = 8192


FULL_SIZES = DataSizes(token_total=20_000_000)
QUICK_SIZES = DataSizes(
    token_total=2_000_000,
    temporal_records=50,
    documents=1000,
    document_batch=8,
)


@dataclass(frozen=True)
class ShuffleSizes:
    """The stream whose shuffled orders are measured (``benchmarks/shuffle_quality.py``)."""

    tokens: int  # token i has value i, so a window's first token is its position
    epochs: int  # figures are means over epochs, with their spread


FULL_SHUFFLE = ShuffleSizes(tokens=64_000_000, epochs=3)  # 244 MiB, 61 neighbourhoods of 4 MiB
QUICK_SHUFFLE = ShuffleSizes(tokens=16_000_000, epochs=1)


@dataclass(frozen=True)
class Budget:
    """Time budgets: bounded so a full run stays well under 30 min on a 2-core box."""

    repeats: int
    repeat_seconds: float
    warmup_seconds: float
    max_windows_per_repeat: int
    worker_timeout_s: float  # one worker subprocess (a system at a location, all workloads)
    prepare_timeout_s: float
    verify_windows: int = 5  # windows compared byte for byte with the expected payload


FULL_BUDGET = Budget(
    repeats=5,
    repeat_seconds=1.2,
    warmup_seconds=0.4,
    max_windows_per_repeat=200_000,
    worker_timeout_s=420,
    prepare_timeout_s=600,
)
QUICK_BUDGET = Budget(
    repeats=3,
    repeat_seconds=0.25,
    warmup_seconds=0.05,
    max_windows_per_repeat=50_000,
    worker_timeout_s=180,
    prepare_timeout_s=300,
    verify_windows=3,
)

SEED = 20240611
TEMPORAL_FIELDS = ("features", "clock", "valid", "pose")
TEMPORAL_GROUPS = (("clock", "valid", "pose"),)
TEMPORAL_WINDOW_FIELDS = ("features", "pose")


def _format_versions() -> tuple[int, ...]:
    from rangestream.layout.manifest import FORMAT_VERSION
    from rangestream.storage.temporal.schema import SCHEMA_VERSION

    return (FORMAT_VERSION, SCHEMA_VERSION)


@dataclass(frozen=True)
class RunConfig:
    """Everything one ``run`` was asked to do; serialised into each worker's spec."""

    quick: bool
    latency_ms: float
    concurrency: tuple[int, ...] = (1, 16, 64)
    workloads: tuple[str, ...] = WORKLOADS
    systems: tuple[str, ...] | None = None  # None = all registered
    sizes: DataSizes = field(default_factory=lambda: FULL_SIZES)
    budget: Budget = field(default_factory=lambda: FULL_BUDGET)
    shuffle: ShuffleSizes | None = None  # None: the shuffle-quality section is left out
    seed: int = SEED
    #: rangestream's stored format versions, read where rangestream is importable (the
    #: parent); workers in other environments get them from the serialised config
    format_versions: tuple[int, ...] = field(default_factory=lambda: _format_versions())

    @property
    def tag(self) -> str:
        """Directory tag of the generated data: quick and full data never mix."""
        return "quick" if self.quick else "full"

    @property
    def data_dir(self) -> Path:
        return WORK_DIR / "data" / self.tag

    @property
    def prepared_dir(self) -> Path:
        return WORK_DIR / "prepared" / self.tag

    def data_key(self) -> str:
        """Hash of what determines the generated bytes, to reuse data between runs.

        rangestream's stored format versions are part of it: prepared data written in an
        older layout would no longer open.
        """
        blob = json.dumps(
            {
                "sizes": dataclasses.asdict(self.sizes),
                "seed": self.seed,
                "format": list(self.format_versions),
            },
            sort_keys=True,
        )
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def to_json(self) -> dict[str, object]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, object]) -> RunConfig:
        d = dict(data)
        d["sizes"] = DataSizes(**d["sizes"])  # type: ignore[arg-type]
        d["budget"] = Budget(**d["budget"])  # type: ignore[arg-type]
        if d.get("shuffle") is not None:
            d["shuffle"] = ShuffleSizes(**d["shuffle"])  # type: ignore[arg-type]
        d["concurrency"] = tuple(d["concurrency"])  # type: ignore[arg-type]
        d["format_versions"] = tuple(d.get("format_versions", ()))  # type: ignore[arg-type]
        d["workloads"] = tuple(d["workloads"])  # type: ignore[arg-type]
        if d.get("systems") is not None:
            d["systems"] = tuple(d["systems"])  # type: ignore[arg-type]
        return cls(**d)  # type: ignore[arg-type]
