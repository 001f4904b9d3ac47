"""Independent expectations for loader tests.

The expected epoch order is built one position at a time from :class:`Permutation` (whose
bijectivity and determinism are tested on their own) and then cut into batches by plain list
slicing that restates the documented policy, not by the code under test.
"""

from __future__ import annotations

from rangestream.loader import Permutation


def epoch_order(num_samples: int, seed: int, epoch: int, shuffle: bool = True) -> list[int]:
    if not shuffle:
        return list(range(num_samples))
    permutation = Permutation(num_samples, seed, epoch)
    return [permutation.at(i) for i in range(num_samples)]


def expected_rank_batches(
    order: list[int],
    *,
    batch_size: int,
    world_size: int,
    rank: int,
    drop_last: bool,
    consumed: int = 0,
) -> list[list[int]]:
    """Rank ``rank``'s batches for the rest of an epoch whose sample order is ``order``."""
    n = len(order)
    global_batch = batch_size * world_size
    remaining = max(0, n - consumed)
    steps = remaining // global_batch if drop_last else -(-remaining // global_batch)
    batches = []
    for step in range(steps):
        start = consumed + step * global_batch + rank * batch_size
        batches.append([order[i % n] for i in range(start, start + batch_size)])
    return batches


def expected_global_batches(
    order: list[int], *, batch_size: int, world_size: int, drop_last: bool, consumed: int = 0
) -> list[list[int]]:
    """Per step, the concatenation of every rank's batch."""
    per_rank = [
        expected_rank_batches(
            order,
            batch_size=batch_size,
            world_size=world_size,
            rank=rank,
            drop_last=drop_last,
            consumed=consumed,
        )
        for rank in range(world_size)
    ]
    return [flatten(step) for step in zip(*per_rank, strict=True)]


def flatten(batches: list[list[int]] | tuple[list[int], ...]) -> list[int]:
    return [position for batch in batches for position in batch]
