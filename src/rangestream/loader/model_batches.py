"""Collates whose batches go straight into a model's ``forward``.

:func:`~rangestream.loader.collate.stack_collate` keeps a batch as stored; a training step
wants the names and layouts its kernels take:

* :class:`CausalLMCollate`: pretraining windows to ``input_ids`` and ``labels``, what a
  Hugging Face causal LM's ``forward`` takes (it returns the loss);
* :class:`VarlenCollate`: packed windows (``boundaries=True``) for flash-attention's varlen
  functions: ``cu_seqlens`` over the flattened batch (``int32``, as
  ``flash_attn_varlen_func`` takes it), ``max_seqlen`` and per-sample ``position_ids``;
* :class:`SftCollate`: tokens and a loss mask to ``input_ids``, ``labels`` (``-100`` where
  the loss mask is 0 or on padding) and ``attention_mask``;
* :class:`DpoCollate`: the dpo preset's records to ``chosen_*`` and ``rejected_*`` inputs,
  labels and attention masks.

Labels follow one of the two conventions by the window's length: a window of
``sequence_length + 1`` elements (``next_token=True``) gives ``target_ids`` already shifted
(Megatron's ``labels``), a window of ``sequence_length`` gives ``labels`` aligned with
``input_ids`` (Hugging Face models shift them inside ``forward``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from rangestream.errors import CollateError
from rangestream.loader.collate import pad_stack

__all__ = ["IGNORE_INDEX", "CausalLMCollate", "DpoCollate", "SftCollate", "VarlenCollate"]

IGNORE_INDEX = -100
"""The label ``torch.nn.functional.cross_entropy`` skips by default."""


def _field(sample: Any, name: str) -> np.ndarray:
    if isinstance(sample, np.ndarray) and sample.dtype.names:
        if name not in sample.dtype.names:
            raise CollateError(f"windows have fields {list(sample.dtype.names)}, not {name!r}")
        return np.asarray(sample[name])
    if isinstance(sample, Mapping):
        if name not in sample:
            raise CollateError(f"samples have keys {sorted(sample)}, not {name!r}")
        value = sample[name]
        return value.numpy() if isinstance(value, torch.Tensor) else np.asarray(value)
    raise CollateError(f"cannot take field {name!r} of a {type(sample).__name__}")


@dataclass(frozen=True)
class CausalLMCollate:
    """Pretraining windows to ``input_ids`` and ``labels`` (``int64``, ``(batch, length)``).

    The keys a Hugging Face causal LM's ``forward`` takes: ``model(**batch).loss`` is the
    next-token loss, as the model shifts the labels itself (so read windows of
    ``sequence_length``, not ``next_token=True``). The labels are a copy: masking them in
    place leaves the inputs alone.

    Parameters
    ----------
    tokens : str, optional
        The token field of structured or dict windows; bare windows are the tokens.
    """

    tokens: str | None = None

    def __call__(self, samples: Sequence[Any]) -> dict[str, torch.Tensor]:
        if len(samples) == 0:
            raise CollateError("cannot collate an empty batch")
        rows = []
        for sample in samples:
            if self.tokens is not None:
                rows.append(_field(sample, self.tokens))
            elif isinstance(sample, Mapping) or (
                getattr(sample, "dtype", None) is not None
                and (getattr(sample.dtype, "names", None))
            ):
                raise CollateError(
                    "CausalLMCollate got windows with fields; name the token field: "
                    "CausalLMCollate(tokens=...)"
                )
            else:
                rows.append(np.asarray(sample))
        if len({row.shape for row in rows}) > 1:
            raise CollateError(
                f"windows of one batch differ in shape: {sorted({r.shape for r in rows})}"
            )
        ids = torch.from_numpy(np.stack(rows).astype(np.int64, copy=False))
        return {"input_ids": ids, "labels": ids.clone()}


def _split_bounds(sample: Any) -> tuple[Any, Mapping[str, Any]]:
    """``(window, {"cu_seqlens", "position_ids"})`` of a window read with boundaries."""
    if isinstance(sample, tuple) and len(sample) == 2 and isinstance(sample[1], Mapping):
        return sample
    if isinstance(sample, Mapping) and "cu_seqlens" in sample:
        return sample, sample
    raise CollateError(
        "VarlenCollate needs windows read with boundaries=True (they carry cu_seqlens); "
        f"got a {type(sample).__name__}"
    )


@dataclass(frozen=True)
class VarlenCollate:
    """Packed windows to flash-attention's varlen inputs.

    Parameters
    ----------
    tokens : str, optional
        The token field of structured or dict windows; bare windows are the tokens.
    loss_mask : str, optional
        A field whose zeros become :data:`IGNORE_INDEX` in the labels (the sft preset's
        ``loss_mask``), aligned with the tokens.

    Returns (when called)
    ---------------------
    dict with ``input_ids`` and ``position_ids`` (``int64``, ``(batch, length)``),
    ``cu_seqlens`` (``int32``, the record offsets over ``input_ids.reshape(-1)``),
    ``max_seqlen`` (int), and ``target_ids`` (next-token windows) or ``labels``: a target
    that belongs to another record than its input is :data:`IGNORE_INDEX`.
    """

    tokens: str | None = None
    loss_mask: str | None = None

    def __call__(self, samples: Sequence[Any]) -> dict[str, Any]:
        if len(samples) == 0:
            raise CollateError("cannot collate an empty batch")
        inputs, targets, positions, offsets = [], [], [], [0]
        longest = 0
        shifted = None
        for sample in samples:
            window, bounds = _split_bounds(sample)
            tokens = np.asarray(window) if self.tokens is None else _field(window, self.tokens)
            cu = np.asarray(bounds["cu_seqlens"], dtype=np.int64)
            length = int(cu[-1])
            extra = len(tokens) - length
            if extra not in (0, 1) or (shifted is not None and shifted != bool(extra)):
                raise CollateError(
                    f"windows of {len(tokens)} tokens with cu_seqlens ending at {length}: "
                    "all windows of a batch must be sequence_length (+1 with next_token)"
                )
            shifted = bool(extra)
            starts = cu[1:-1]
            if shifted:
                target = tokens[1 : length + 1].astype(np.int64)
                target[starts - 1] = IGNORE_INDEX  # the first token of the next record
                mask_at = slice(1, length + 1)
            else:
                target = tokens[:length].astype(np.int64)
                target[cu[:-1]] = IGNORE_INDEX  # a record's first token has no target here
                mask_at = slice(0, length)
            if self.loss_mask is not None:
                target[_field(window, self.loss_mask)[mask_at] == 0] = IGNORE_INDEX
            inputs.append(tokens[:length].astype(np.int64))
            targets.append(target)
            positions.append(np.asarray(bounds["position_ids"], dtype=np.int64))
            offsets.extend((cu[1:] + offsets[-1]).tolist())
            longest = max(longest, int(np.diff(cu).max()))
        if len({len(row) for row in inputs}) > 1:
            raise CollateError("windows of one batch differ in length")
        return {
            "input_ids": torch.from_numpy(np.stack(inputs)),
            "position_ids": torch.from_numpy(np.stack(positions)),
            "target_ids" if shifted else "labels": torch.from_numpy(np.stack(targets)),
            "cu_seqlens": torch.tensor(offsets, dtype=torch.int32),
            "max_seqlen": longest,
        }


def _labelled(
    tokens: Sequence[np.ndarray], masks: Sequence[np.ndarray] | None, pad_id: int
) -> dict[str, torch.Tensor]:
    """Padded ``input_ids``, ``attention_mask`` and ``labels`` (-100 off the mask)."""
    ids, lengths = pad_stack([np.asarray(t, dtype=np.int64) for t in tokens], value=pad_id)
    attention = torch.arange(ids.shape[1])[None, :] < lengths[:, None]
    labels = torch.where(attention, ids, IGNORE_INDEX)
    if masks is not None:
        for row, (mask, length) in enumerate(zip(masks, lengths.tolist(), strict=True)):
            if len(mask) != length:
                raise CollateError(f"a loss mask of {len(mask)} for {length} tokens")
            keep = torch.zeros(ids.shape[1], dtype=torch.bool)
            keep[:length] = torch.from_numpy(np.asarray(mask) != 0)
            labels[row][~keep] = IGNORE_INDEX
    return {"input_ids": ids, "attention_mask": attention.to(torch.int64), "labels": labels}


@dataclass(frozen=True)
class SftCollate:
    """Fine-tuning samples to ``input_ids``, ``attention_mask`` and ``labels``.

    Windows of the sft preset (``sequence``, ``loss_mask``, ``position_ids``) or documents
    with a token and a loss-mask field; samples of different lengths are padded with
    ``pad_id`` (``attention_mask`` 0, labels :data:`IGNORE_INDEX`). Labels are the tokens
    where the loss mask is non-zero, :data:`IGNORE_INDEX` elsewhere, aligned with
    ``input_ids`` (Hugging Face models shift them); ``position_ids`` are passed on when
    the samples have them.
    """

    tokens: str = "sequence"
    loss_mask: str = "loss_mask"
    position_ids: str = "position_ids"
    pad_id: int = 0

    def __call__(self, samples: Sequence[Any]) -> dict[str, torch.Tensor]:
        if len(samples) == 0:
            raise CollateError("cannot collate an empty batch")
        batch = _labelled(
            [_field(s, self.tokens) for s in samples],
            [_field(s, self.loss_mask) for s in samples],
            self.pad_id,
        )
        first = samples[0]
        names = first.dtype.names if isinstance(first, np.ndarray) else tuple(first)
        if self.position_ids in (names or ()):
            batch["position_ids"], _ = pad_stack(
                [_field(s, self.position_ids).astype(np.int64) for s in samples]
            )
        return batch


@dataclass(frozen=True)
class DpoCollate:
    """Preference records (the dpo preset's ``chosen``, ``rejected``, ``chosen_mask``,
    ``rejected_mask``) to ``chosen_input_ids``, ``chosen_attention_mask``,
    ``chosen_labels`` and the same for ``rejected``: each side padded with ``pad_id``
    to its own longest, labels :data:`IGNORE_INDEX` off the answer and on padding."""

    chosen: str = "chosen"
    rejected: str = "rejected"
    mask_suffix: str = "_mask"
    pad_id: int = 0

    def __call__(self, samples: Sequence[Any]) -> dict[str, torch.Tensor]:
        if len(samples) == 0:
            raise CollateError("cannot collate an empty batch")
        batch: dict[str, torch.Tensor] = {}
        for side in (self.chosen, self.rejected):
            sides = _labelled(
                [_field(s, side) for s in samples],
                [_field(s, side + self.mask_suffix) for s in samples],
                self.pad_id,
            )
            batch.update({f"{side}_{key}": value for key, value in sides.items()})
        return batch
