"""Reading an epoch: the plans of :mod:`rangestream.loader.orders` turned into batches.

:mod:`~.tasks` owns one iteration's work on the process's I/O loop; the batch iterators
read in sequence order (:mod:`~.sequential`), by the block shuffle's runs
(:mod:`~.blocks`), or a block-shuffled mixture (:mod:`~.mixed_blocks`).
"""
