"""Reading an epoch: the plans of :mod:`rangestream.loader.orders` turned into batches.

:mod:`~.batches` holds what an iteration is given (:class:`~.batches.ReadSpec`, a
:class:`~.batches.Start`) and its two drivers (sync reader, I/O loop); :mod:`~.read_ahead`
the one bounded read-ahead with its sync and async edges; :mod:`~.tasks` one iteration's
work on the process's I/O loop. The strategies, one per kind of plan, are registered in
:mod:`~.strategies`: in order (:mod:`~.sequential`), the block shuffle (:mod:`~.blocks`),
a block-shuffled mixture (:mod:`~.mixed_blocks`). :mod:`~.stalls` times how long the
training loop waits for each batch (the data-stall figure).
"""
