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
from rangestream.formats.records import RecordField, RecordFormat
from rangestream.formats.stream_numpy import StreamNumpyFormat
from rangestream.ingest.chat import normalize_messages
from rangestream.ingest.inputs import Row
from rangestream.ingest.preset import (
    TOO_LONG,
    Fields,
    Limits,
    Outcome,
    Preset,
    guarded,
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

    def convert(self, rows: Sequence[Row]) -> list[Outcome]:
        eos = self.tokenizer.require_eos("the seq preset")
        prepared = list(guarded(rows, lambda row: self._text(row, self.fields.text)))
        texts = [t for _, t in prepared if isinstance(t, str)]
        encoded = iter(self.tokenizer.encode_batch(texts)) if texts else iter(())
        out = []
        for row, text in prepared:
            if not isinstance(text, str):
                out.append(Outcome(row, [], str(text)))
                continue
            ids = next(encoded)
            if not len(ids):
                out.append(Outcome(row, [], f"{row.where}: empty document"))
                continue
            sequence = np.empty(len(ids) + 1, dtype=ids.dtype)
            sequence[:-1] = ids
            sequence[-1] = eos
            sequence = self._ids(sequence, row)
            try:
                records = self._fit({"sequence": sequence}, row)
            except BadInputError as error:
                out.append(Outcome(row, [], str(error)))
                continue
            kept = sum(len(r["sequence"]) for r in records)
            out.append(Outcome(row, records, None, kept, kept))
        return out


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

    def _render(self, row: Row) -> tuple[str, list[tuple[int, int]]]:
        template = self.tokenizer.require_chat_template()
        messages = normalize_messages(
            self._field(row, self.fields.messages),
            self.fields.role,
            self.fields.content,
            str(row.where),
        )
        text, spans = template.assistant_spans(messages)
        if not spans:
            raise BadInputError(f"{row.where}: no assistant message to train on")
        return text, spans

    def convert(self, rows: Sequence[Row]) -> list[Outcome]:
        prepared = list(guarded(rows, self._render))
        good = [value for _, value in prepared if isinstance(value, tuple)]
        encoded = iter(
            self.tokenizer.encode_masked([t for t, _ in good], [s for _, s in good]) if good else ()
        )
        out = []
        for row, value in prepared:
            if not isinstance(value, tuple):
                out.append(Outcome(row, [], str(value)))
                continue
            ids, mask = next(encoded)
            if not len(ids):
                out.append(Outcome(row, [], f"{row.where}: empty document"))
                continue
            ids = self._ids(ids, row)
            try:
                pieces = self._fit({"sequence": ids, "loss_mask": mask}, row)
            except BadInputError as error:
                out.append(Outcome(row, [], str(error)))
                continue
            records = [
                {**piece, "position_ids": np.arange(len(piece["sequence"]), dtype=self.positions)}
                for piece in pieces
            ]
            out.append(
                Outcome(
                    row,
                    records,
                    None,
                    sum(len(r["sequence"]) for r in records),
                    sum(int(r["loss_mask"].sum()) for r in records),
                )
            )
        return out


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
            self.tokenizer.require_eos("dpo without a chat template")
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

    def convert(self, rows: Sequence[Row]) -> list[Outcome]:
        prepared = list(guarded(rows, self._texts))
        good = [pair for _, value in prepared if isinstance(value, list) for pair in value]
        encoded = iter(
            self.tokenizer.encode_masked([t for t, _ in good], [s for _, s in good]) if good else ()
        )
        plain = self.tokenizer.chat_template is None
        out = []
        for row, value in prepared:
            if not isinstance(value, list):
                out.append(Outcome(row, [], str(value)))
                continue
            record: dict[str, Any] = {}
            try:
                for key, (ids, mask) in zip(
                    ("chosen", "rejected"), (next(encoded), next(encoded)), strict=True
                ):
                    if plain:
                        ids = np.append(ids, self.tokenizer.eos_id)
                        mask = np.append(mask, 1).astype(np.uint8)
                    if not mask.any():
                        raise BadInputError(f"{row.where}: the {key} answer is empty")
                    ids = self._truncated(self._ids(ids, row), row, key)
                    record[key] = ids
                    record[f"{key}_mask"] = mask[: len(ids)]
            except BadInputError as error:
                out.append(Outcome(row, [], str(error)))
                continue
            tokens = len(record["chosen"]) + len(record["rejected"])
            loss = int(record["chosen_mask"].sum() + record["rejected_mask"].sum())
            out.append(Outcome(row, [record], None, tokens, loss))
        return out


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

    def _texts(self, row: Row) -> tuple[str, list[tuple[str, list[tuple[int, int]]]], np.ndarray]:
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
        template = self.tokenizer.chat_template
        if template is None:
            if not isinstance(prompt, str):
                raise BadInputError(f"{row.where}: without a chat template the prompt must be text")
            self.tokenizer.require_eos("grpo without a chat template")
            pieces = [(r, [(0, len(r))]) for r in responses]
            return prompt, pieces, np.asarray(rewards, dtype=np.float32)
        before, rendered = template.prompt_and_responses(self._messages(row, prompt), responses)
        pieces = [(full[len(before) :], [(0, stop - len(before))]) for full, (_, stop) in rendered]
        return before, pieces, np.asarray(rewards, dtype=np.float32)

    def convert(self, rows: Sequence[Row]) -> list[Outcome]:
        prepared = list(guarded(rows, self._texts))
        good = [value for _, value in prepared if isinstance(value, tuple)]
        texts: list[str] = []
        spans: list[list[tuple[int, int]]] = []
        for prompt, pieces, _ in good:
            texts.append(prompt)
            spans.append([])
            texts.extend(t for t, _ in pieces)
            spans.extend(s for _, s in pieces)
        encoded = iter(self.tokenizer.encode_masked(texts, spans) if texts else ())
        plain = self.tokenizer.chat_template is None
        out = []
        for row, value in prepared:
            if not isinstance(value, tuple):
                out.append(Outcome(row, [], str(value)))
                continue
            _, pieces, rewards = value
            prompt_ids, _ = next(encoded)
            answers = [next(encoded) for _ in pieces]
            try:
                if not len(prompt_ids):
                    raise BadInputError(f"{row.where}: empty prompt")
                prompt_ids = self._truncated(self._ids(prompt_ids, row), row, "the prompt")
                room = (
                    None if self.limits.max_len is None else self.limits.max_len - len(prompt_ids)
                )
                responses, masks = [], []
                for number, (ids, mask) in enumerate(answers):
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
            except BadInputError as error:
                out.append(Outcome(row, [], str(error)))
                continue
            record = {
                "prompts": prompt_ids,
                "responses": responses,
                "masks": masks,
                "rewards": rewards,
            }
            tokens = len(prompt_ids) + sum(len(r) for r in responses)
            out.append(Outcome(row, [record], None, tokens, int(sum(m.sum() for m in masks))))
        return out


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
