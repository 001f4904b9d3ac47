"""CPU cost of mixing per sample, and prefix discrepancy against Megatron's greedy blend.

Run: ``python -m benchmarks.mixing_overhead`` (overhead) and
``python -m benchmarks.mixing_overhead --discrepancy`` (proportions).

Overhead: the loader maps epoch positions to samples in vectorised blocks of 4096 positions
(``loader/iterable.py``). The baseline is today's single-source loader over one source of
the same size, one :class:`Permutation` call per block; the mixed order is
:meth:`MixedOrder.locate` over blocks of the mixture's epoch (interleave, per-source draws,
every source's shuffle in one pass). Both run alternately in the same process, over
contiguous blocks (one rank) and over a rank's slices of global batches (rank 3 of 8,
batches of 8). Reported: microseconds per sample, median and range over repeats, and the
difference (the mixing overhead).

Discrepancy: for each weight vector, the largest ``|count_s(n) - w_s * n|`` over the first
``n`` positions: the interleave's bound and realised value, Megatron's
``build_blending_indices`` rule (each sample to ``argmax(w * max(i, 1) - count)``, as in
``helpers.cpp``) and the same greedy against the share after the sample, ``w * (i + 1)``,
both run sequentially.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time
from collections.abc import Callable
from fractions import Fraction

import numpy as np

from rangestream.loader import EpochPlan, Permutation
from rangestream.loader.mixing.interleave import Interleave
from rangestream.loader.mixing.mixed_order import MixedOrder, Mixture

BLOCK = 4096
SOURCE_SIZE = 50_000_000  # samples per source (100 GB of tokens in 2 KB windows)


def weights_for(count: int) -> list[float]:
    """A skewed mix: one dominant source and a tail over two orders of magnitude."""
    raw = [0.5**index for index in range(count)]
    return [round(w / sum(raw), 6) for w in raw]


def blocks(pattern: str, num_samples: int, count: int) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    if pattern == "contiguous":
        starts = rng.integers(0, num_samples - BLOCK, size=count)
        return [np.arange(start, start + BLOCK, dtype=np.int64) for start in starts]
    plan = EpochPlan(num_samples, batch_size=8, world_size=8, rank=3)
    steps_per_block = BLOCK // 8
    firsts = rng.integers(0, plan.num_steps - steps_per_block, size=count)
    return [
        plan.sequence_indices(range(first, first + steps_per_block)).reshape(-1) for first in firsts
    ]


def timed(work: Callable[[np.ndarray], object], positions: list[np.ndarray]) -> float:
    """Microseconds per sample over all blocks."""
    start = time.perf_counter()
    for block in positions:
        work(block)
    return (time.perf_counter() - start) / (len(positions) * BLOCK) * 1e6


def overhead(repeats: int, blocks_per_repeat: int) -> None:
    print(f"blocks of {BLOCK} positions, {blocks_per_repeat} blocks per repeat, {repeats} repeats")
    print(f"{'sources':>7} {'pattern':>11} {'single us':>16} {'mixed us':>16} {'overhead us':>16}")
    for count in (2, 4, 8, 16):
        weights = weights_for(count)
        mixture = Mixture.from_weights(
            {f"s{i}": w for i, w in enumerate(weights)},
            {f"s{i}": SOURCE_SIZE for i in range(count)},
        )
        order = MixedOrder(mixture)
        single = Permutation(SOURCE_SIZE, seed=0, epoch=1)
        for pattern in ("contiguous", "rank-slices"):
            positions = blocks(pattern, mixture.samples_per_epoch, blocks_per_repeat)
            alone = blocks(pattern, SOURCE_SIZE, blocks_per_repeat)
            timed(single, alone[:4])  # warm caches and lazy state
            mixed_order = functools.partial(order.locate, epoch=1)
            timed(mixed_order, positions[:4])
            base, mixed = [], []
            for _ in range(repeats):
                base.append(timed(single, alone))
                mixed.append(timed(mixed_order, positions))
            diffs = [m - b for m, b in zip(mixed, base, strict=True)]

            def cell(values: list[float]) -> str:
                return f"{statistics.median(values):.3f} [{min(values):.3f}-{max(values):.3f}]"

            print(f"{count:>7} {pattern:>11} {cell(base):>16} {cell(mixed):>16} {cell(diffs):>16}")


def greedy_excess(weights: list[float], length: int, *, megatron: bool) -> float:
    """Largest prefix discrepancy of a greedy blend over ``length`` samples: each sample to
    the source furthest behind, measured as Megatron does (``w * max(i, 1)``, before the
    sample) or against the share after it (``w * (i + 1)``)."""
    shares = np.asarray(weights) / sum(weights)
    counts = np.zeros(len(weights))
    worst = 0.0
    for index in range(length):
        target = max(index, 1) if megatron else index + 1
        source = int(np.argmax(shares * target - counts))
        counts[source] += 1
        worst = max(worst, float(np.abs(counts - shares * (index + 1)).max()))
    return worst


def interleave_excess(weights: list[float], length: int) -> tuple[float, float]:
    interleave = Interleave(weights)
    prefixes = np.arange(length + 1, dtype=np.int64)
    exact = [Fraction(repr(w)) for w in weights]
    shares = np.array([float(w / sum(exact)) for w in exact])
    realised = float(np.abs(interleave.counts(prefixes) - shares * prefixes[:, None]).max())
    return interleave.bound, realised


def discrepancy(length: int) -> None:
    rng = np.random.default_rng(1)
    cases = [
        [0.7, 0.2, 0.1],
        [0.4, 0.3, 0.2, 0.1],
        [0.47913, 0.35417, 0.14203, 0.02477, 0.0000313],
        [0.0117, 0.7235, 0.1834, 0.0097, 0.0717],
        [0.053, 0.0039, 0.9208, 0.0198, 0.0024],
        [0.0408, 0.058, 0.0013, 0.8814, 0.0057, 0.0064, 0.0035, 0.003],
    ]
    for count in (6, 8, 12, 16):
        for _ in range(2):
            raw = 10 ** rng.uniform(-3, 0, size=count)
            cases.append([round(float(w / raw.sum()), 6) for w in raw])
    print(f"first {length} positions; |count - w * n| at worst")
    print(f"{'sources':>7} {'bound':>7} {'interleave':>10} {'megatron':>9} {'greedy':>7}  weights")
    for weights in cases:
        bound, realised = interleave_excess(weights, length)
        megatron = greedy_excess(weights, length, megatron=True)
        greedy = greedy_excess(weights, length, megatron=False)
        shown = ", ".join(f"{w:g}" for w in weights[:5]) + (", ..." if len(weights) > 5 else "")
        print(
            f"{len(weights):>7} {bound:>7.3f} {realised:>10.3f} {megatron:>9.3f} {greedy:>7.3f}"
            f"  {shown}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--discrepancy", action="store_true", help="proportions, not CPU")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--blocks", type=int, default=100)
    parser.add_argument("--length", type=int, default=20_000, help="positions (discrepancy)")
    args = parser.parse_args()
    if args.discrepancy:
        discrepancy(args.length)
    else:
        overhead(args.repeats, args.blocks)


if __name__ == "__main__":
    main()
