"""Presets: input rows to the keyed records of a training type (AstrAI's keys).

=======  =================================================  ==========================
preset   stored keys                                        storage
=======  =================================================  ==========================
seq      ``sequence``                                       stream (windows)
sft      ``sequence``, ``loss_mask``, ``position_ids``      stream (windows)
dpo      ``chosen``, ``rejected``, ``chosen_mask``,         documents (``RecordFormat``)
         ``rejected_mask``
grpo     ``prompts``, ``responses`` (list of arrays),       documents (``RecordFormat``)
         ``masks`` (list of arrays), ``rewards``
=======  =================================================  ==========================

Worked examples, with a tokenizer whose ids are written ``[a b c]`` and a ChatML-style
template (``<|im_start|>ROLE\\nCONTENT<|im_end|>\\n``; ``S``/``E`` stand for the two special
tokens and ``\\n`` for a newline token):

- ``seq``: ``{"text": "hi there"}`` -> ``sequence = [hi there EOS]``. Every document ends
  with the end-of-text id, so documents are separated by it in the stream.
- ``sft``: ``{"messages": [{"role": "user", "content": "2+2?"},
  {"role": "assistant", "content": "4"}]}`` renders as
  ``S user \\n 2+2? E \\n S assistant \\n 4 E \\n``; ``loss_mask`` is 1 on ``4 E`` only (the
  assistant's content and its end-of-turn token, for every assistant turn of a multi-turn
  conversation), 0 elsewhere; ``position_ids`` is ``0, 1, 2, ...`` restarting at each
  conversation.
- ``dpo``: ``{"prompt": "2+2?", "chosen": "4", "rejected": "5"}`` -> ``chosen`` is the
  prompt turn followed by the answer ``4`` (as in ``sft``), ``chosen_mask`` 1 on the
  answer's tokens only; the same for ``rejected``. Messages lists are accepted for all
  three; without ``prompt``, the messages that ``chosen`` and ``rejected`` share are the
  prompt. A tokenizer without a chat template concatenates ``prompt`` and answer tokens
  and ends the answer with EOS.
- ``grpo``: ``{"prompt": "2+2?", "responses": ["4", "5"], "rewards": [1.0, 0.0]}`` ->
  ``prompts`` the prompt rendered up to the generation prompt, ``responses`` one array per
  response (tokenized as generated after the prompt), ``masks`` 1 on each response's
  tokens (less trailing separators), ``rewards`` float32 ``[1.0, 0.0]``.

Documents longer than ``max_len`` tokens are an error, truncated, or (``seq``, ``sft``)
split into records of at most ``max_len`` tokens, as ``too_long`` says.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from rangestream.errors import BadInputError
from rangestream.formats.field_values import fit_to_field
from rangestream.formats.records import RecordField, RecordFormat
from rangestream.formats.stream_numpy import StreamNumpyFormat
from rangestream.ingest.chat import normalize_messages
from rangestream.ingest.inputs import Row
from rangestream.ingest.preset import (
    TOO_LONG,
    Encoded,
    Fields,
    Limits,
    Outcome,
    Preset,
    Texts,
    token_dtype,
)
from rangestream.ingest.tokenizers import Tokenizer

__all__ = [
    "PRESETS",
    "TOO_LONG",
    "Fields",
    "Limits",
    "Outcome",
    "Preset",
    "get_preset",
    "token_dtype",
]


class SeqPreset(Preset):
    """Pretraining text: ``sequence`` = the document's tokens then EOS."""

    name = "seq"
    kind = "stream"
    keys = ("sequence",)
    splittable = True

    def columns(self) -> list[str]:
        return [self.fields.text]

    def storage_format(self) -> StreamNumpyFormat[Any]:
        return StreamNumpyFormat(np.dtype([("sequence", self.tokens)]))

    def check(self) -> None:
        self.tokenizer.require_eos("the seq preset")

    def prepare(self, row: Row) -> Texts:
        return Texts([self._text(row, self.fields.text)])

    def build(self, row: Row, texts: Texts, encoded: list[Encoded]) -> Outcome:
        ((ids, _),) = encoded
        if not len(ids):
            raise BadInputError(f"{row.where}: empty document")
        sequence = np.empty(len(ids) + 1, dtype=ids.dtype)
        sequence[:-1] = ids
        sequence[-1] = self.tokenizer.eos_id
        records = self._fit({"sequence": self._ids(sequence, row)}, row)
        kept = sum(len(r["sequence"]) for r in records)
        return Outcome(row, records, None, kept, kept)


