"""The reading strategies by name: how each kind of epoch plan is read (a registry).

A source says how its epoch is planned (:class:`~rangestream.loader.sources.protocol.EpochPlanning`,
parsed once from the user's ``shuffle`` where the source is made); the dataset looks its
strategy up here once, and from then on calls it without asking which it is, as MosaicML
``streaming`` keeps its shuffle algorithms behind one registry:

- :class:`~rangestream.loader.reading.sequential.InOrder`: one global sequence (storage
  order, the per-window shuffle, temporal draws, mixtures shuffled per sample);
- :class:`~rangestream.loader.reading.blocks.BlockShuffled`: the block shuffle;
- :class:`~rangestream.loader.reading.mixed_blocks.MixedBlockShuffled`: a mixture whose
  sources each run their own block shuffle.
"""

from __future__ import annotations

from rangestream.loader.reading.batches import EpochStrategy
from rangestream.loader.reading.blocks import BlockShuffled
from rangestream.loader.reading.mixed_blocks import MixedBlockShuffled
from rangestream.loader.reading.sequential import InOrder
from rangestream.loader.sources.protocol import EpochPlanning, SampleSource

__all__ = ["STRATEGIES", "strategy_for"]

STRATEGIES: dict[EpochPlanning, EpochStrategy] = {
    EpochPlanning.SEQUENCE: InOrder(),
    EpochPlanning.BLOCKS: BlockShuffled(),
    EpochPlanning.MIXED_BLOCKS: MixedBlockShuffled(),
}


def strategy_for(source: SampleSource) -> EpochStrategy:
    """The strategy that reads ``source``'s epochs."""
    return STRATEGIES[source.planning]
