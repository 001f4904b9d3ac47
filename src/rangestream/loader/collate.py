"""Turn a list of samples into a batch of tensors.

Windows of a stream have one shape and simply stack; documents and payload-derived arrays
(annotation concept lists, variable-length fields) do not, and must be padded to the batch
maximum with their lengths or a mask kept so the model can ignore the padding.

Structure rules of :func:`stack_collate` (also used for the fields :class:`PadCollate` does
not pad):

* numpy arrays and tensors stack along a new first axis (equal shapes required); structured
  numpy arrays become a dict with one stacked tensor per field;
* numpy scalars, Python ``bool``/``int``/``float`` become a 1-D tensor;
* mappings and tuples are fixed structures: collated per key or per element;
* everything else (lists, strings, bytes, ``None``, objects) is variable by nature and is
  returned as a list with one entry per sample, untouched.
"""

from __future__ import annotations

import functools
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch

from rangestream.errors import CollateError
from rangestream.loader.transport import share_in_worker

__all__ = ["NextTokenCollate", "Pad", "PadCollate", "length_mask", "pad_stack", "stack_collate"]


def _describe(path: str) -> str:
    return f"field {path!r}" if path else "samples"


def _as_numpy(value: Any) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().numpy()
    return np.asarray(value)


def _batch_tensor(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """An uninitialised tensor for a stacked batch, in shared memory where it will be sent so.

    A DataLoader worker hands a large batch to the main process through shared memory; a
    tensor allocated there to begin with is sent as is, instead of being copied into a new
    segment when pickled (``torch.utils.data.default_collate`` does the same). Small ones
    go by value (``rangestream.loader.transport``) and stay in ordinary memory.
    """
    out = torch.empty(shape, dtype=dtype)
    if share_in_worker(out.nbytes):
        out.share_memory_()
    return out


def _stack_alike(values: Sequence[Any]) -> torch.Tensor | None:
    """Plain numpy arrays of one shape and one native dtype (token windows) stacked with
    the fewest steps, or ``None`` for anything else (the general path decides).

    The general path's ``np.asarray`` of each value, ``np.result_type``, ``np.stack``
    (which expands every array before concatenating) and ``torch.empty(...).numpy()``
    took about 30 us a batch of 8 windows, a tenth of a worker's time per window; rows
    copied into a fresh array take about 8. The result is the same tensor (values, dtype,
    shape); one that will be sent through shared memory is made there, as on the general
    path.
    """
    first = values[0]
    dtype, shape = first.dtype, first.shape
    if dtype.names is not None or dtype.hasobject or not dtype.isnative:
        return None
    for value in values:
        if type(value) is not np.ndarray or value.dtype != dtype or value.shape != shape:
            return None
    full = (len(values), *shape)
    if share_in_worker(len(values) * first.nbytes):
        out = _batch_tensor(full, _torch_dtype(dtype))
        target = out.numpy()
    else:
        target = np.empty(full, dtype=dtype)
        out = torch.from_numpy(target)  # torch's own error for a dtype it has not
    for row, value in enumerate(values):
        target[row] = value
    return out


def _stack_arrays(values: Sequence[Any], path: str) -> Any:
    if type(values[0]) is np.ndarray:
        stacked = _stack_alike(values)
        if stacked is not None:
            return stacked
    if all(isinstance(value, torch.Tensor) for value in values):
        shapes = {tuple(value.shape) for value in values}
        if len(shapes) > 1:
            raise CollateError(_shape_message(path, shapes))
        first = values[0]
        if first.device.type != "cpu":
            return torch.stack(list(values))
        out = _batch_tensor((len(values), *first.shape), first.dtype)
        return torch.stack(list(values), out=out)
    arrays = [_as_numpy(value) for value in values]
    names = arrays[0].dtype.names
    if names:
        return {name: _stack_arrays([a[name] for a in arrays], f"{path}.{name}") for name in names}
    shapes = {array.shape for array in arrays}
    if len(shapes) > 1:
        raise CollateError(_shape_message(path, shapes))
    dtype = np.result_type(*arrays)
    if dtype.hasobject or not dtype.isnative:
        # torch.from_numpy names the unsupported dtype in its error
        return torch.from_numpy(np.stack(arrays))
    out = _batch_tensor((len(arrays), *arrays[0].shape), _torch_dtype(dtype))
    np.stack(arrays, out=out.numpy())
    return out


@functools.lru_cache(maxsize=64)
def _torch_dtype(dtype: np.dtype[Any]) -> torch.dtype:
    """torch's dtype for numpy ``dtype`` (torch's own error if it has none), asked of torch
    once per dtype rather than once per batch."""
    return torch.from_numpy(np.empty(0, dtype=dtype)).dtype


def _shape_message(path: str, shapes: set[tuple[int, ...]]) -> str:
    listed = ", ".join(str(shape) for shape in sorted(shapes))
    return (
        f"cannot stack {_describe(path)}: shapes {listed} differ within one batch; pad it, "
        f"e.g. collate_fn=PadCollate({{{path.split('.')[-1]!r}: Pad()}})"
    )


def _collate(values: Sequence[Any], path: str) -> Any:
    first = values[0]
    if isinstance(first, (np.ndarray, torch.Tensor)):
        return _stack_arrays(values, path)
    if isinstance(first, (np.generic, bool, int, float)):
        return torch.as_tensor(np.asarray(values))
    if isinstance(first, Mapping):
        keys = list(first.keys())
        first_keys = first.keys()
        for value in values[1:]:
            if type(value) is dict and value.keys() == first_keys:
                continue  # the common case, without building two sets per sample
            if not isinstance(value, Mapping) or set(value.keys()) != set(keys):
                raise CollateError(
                    f"cannot collate {_describe(path)}: samples have different keys "
                    f"({sorted(map(str, keys))} vs "
                    f"{sorted(map(str, value.keys())) if isinstance(value, Mapping) else value!r})"
                )
        return {
            key: _collate([value[key] for value in values], f"{path}.{key}" if path else str(key))
            for key in keys
        }
    if isinstance(first, tuple):
        if any(not isinstance(value, tuple) or len(value) != len(first) for value in values):
            raise CollateError(f"cannot collate {_describe(path)}: tuples of different lengths")
        items = [
            _collate([value[i] for value in values], f"{path}[{i}]") for i in range(len(first))
        ]
        if hasattr(first, "_fields"):
            return type(first)(*items)
        return tuple(items)
    return list(values)


def stack_collate(samples: Sequence[Any]) -> Any:
    """Stack equal-shape fields of a batch into tensors; keep variable structures as lists.

    Parameters
    ----------
    samples : sequence
        Samples of one batch, all with the same structure.

    Returns
    -------
    Any
        The batch, following the structure rules in the module docstring.

    Raises
    ------
    CollateError
        If samples differ in keys or an array field differs in shape (use
        :class:`PadCollate` for such fields).
    """
    if len(samples) == 0:
        raise CollateError("cannot collate an empty batch")
    return _collate(list(samples), "")


def pad_stack(
    arrays: Sequence[Any], *, axis: int = 0, value: float | bool = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pad arrays to the longest along ``axis`` and stack them.

    Parameters
    ----------
    arrays : sequence of array_like
        Arrays with equal ``ndim`` and equal sizes on every axis except ``axis``.
    axis : int, default 0
        Axis of each array (before stacking) that varies in length.
    value : scalar, default 0
        Fill value of the padding, cast to the arrays' common dtype.

    Returns
    -------
    padded : torch.Tensor
        Shaped ``(len(arrays), *shape)`` where ``shape[axis]`` is the longest length.
    lengths : torch.Tensor
        ``int64`` original length of each array along ``axis``.
    """
    if len(arrays) == 0:
        raise CollateError("cannot pad an empty batch")
    numpy_arrays = [_as_numpy(array) for array in arrays]
    ndim = numpy_arrays[0].ndim
    if ndim == 0 or any(array.ndim != ndim for array in numpy_arrays):
        dims = sorted({array.ndim for array in numpy_arrays})
        raise CollateError(f"pad_stack needs arrays with one common ndim >= 1, found ndim {dims}")
    if not -ndim <= axis < ndim:
        raise CollateError(f"pad axis {axis} is out of range for arrays with ndim {ndim}")
    axis %= ndim
    others = {array.shape[:axis] + array.shape[axis + 1 :] for array in numpy_arrays}
    if len(others) > 1:
        raise CollateError(
            f"pad_stack pads only axis {axis}; the other axes differ: "
            f"{sorted(array.shape for array in numpy_arrays)}"
        )
    lengths = np.array([array.shape[axis] for array in numpy_arrays], dtype=np.int64)
    shape = list(numpy_arrays[0].shape)
    shape[axis] = int(lengths.max())
    dtype = np.result_type(*numpy_arrays)
    try:
        padded = np.full((len(numpy_arrays), *shape), value, dtype=dtype)
    except (OverflowError, ValueError, TypeError) as error:
        raise CollateError(f"pad value {value!r} does not fit dtype {dtype}: {error}") from error
    for row, array in enumerate(numpy_arrays):
        target = [slice(None)] * ndim
        target[axis] = slice(0, array.shape[axis])
        padded[(row, *target)] = array
    return torch.from_numpy(padded), torch.from_numpy(lengths)


def length_mask(lengths: torch.Tensor, max_length: int | None = None) -> torch.Tensor:
    """Boolean mask, ``True`` where an element is real and ``False`` on padding.

    Parameters
    ----------
    lengths : torch.Tensor
        1-D lengths, one per sample.
    max_length : int, optional
        Width of the mask; defaults to ``lengths.max()``.

    Returns
    -------
    torch.Tensor
        ``bool`` tensor shaped ``(len(lengths), max_length)``.
    """
    lengths = torch.as_tensor(lengths, dtype=torch.int64)
    width = int(lengths.max()) if max_length is None and len(lengths) else int(max_length or 0)
    return torch.arange(width, dtype=torch.int64)[None, :] < lengths[:, None]


@dataclass(frozen=True)
class Pad:
    """How :class:`PadCollate` pads one field.

    Parameters
    ----------
    axis : int, default 0
        Axis of the field (per sample) whose length varies.
    value : scalar, default 0
        Padding value.
    report : {"lengths", "mask", None}, default "lengths"
        Add ``<field>_lengths`` (``int64``, one per sample) or ``<field>_mask`` (``bool``,
        ``(batch, max_length)``) to the batch, or nothing.
    report_key : str, optional
        The batch key of the report. By default ``<field>_<report>``, or
        ``<field>_pad_<report>`` where the samples have a field of that name already (the
        dpo preset's records hold ``chosen_mask``, the loss mask): a record's own keys are
        never overwritten.
    """

    axis: int = 0
    value: float | bool = 0
    report: Literal["lengths", "mask"] | None = "lengths"
    report_key: str | None = None

    def __post_init__(self) -> None:
        if self.report not in ("lengths", "mask", None):
            raise CollateError(f"Pad.report must be 'lengths', 'mask' or None, not {self.report!r}")

    def key_for(self, field: str, taken: Collection[str]) -> str:
        """The batch key of ``field``'s report, given the sample keys ``taken``."""
        if self.report_key is not None:
            key = self.report_key
        else:
            key = f"{field}_{self.report}"
            if key in taken:
                key = f"{field}_pad_{self.report}"
        if key in taken:
            raise CollateError(
                f"PadCollate would overwrite the sample field {key!r} with the {self.report} "
                f"of {field!r}; give Pad(report_key=...) another name"
            )
        return key


class PadCollate:
    """Collate a batch, padding variable-length fields to the batch maximum.

    Parameters
    ----------
    fields : Mapping[str, Pad] or Pad
        For dict samples, the top-level fields to pad and how; every other field goes
        through :func:`stack_collate`. For samples that are bare arrays (e.g. documents
        stored as one array), a single :class:`Pad`.

    Returns (when called)
    ---------------------
    For dict samples, a dict with the padded fields, any ``<field>_lengths`` /
    ``<field>_mask`` entries, and the other fields collated. For bare arrays, ``padded``
    alone if ``report`` is None, else the tuple ``(padded, lengths_or_mask)``.

    Examples
    --------
    >>> collate = PadCollate({"tokens": Pad(value=-1, report="mask")})
    >>> batch = collate([{"tokens": np.arange(2)}, {"tokens": np.arange(3)}])
    >>> batch["tokens"].tolist(), batch["tokens_mask"].tolist()
    ([[0, 1, -1], [0, 1, 2]], [[True, True, False], [True, True, True]])
    """

    def __init__(self, fields: Mapping[str, Pad] | Pad) -> None:
        if isinstance(fields, Pad):
            self.fields: Mapping[str, Pad] | Pad = fields
        else:
            for name, spec in fields.items():
                if not isinstance(spec, Pad):
                    raise CollateError(f"PadCollate field {name!r} needs a Pad, got {spec!r}")
            self.fields = dict(fields)

    def __repr__(self) -> str:
        return f"PadCollate({self.fields!r})"

    @staticmethod
    def _pad(values: Sequence[Any], spec: Pad) -> tuple[torch.Tensor, torch.Tensor | None]:
        padded, lengths = pad_stack(values, axis=spec.axis, value=spec.value)
        if spec.report == "lengths":
            return padded, lengths
        if spec.report == "mask":
            return padded, length_mask(lengths)
        return padded, None

    def __call__(self, samples: Sequence[Any]) -> Any:
        if len(samples) == 0:
            raise CollateError("cannot collate an empty batch")
        fields = self.fields
        if isinstance(fields, Pad):
            if isinstance(samples[0], Mapping):
                raise CollateError(_name_the_fields(samples, fields))
            padded, report = self._pad(samples, fields)
            return padded if report is None else (padded, report)
        if not all(isinstance(sample, Mapping) for sample in samples):
            raise CollateError(
                f"PadCollate with named fields {sorted(fields)} needs dict samples, got "
                f"{type(samples[0]).__name__}"
            )
        missing = [name for name in fields if name not in samples[0]]
        if missing:
            raise CollateError(
                f"PadCollate fields {missing} are not in the samples (keys: {sorted(samples[0])})"
            )
        rest = [{k: v for k, v in sample.items() if k not in fields} for sample in samples]
        collated_rest: dict[str, Any] = stack_collate(rest) if rest[0] else {}
        batch: dict[str, Any] = {}
        for key in samples[0]:
            spec = fields.get(key)
            if spec is None:
                batch[key] = collated_rest[key]
                continue
            padded, report = self._pad([sample[key] for sample in samples], spec)
            batch[key] = padded
            if report is not None:
                batch[spec.key_for(str(key), {*samples[0], *batch})] = report
        return batch


def _name_the_fields(samples: Sequence[Any], spec: Pad) -> str:
    """Why a single ``Pad`` cannot collate dict samples, and the call that would."""
    keys = list(samples[0])
    varying = [
        key
        for key in keys
        if all(isinstance(s, Mapping) and key in s for s in samples)
        and len({np.shape(s[key]) for s in samples}) > 1
    ]
    names = varying or [key for key in keys if np.ndim(samples[0][key]) >= 1][:1] or keys[:1]
    shown = "Pad()" if spec == Pad() else repr(spec)
    suggestion = ", ".join(f"{name!r}: {shown}" for name in names)
    return (
        f"PadCollate({shown}) pads samples that are bare arrays, but these are dicts with "
        f"keys {sorted(map(str, keys))}; name the fields to pad, e.g. "
        f"PadCollate({{{suggestion}}})"
    )


@dataclass(frozen=True)
class NextTokenCollate:
    """Collate next-token windows into inputs and shifted targets.

    With ``next_token=True`` every window holds ``sequence_length + 1`` elements. Token
    field ``tokens`` becomes ``input_ids`` (all but the last element) and ``target_ids``
    (all but the first), as Megatron and AstrAI's ``seq`` data do. Other aligned fields of
    a structured stream are cut to match: those that describe the targets (a loss mask:
    ``target_fields``) drop their first element, the rest (``position_ids``) their last.
    AstrAI's ``sft`` keys are a structured dtype with ``sequence``, ``loss_mask`` and
    ``position_ids`` fields, collated with ``NextTokenCollate("sequence")``.

    Parameters
    ----------
    tokens : str
        The token field of each window (a dict sample).
    target_fields : sequence of str
        Fields aligned with the targets rather than the inputs.
    """

    tokens: str = "tokens"
    target_fields: tuple[str, ...] = ("loss_mask",)

    def __call__(self, samples: Sequence[Any]) -> dict[str, Any]:
        batch = stack_collate(samples)
        if not isinstance(batch, Mapping) or self.tokens not in batch:
            raise CollateError(
                f"NextTokenCollate needs dict windows with a {self.tokens!r} field; "
                f"got {sorted(batch) if isinstance(batch, Mapping) else type(batch).__name__}"
            )
        tokens = batch[self.tokens]
        if tokens.ndim != 2 or tokens.shape[1] < 2:
            raise CollateError(
                f"field {self.tokens!r} must be windows of at least 2 elements "
                f"(use next_token=True), got shape {tuple(tokens.shape)}"
            )
        out: dict[str, Any] = {"input_ids": tokens[:, :-1], "target_ids": tokens[:, 1:]}
        for name, value in batch.items():
            if name == self.tokens:
                continue
            if (
                isinstance(value, torch.Tensor)
                and value.ndim >= 2
                and value.shape[1] == tokens.shape[1]
            ):
                out[name] = value[:, 1:] if name in self.target_fields else value[:, :-1]
            else:
                out[name] = value
        return out