class SftPreset(Preset):
    """Chat fine-tuning: tokens, ``loss_mask`` on assistant turns, ``position_ids``."""

    name = "sft"
    kind = "stream"
    keys = ("sequence", "loss_mask", "position_ids")
    splittable = True

    def __init__(self, tokenizer: Tokenizer, fields: Fields, limits: Limits) -> None:
        super().__init__(tokenizer, fields, limits)
        # every record is at most max_len long when max_len is given (longer ones are
        # refused, truncated or split), so positions fit the dtype of max_len - 1
        limit = limits.max_len
        self.positions = token_dtype(limit) if limit is not None else np.dtype("<u4")

    def columns(self) -> list[str]:
        return [self.fields.messages]

    def storage_format(self) -> StreamNumpyFormat[Any]:
        return StreamNumpyFormat(
            np.dtype(
                [("sequence", self.tokens), ("loss_mask", "u1"), ("position_ids", self.positions)]
            )
        )

    def check(self) -> None:
        self.tokenizer.require_chat_template()

    def prepare(self, row: Row) -> Texts:
        messages = normalize_messages(
            self._field(row, self.fields.messages),
            self.fields.role,
            self.fields.content,
            str(row.where),
        )
        text, spans = self.tokenizer.require_chat_template().assistant_spans(messages)
        if not spans:
            raise BadInputError(f"{row.where}: no assistant message to train on")
        return Texts([text], [spans])

    def build(self, row: Row, texts: Texts, encoded: list[Encoded]) -> Outcome:
        ((ids, mask),) = encoded
        if not len(ids):
            raise BadInputError(f"{row.where}: empty document")
        pieces = self._fit({"sequence": self._ids(ids, row), "loss_mask": mask}, row)
        records = [
            {**piece, "position_ids": np.arange(len(piece["sequence"]), dtype=self.positions)}
            for piece in pieces
        ]
        tokens = sum(len(r["sequence"]) for r in records)
        return Outcome(row, records, None, tokens, sum(int(r["loss_mask"].sum()) for r in records))


class DpoPreset(Preset):
    """Preference pairs: ``chosen``/``rejected`` tokens, masks 1 on the answers only."""

    name = "dpo"
    kind = "document"
    keys = ("chosen", "rejected", "chosen_mask", "rejected_mask")

    def columns(self) -> list[str]:
        return [self.fields.prompt, self.fields.chosen, self.fields.rejected]

    def storage_format(self) -> RecordFormat:
        return RecordFormat(
            [
                RecordField("chosen", self.tokens),
                RecordField("rejected", self.tokens),
                RecordField("chosen_mask", np.dtype("u1")),
                RecordField("rejected_mask", np.dtype("u1")),
            ]
        )

    def _texts(self, row: Row) -> list[tuple[str, list[tuple[int, int]]]]:
        """``(text, answer spans)`` for chosen and rejected."""
        chosen = self._field(row, self.fields.chosen)
        rejected = self._field(row, self.fields.rejected)
        prompt = row.value.get(self.fields.prompt) if isinstance(row.value, Mapping) else None
        template = self.tokenizer.chat_template
        if template is None:
            if not (
                isinstance(prompt, str) and isinstance(chosen, str) and isinstance(rejected, str)
            ):
                raise BadInputError(
                    f"{row.where}: without a chat template, dpo needs text fields "
                    f"{self.fields.prompt!r}, {self.fields.chosen!r} and {self.fields.rejected!r}"
                )
            return [(prompt + chosen, [(len(prompt), len(prompt + chosen))]),
                    (prompt + rejected, [(len(prompt), len(prompt + rejected))])]  # fmt: skip
        answers = []
        for value in (chosen, rejected):
            if isinstance(value, str):
                answers.append([{"role": "assistant", "content": value}])
            else:
                answers.append(self._messages(row, value))
        if prompt is None:
            shared = 0
            while shared < min(map(len, answers)) - 1 and answers[0][shared] == answers[1][shared]:
                shared += 1
            prompt_messages = answers[0][:shared]
            answers = [a[shared:] for a in answers]
        else:
            prompt_messages = self._messages(row, prompt)
        out = []
        for answer in answers:
            text, spans = template.assistant_spans([*prompt_messages, *answer])
            before = len(template.render(prompt_messages, add_generation_prompt=True))
            spans = [(max(a, before), b) for a, b in spans if b > before]
            if not spans:
                raise BadInputError(f"{row.where}: an answer has no assistant message")
            out.append((text, spans))
        return out

    def check(self) -> None:
        if self.tokenizer.chat_template is None:
            self.tokenizer.require_eos("dpo without a chat template")

    def prepare(self, row: Row) -> Texts:
        pairs = self._texts(row)
        return Texts([text for text, _ in pairs], [spans for _, spans in pairs])

    def build(self, row: Row, texts: Texts, encoded: list[Encoded]) -> Outcome:
        plain = self.tokenizer.chat_template is None
        record: dict[str, Any] = {}
        for key, (ids, mask) in zip(("chosen", "rejected"), encoded, strict=True):
            assert mask is not None
            if plain:
                ids = np.append(ids, self.tokenizer.eos_id)
                mask = np.append(mask, 1).astype(np.uint8)
            if not mask.any():
                raise BadInputError(f"{row.where}: the {key} answer is empty")
            ids = self._truncated(self._ids(ids, row), row, key)
            record[key] = ids
            record[f"{key}_mask"] = mask[: len(ids)]
        tokens = len(record["chosen"]) + len(record["rejected"])
        loss = int(record["chosen_mask"].sum() + record["rejected_mask"].sum())
        return Outcome(row, [record], None, tokens, loss)


