"""What a preset is: input field names, length limits, a build's outcome, the base class.

The presets themselves (seq, sft, dpo, grpo) are in ``ingest/presets.py``. A preset says
what one row gives the tokenizer (``prepare``) and what the ids become (``build``); the
base class runs both for a batch, the tokenizer once for all of it, and is the one place
where an error raised by one row's data (a value of the wrong type, a number out of its
dtype's range, a chat template or the tokenizer refusing it) becomes that row's row error,
named by its file and line, so ``skip_bad`` skips it and a failing conversion names it.
"""

from __future__ import annotations

import abc
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from rangestream.errors import BadInputError, InvalidRecordError
from rangestream.formats.field_values import fit_to_field
from rangestream.ingest.chat import normalize_messages
from rangestream.ingest.inputs import Row
from rangestream.ingest.tokenizers import Tokenizer

__all__ = [
    "ROW_DATA_ERRORS",
    "TOO_LONG",
    "Fields",
    "Limits",
    "Outcome",
    "Preset",
    "Texts",
    "guarded",
    "row_error",
    "token_dtype",
]

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


@dataclass
class Texts:
    """What one row gives the tokenizer: its texts and, for presets that mask, the
    ``[start, stop)`` character spans of each text that train; ``extra`` is whatever
    ``build`` needs beside the ids (the rewards of a grpo row)."""

    texts: list[str]
    spans: list[list[tuple[int, int]]] | None = None
    extra: Any = None


#: Ids of one text and its mask (``None`` for presets that do not mask).
Encoded = tuple[np.ndarray, np.ndarray | None]

#: What processing one row's data raises when the data is wrong: a value of the wrong
#: type (``TypeError``), a missing key or index (``LookupError``), a number that does not
#: fit (``ValueError``, ``OverflowError``), nesting too deep to walk (``RecursionError``).
#: ``BadInputError`` and ``InvalidRecordError`` are ``ValueError``s. Anything else (a
#: ``MemoryError``, a store failing) is not the row's fault and stops the conversion.
ROW_DATA_ERRORS: tuple[type[BaseException], ...] = (
    ValueError,
    TypeError,
    LookupError,
    ArithmeticError,
    RecursionError,
)


def row_error(row: Row, error: BaseException) -> BadInputError:
    """``error``, raised while processing ``row``, as its row error: a ``BadInputError``
    whose message starts with the row's file and line."""
    where = str(row.where)
    if isinstance(error, (BadInputError, InvalidRecordError)):
        text = str(error)
    else:
        text = f"{type(error).__name__}: {error}"
    if not text.startswith(where):
        text = f"{where}: {text}"
    made = BadInputError(text)
    made.__cause__ = error
    return made


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
        try:
            fitted = fit_to_field(ids, self.tokens, f"token ids of {self.tokenizer.name}")
        except InvalidRecordError as error:
            raise row_error(row, error) from error
        return fitted.astype(self.tokens, copy=False)

    @abc.abstractmethod
    def columns(self) -> list[str]:
        """Input fields read (Parquet and datasets load only these columns)."""

    @abc.abstractmethod
    def storage_format(self) -> Any:
        """The format records are written with."""

    @abc.abstractmethod
    def prepare(self, row: Row) -> Texts:
        """What ``row`` gives the tokenizer; raises on bad data."""

    @abc.abstractmethod
    def build(self, row: Row, texts: Texts, encoded: list[Encoded]) -> Outcome:
        """``row``'s outcome from the ids of its texts; raises on bad data."""

    def check(self) -> None:
        """Refuse a tokenizer this preset cannot use (before any row: not a row error)."""
        return None

    def convert(self, rows: Sequence[Row]) -> list[Outcome]:
        """The outcome of each row, in order (one batch: the tokenizer runs once)."""
        self.check()
        prepared = list(guarded(rows, self.prepare))
        encoded = self._encode(prepared)
        out = []
        for (row, texts), ids in zip(prepared, encoded, strict=True):
            if isinstance(texts, BadInputError):
                out.append(Outcome(row, [], str(texts)))
            elif isinstance(ids, BadInputError):
                out.append(Outcome(row, [], str(ids)))
            else:
                try:
                    out.append(self.build(row, texts, ids))
                except ROW_DATA_ERRORS as error:
                    out.append(Outcome(row, [], str(row_error(row, error))))
        return out

    def _encode_texts(
        self, texts: list[str], spans: list[list[tuple[int, int]]] | None
    ) -> list[Encoded]:
        if spans is None:
            return [(ids, None) for ids in self.tokenizer.encode_batch(texts)]
        return list(self.tokenizer.encode_masked(texts, spans))

    def _encode(
        self, prepared: list[tuple[Row, Texts | BadInputError]]
    ) -> list[list[Encoded] | BadInputError | None]:
        """The ids of each prepared row's texts, by one call of the tokenizer for all.

        When that call fails (the ``tokenizers`` library raises a plain ``Exception``, and
        a whole batch fails for one row), each row is encoded alone: a row that fails alone
        is a row error, and the batch's error is raised only if no row fails alone.
        """
        good = [(i, t) for i, (_, t) in enumerate(prepared) if isinstance(t, Texts)]
        out: list[list[Encoded] | BadInputError | None] = [None] * len(prepared)
        if not good:
            return out
        masked = good[0][1].spans is not None
        texts = [text for _, t in good for text in t.texts]
        spans = [s for _, t in good for s in (t.spans or [])] if masked else None
        try:
            flat = self._encode_texts(texts, spans)
        except MemoryError:
            raise
        except Exception as batch_error:
            failed = False
            for index, one in good:
                try:
                    out[index] = self._encode_texts(one.texts, one.spans)
                except MemoryError:
                    raise
                except Exception as error:
                    out[index] = row_error(prepared[index][0], error)
                    failed = True
            if not failed:
                raise batch_error
            return out
        position = 0
        for index, one in good:
            out[index] = flat[position : position + len(one.texts)]
            position += len(one.texts)
        return out

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
    """``(row, build(row))``, or ``(row, its row error)`` for rows that cannot be built."""
    for row in rows:
        if row.error is not None:
            yield row, BadInputError(f"{row.where}: {row.error}")
            continue
        try:
            yield row, build(row)
        except ROW_DATA_ERRORS as error:
            yield row, row_error(row, error)
