"""Worker-safe, resumable loading of rangestream datasets into PyTorch.

The pieces, bottom up: :class:`Permutation` (a global shuffle without a per-epoch array),
:class:`EpochPlan` (which rank and worker loads which samples, and the end-of-epoch
policy), :class:`IndexedBatchDataset` / :class:`TemporalBatchDataset` (iterable datasets
that build whole batches in the workers with bounded, in-order prefetch) and
:class:`StatefulDataLoader` (counts the batches it hands out, so it resumes exactly, also
with another worker count, world size or batch size). Collate helpers stack or pad fields.
"""

from rangestream.loader.collate import (
    NextTokenCollate,
    Pad,
    PadCollate,
    length_mask,
    pad_stack,
    stack_collate,
)
from rangestream.loader.dataloader import STATE_VERSION, StatefulDataLoader
from rangestream.loader.iterable import (
    DEFAULT_PREFETCH,
    BatchIterableDataset,
    IndexedBatchDataset,
    resolve_distributed,
)
from rangestream.loader.permutation import Permutation, keyed_hash
from rangestream.loader.plan import EpochPlan
from rangestream.loader.storage_kinds import (
    LoaderOptions,
    register_storage_kind,
    registered_kinds,
    storage_kind,
)
from rangestream.loader.temporal import TemporalBatchDataset, WindowSampler

__all__ = [
    "DEFAULT_PREFETCH",
    "STATE_VERSION",
    "BatchIterableDataset",
    "EpochPlan",
    "IndexedBatchDataset",
    "LoaderOptions",
    "NextTokenCollate",
    "Pad",
    "PadCollate",
    "Permutation",
    "StatefulDataLoader",
    "TemporalBatchDataset",
    "WindowSampler",
    "keyed_hash",
    "length_mask",
    "pad_stack",
    "register_storage_kind",
    "registered_kinds",
    "resolve_distributed",
    "stack_collate",
    "storage_kind",
]
