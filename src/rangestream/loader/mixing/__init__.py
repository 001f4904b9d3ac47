"""Weighted mixtures of sources, exact at every prefix.

Bottom up: :mod:`~.interleave` (which source each position takes), :mod:`~.source_orders`
(how one source is read within a pass), :mod:`~.mixture` (the sources, weights and
quotas), :mod:`~.mixed_order` (the epoch's global order), :mod:`~.mixed_source` (the
mixture as one sample source) and :mod:`~.block_plan` (each source's own block shuffle
over the reader's draws).
"""
