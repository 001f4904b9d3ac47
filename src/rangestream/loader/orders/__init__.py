"""The loader's orders: pure algorithms over integers, numpy in and out, no I/O, no torch.

Which sample each position of an epoch is, and who reads it: the seeded
:mod:`~.permutation`; the :mod:`~.sequence_plan` (ranks, workers, stretches of steps over
one global sequence); the block shuffle (:mod:`~.block_shuffle`, with its
:mod:`~.phases`, :mod:`~.geometry` and each worker's :mod:`~.worker_plan`); and the
:mod:`~.window_sampler` of temporal windows. Everything above reads these plans.
"""