class GrpoPreset(Preset):
    """Group rollouts: a prompt, several responses with their masks, and rewards."""

    name = "grpo"
    kind = "document"
    keys = ("prompts", "responses", "masks", "rewards")

    def columns(self) -> list[str]:
        return [self.fields.prompt, self.fields.responses, self.fields.rewards]

    def storage_format(self) -> RecordFormat:
        return RecordFormat(
            [
                RecordField("prompts", self.tokens),
                RecordField("responses", self.tokens, depth=1),
                RecordField("masks", np.dtype("u1"), depth=1),
                RecordField("rewards", np.dtype("<f4")),
            ]
        )

    def check(self) -> None:
        if self.tokenizer.chat_template is None:
            self.tokenizer.require_eos("grpo without a chat template")

    def prepare(self, row: Row) -> Texts:
        """The prompt as rendered for generation, then each response as generated after it."""
        prompt = self._field(row, self.fields.prompt)
        responses = self._field(row, self.fields.responses)
        rewards = self._field(row, self.fields.rewards)
        if (
            not isinstance(responses, (list, tuple))
            or not responses
            or not all(isinstance(r, str) for r in responses)
        ):
            raise BadInputError(
                f"{row.where}: {self.fields.responses!r} must be a non-empty list of texts"
            )
        if (
            not isinstance(rewards, (list, tuple))
            or len(rewards) != len(responses)
            or not all(isinstance(r, (int, float)) and not isinstance(r, bool) for r in rewards)
        ):
            raise BadInputError(
                f"{row.where}: {self.fields.rewards!r} must be {len(responses)} numbers, "
                "one per response"
            )
        stored = self._rewards(rewards)
        template = self.tokenizer.chat_template
        if template is None:
            if not isinstance(prompt, str):
                raise BadInputError(f"{row.where}: without a chat template the prompt must be text")
            spans = [[(0, len(r))] for r in responses]
            return Texts([prompt, *responses], [[], *spans], stored)
        before, rendered = template.prompt_and_responses(self._messages(row, prompt), responses)
        texts = [before] + [full[len(before) :] for full, _ in rendered]
        spans = [[]] + [[(0, stop - len(before))] for _, (_, stop) in rendered]
        return Texts(texts, spans, stored)

    def _rewards(self, rewards: Sequence[float]) -> np.ndarray:
        """The rewards as stored (float32): a reward float32 cannot hold (one that overflows
        to infinity) or one that is not a finite number is refused, never stored as inf."""
        values = np.asarray([float(r) for r in rewards], dtype=np.float64)  # OverflowError
        if not np.isfinite(values).all():
            raise BadInputError(f"{self.fields.rewards!r} must be finite numbers")
        stored = fit_to_field(values, np.dtype("<f4"), self.fields.rewards)
        return np.asarray(stored, dtype="<f4")

    def build(self, row: Row, texts: Texts, encoded: list[Encoded]) -> Outcome:
        plain = self.tokenizer.chat_template is None
        (prompt_ids, _), answers = encoded[0], encoded[1:]
        if not len(prompt_ids):
            raise BadInputError(f"{row.where}: empty prompt")
        prompt_ids = self._truncated(self._ids(prompt_ids, row), row, "the prompt")
        room = None if self.limits.max_len is None else self.limits.max_len - len(prompt_ids)
        responses, masks = [], []
        for number, (ids, mask) in enumerate(answers):
            assert mask is not None
            if plain:
                ids = np.append(ids, self.tokenizer.eos_id)
                mask = np.append(mask, 1).astype(np.uint8)
            if not len(ids):
                raise BadInputError(f"{row.where}: response {number} is empty")
            if room is not None and len(ids) > room:
                if self.limits.too_long == "error" or room <= 0:
                    raise BadInputError(
                        f"{row.where}: the prompt and response {number} have "
                        f"{len(prompt_ids) + len(ids)} tokens, more than "
                        f"max_len={self.limits.max_len}"
                    )
                ids, mask = ids[:room], mask[:room]
            responses.append(self._ids(ids, row))
            masks.append(mask)
        record = {"prompts": prompt_ids, "responses": responses, "masks": masks,
                  "rewards": texts.extra}  # fmt: skip
        tokens = len(prompt_ids) + sum(len(r) for r in responses)
        return Outcome(row, [record], None, tokens, int(sum(m.sum() for m in masks)))


PRESETS: dict[str, type[Preset]] = {
    preset.name: preset for preset in (SeqPreset, SftPreset, DpoPreset, GrpoPreset)
}


def get_preset(name: str, tokenizer: Tokenizer, fields: Fields, limits: Limits) -> Preset:
    """The preset called ``name`` (seq, sft, dpo, grpo)."""
    try:
        cls = PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown preset {name!r}; presets are {', '.join(PRESETS)}") from None
    return cls(tokenizer, fields, limits)
