"""What a write did: the live progress bar and the summary printed at the end."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from tqdm.auto import tqdm

__all__ = ["Progress", "SplitResult", "Summary"]


@dataclass
class SplitResult:
    """Counts of one split, returned by its task."""

    split: int
    rows: int = 0
    records: int = 0
    tokens: int = 0
    loss_tokens: int = 0
    rejected: int = 0
    nbytes: int = 0


@dataclass
class Summary:
    """The result of ``convert`` or ``write``: counts, sizes, time, and the dataset.

    ``loss_tokens`` counts the tokens that train (loss mask 1; every token of ``seq``);
    ``nbytes`` is the data stored (rows times row size over every array, without the
    per-chunk checksums and block indexes).
    """

    url: str
    storage: Any = None
    rows: int = 0
    records: int = 0
    tokens: int = 0
    loss_tokens: int = 0
    rejected: int = 0
    rejects_url: str | None = None
    splits: int = 0
    splits_skipped: int = 0
    shards: int = 0
    nbytes: int = 0
    seconds: float = 0.0
    results: list[SplitResult] = field(default_factory=list, repr=False)
    #: What this run wrote, when it resumed an earlier one (the rest counts the dataset).
    added: SplitResult | None = None

    def copy_counts(self) -> SplitResult:
        """The counts so far, as one ``SplitResult`` (``split`` is the splits counted)."""
        return SplitResult(
            len(self.results), self.rows, self.records, self.tokens, self.loss_tokens,
            self.rejected, sum(r.nbytes for r in self.results),
        )  # fmt: skip

    @property
    def loss_fraction(self) -> float:
        """Fraction of the stored tokens that count in the loss."""
        return self.loss_tokens / self.tokens if self.tokens else 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    def add(self, result: SplitResult) -> None:
        self.results.append(result)
        self.rows += result.rows
        self.records += result.records
        self.tokens += result.tokens
        self.loss_tokens += result.loss_tokens
        self.rejected += result.rejected

    def __str__(self) -> str:
        lines = [
            f"dataset   {self.url}",
            f"records   {self.records:,} from {self.rows:,} input rows",
        ]
        if self.tokens:
            lines.append(
                f"tokens    {self.tokens:,} ({self.loss_fraction:.1%} with loss mask 1), "
                f"{self.tokens_per_second:,.0f} tokens/s"
            )
        if self.rejected:
            lines.append(f"rejected  {self.rejected:,} rows, listed in {self.rejects_url}")
        skipped = (
            f" ({self.splits_skipped} already written, resumed)" if self.splits_skipped else ""
        )
        lines.append(f"shards    {self.shards:,} from {self.splits:,} input splits{skipped}")
        if self.splits_skipped and self.added is not None:
            lines.append(
                f"this run  {self.added.records:,} records from {self.added.rows:,} input rows "
                f"in {self.added.split:,} splits"
            )
        lines.append(f"bytes     {self.nbytes / 1e6:,.1f} MB of data")
        lines.append(f"time      {self.seconds:,.1f} s")
        return "\n".join(lines)


class Progress:
    """A tqdm bar of input rows read, with records, tokens/s and MB written beside it."""

    def __init__(
        self, total_splits: int, *, enabled: bool, description: str, total_rows: int | None = None
    ) -> None:
        self.started = time.perf_counter()
        self.bar = tqdm(
            total=total_rows,
            desc=description,
            unit=" rows",
            disable=not enabled,
            dynamic_ncols=True,
        )
        self.splits_done = 0
        self.total_splits = total_splits
        self.counts = [0, 0, 0, 0]  # rows, records, tokens, bytes

    def show(self, rows: int, records: int, tokens: int, nbytes: int) -> None:
        """Show absolute counts (they only grow)."""
        self.counts = [rows, records, tokens, nbytes]
        self.bar.update(rows - self.bar.n)
        elapsed = max(time.perf_counter() - self.started, 1e-9)
        postfix = {"records": f"{records:,}", "splits": f"{self.splits_done}/{self.total_splits}"}
        if tokens:
            postfix["tokens/s"] = f"{tokens / elapsed:,.0f}"
        postfix["MB"] = f"{nbytes / 1e6:,.1f}"
        self.bar.set_postfix(postfix, refresh=False)

    def close(self) -> None:
        self.bar.close()
