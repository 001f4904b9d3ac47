"""What executors run: read programs, their steps, and the block copier's signature.

Why a module of its own: storage kinds write programs and both executors run them
(``executors``: fetched byte ranges; ``mapped_executor``: mapped local blocks), so the
types live below both.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from typing import Any, TypeVar

from rangestream.io.ranges import ByteRequest
from rangestream.layout.pieces import Output, RowRead

__all__ = ["PROBE_BLOCKS", "BlockCopier", "Program", "Step", "T"]

T = TypeVar("T")
Step = Sequence[RowRead | ByteRequest]
#: A read program: yields steps, receives each step's results in order, returns T.
Program = Generator[Step, list[Any], T]
#: ``copy(part, start, rows, outputs) -> bool``: see ``MappedExecutor.block_copier``.
BlockCopier = Callable[[int, int, int, tuple[Output, ...]], bool]

#: A read spanning more blocks than this first fetches the inner chunk holding its last
#: row. Lengths and offsets come from stored metadata; if they are damaged or hostile (a
#: heap "of 10**15 bytes"), the read then fails on one small request instead of first
#: building a plan of a few hundred bytes per block it believes in.
PROBE_BLOCKS = 64
