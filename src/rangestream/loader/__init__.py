"""Worker-safe, resumable loading of rangestream datasets into PyTorch.

The pieces, bottom up: a :class:`SampleSource` says what is read and in which order
(:class:`IndexedSource` for windows and documents, :class:`TemporalWindowSource` for random
temporal windows, :class:`MixedSource` for weighted mixtures); :class:`Permutation` and
:class:`BlockShuffle` shuffle without per-epoch arrays; :class:`EpochPlan` says which rank
and worker loads which samples; :class:`BatchOptions` says how batches are cut;
:class:`BatchIterableDataset` builds whole batches in the workers with bounded, in-order
prefetch; :class:`StatefulDataLoader` hands them out and advances the
:class:`LoaderPosition`, so it resumes exactly, also with another worker count, world size
or batch size. Collate helpers stack or pad fields.
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
from rangestream.loader.iterable import BatchIterableDataset
from rangestream.loader.model_batches import (
    IGNORE_INDEX,
    CausalLMCollate,
    DpoCollate,
    SftCollate,
    VarlenCollate,
)
from rangestream.loader.options import (
    DEFAULT_PREFETCH,
    BatchOptions,
    launcher_environment,
    resolve_distributed,
)
from rangestream.loader.orders.block_shuffle import BlockShuffle
from rangestream.loader.orders.permutation import Permutation, keyed_hash
from rangestream.loader.orders.sequence_plan import EpochPlan
from rangestream.loader.orders.window_sampler import WindowSampler
from rangestream.loader.position import LoaderPosition
from rangestream.loader.sources.indexed import IndexedSource
from rangestream.loader.sources.protocol import SampleSource
from rangestream.loader.sources.storage_kinds import (
    SourceOptions,
    default_shuffle,
    register_storage_kind,
    registered_kinds,
    storage_kind,
)
from rangestream.loader.sources.temporal import TemporalWindowSource

__all__ = [
    "DEFAULT_PREFETCH",
    "IGNORE_INDEX",
    "STATE_VERSION",
    "BatchIterableDataset",
    "BatchOptions",
    "BlockShuffle",
    "CausalLMCollate",
    "DpoCollate",
    "EpochPlan",
    "IndexedSource",
    "LoaderPosition",
    "NextTokenCollate",
    "Pad",
    "PadCollate",
    "Permutation",
    "SampleSource",
    "SftCollate",
    "SourceOptions",
    "StatefulDataLoader",
    "TemporalWindowSource",
    "VarlenCollate",
    "WindowSampler",
    "default_shuffle",
    "keyed_hash",
    "launcher_environment",
    "length_mask",
    "pad_stack",
    "register_storage_kind",
    "registered_kinds",
    "resolve_distributed",
    "stack_collate",
    "storage_kind",
]
