"""What a preset is: input field names, length limits, a build's outcome, the base class.

The presets themselves (seq, sft, dpo, grpo) are in ``ingest/presets.py``.
"""

from __future__ import annotations

import abc
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from rangestream.errors import BadInputError
from rangestream.formats.field_values import fit_to_field
from rangestream.ingest.chat import normalize_messages
from rangestream.ingest.inputs import Row
from rangestream.ingest.tokenizers import Tokenizer

__all__ = ["TOO_LONG", "Fields", "Limits", "Outcome", "Preset", "guarded", "token_dtype"]

TOO_LONG = ("error", "truncate", "split")


@dataclass(frozen=True)
class Fields:
    """Names of the input fields the presets read."""

    text: str = "text"
    messages: str = "messages"
    role: str = "role"
    content: str = "content"
    prompt: str = "prompt"
    chosen: str = "chosen"
    rejected: str = "rejected"
    responses: str = "responses"
    rewards: str = "rewards"


@dataclass(frozen=True)
class Limits:
    """What to do with documents over ``max_len`` tokens: ``too_long`` error/truncate/split."""

    max_len: int | None = None
    too_long: str = "error"

    def __post_init__(self) -> None:
        if self.max_len is not None and (
            isinstance(self.max_len, bool) or not isinstance(self.max_len, int) or self.max_len < 2
        ):
            raise ValueError(f"max_len must be an integer >= 2, got {self.max_len!r}")
        if self.too_long not in TOO_LONG:
            raise ValueError(f"too_long must be one of {TOO_LONG}, got {self.too_long!r}")


@dataclass
class Outcome:
    """What one input row became: records, or why it was refused."""

    row: Row
    records: list[dict[str, Any]]
    error: str | None = None
    tokens: int = 0
    loss_tokens: int = 0
    #: Input rows this outcome accounts for (0 for the further records of one input).
    rows: int = 1


def token_dtype(vocab_size: int) -> np.dtype[Any]:
    """The smallest unsigned dtype holding every id below ``vocab_size``."""
    for dtype in ("u1", "<u2", "<u4"):
        if vocab_size - 1 <= np.iinfo(dtype).max:
            return np.dtype(dtype)
    raise ValueError(f"a vocabulary of {vocab_size} ids does not fit 32 bits")


class Preset(abc.ABC):
    """A training type: which fields it reads, what it stores, and how."""

    name: ClassVar[str]
    kind: ClassVar[str]
    keys: ClassVar[tuple[str, ...]]
    splittable: ClassVar[bool] = False

    def __init__(self, tokenizer: Tokenizer, fields: Fields, limits: Limits) -> None:
        if limits.too_long == "split" and not self.splittable:
            raise ValueError(
                f"the {self.name} preset cannot split long records; use too_long='truncate'"
            )
        self.tokenizer = tokenizer
        self.fields = fields
        self.limits = limits
        self.tokens = token_dtype(tokenizer.vocab_size)

    def _ids(self, ids: np.ndarray, row: Row) -> np.ndarray:
        """Token ids in the stored dtype; an id that does not fit is refused, not wrapped."""
        what = f"{row.where}: token ids of {self.tokenizer.name}"
        return fit_to_field(ids, self.tokens, what).astype(self.tokens, copy=False)

    @abc.abstractmethod
    def columns(self) -> list[str]:
        """Input fields read (Parquet and datasets load only these columns)."""

    @abc.abstractmethod
    def storage_format(self) -> Any:
        """The format records are written with."""

    @abc.abstractmethod
    def convert(self, rows: Sequence[Row]) -> list[Outcome]:
        """The outcome of each row, in order (one batch: the tokenizer runs once)."""

    def describe(self) -> dict[str, Any]:
        """What the stored dataset holds, beside the format (kept in its schema)."""
        return {
            "preset": self.name,
            "keys": list(self.keys),
            "vocab_size": self.tokenizer.vocab_size,
            "eos_id": self.tokenizer.eos_id,
            "max_len": self.limits.max_len,
            "too_long": self.limits.too_long,
        }

    # -- shared steps ---------------------------------------------------------------------
    def _field(self, row: Row, name: str) -> Any:
        value = row.value.get(name) if isinstance(row.value, Mapping) else None
        if value is None:
            raise BadInputError(f"{row.where}: missing field {name!r}")
        return value

    def _text(self, row: Row, name: str) -> str:
        value = self._field(row, name)
        if not isinstance(value, str):
            raise BadInputError(f"{row.where}: field {name!r} is not text: {type(value).__name__}")
        return value

    def _messages(self, row: Row, value: Any) -> list[dict[str, str]]:
        if isinstance(value, str):
            return [{"role": "user", "content": value}]
        return normalize_messages(value, self.fields.role, self.fields.content, str(row.where))

    def _fit(self, arrays: dict[str, np.ndarray], row: Row) -> list[dict[str, np.ndarray]]:
        """``arrays`` (equal lengths) as records within ``max_len``."""
        length = len(next(iter(arrays.values())))
        limit = self.limits.max_len
        if limit is None or length <= limit:
            return [arrays]
        if self.limits.too_long == "error":
            raise BadInputError(
                f"{row.where}: {length} tokens, more than max_len={limit} "
                "(too_long='truncate' or 'split' to keep it)"
            )
        if self.limits.too_long == "truncate":
            return [{k: v[:limit] for k, v in arrays.items()}]
        return [{k: v[a : a + limit] for k, v in arrays.items()} for a in range(0, length, limit)]

    def _truncated(self, ids: np.ndarray, row: Row, what: str) -> np.ndarray:
        limit = self.limits.max_len
        if limit is None or len(ids) <= limit:
            return ids
        if self.limits.too_long == "error":
            raise BadInputError(
                f"{row.where}: {what} has {len(ids)} tokens, more than max_len={limit} "
                "(too_long='truncate' to keep it)"
            )
        return ids[:limit]


def guarded(rows: Sequence[Row], build: Any) -> Iterator[tuple[Row, Any]]:
    """``(row, build(row))``, or ``(row, error text)`` for rows that cannot be built."""
    for row in rows:
        if row.error is not None:
            yield row, BadInputError(f"{row.where}: {row.error}")
            continue
        try:
            yield row, build(row)
        except BadInputError as error:
            yield row, error
