"""Tokenizers: a ``tokenizers`` tokenizer.json, a local ``transformers`` directory, or bytes.

Every tokenizer becomes one of two picklable objects: ``TextTokenizer`` (the serialized
``tokenizers`` model plus its special tokens and chat template) or ``ByteTokenizer`` (UTF-8
bytes as ids). The serialized model travels to worker processes, Dask workers on other
machines included, and is parsed once per process; no file needs to exist where the work
runs and nothing is downloaded.

Encoding is by batch (``encode_batch``): the Rust tokenizer runs over a whole batch of
texts in one call, and loss masks are computed with numpy from token offsets, so no Python
loop runs per token.
"""

from __future__ import annotations

import abc
import functools
import hashlib
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rangestream.errors import BadInputError
from rangestream.ingest.chat import ChatTemplate

__all__ = ["ByteTokenizer", "TextTokenizer", "Tokenizer", "load_tokenizer"]

#: End-of-text tokens looked for, in order, when none is named.
EOS_CANDIDATES = (
    "<|endoftext|>",
    "</s>",
    "<eos>",
    "<|end_of_text|>",
    "<|eot_id|>",
    "<|im_end|>",
)


class Tokenizer(abc.ABC):
    """Text to token ids, by batch."""

    name: str
    #: Ids are in ``range(vocab_size)``.
    vocab_size: int
    eos_id: int | None
    chat_template: ChatTemplate | None

    @abc.abstractmethod
    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        """Token ids of each text (no special tokens added)."""

    @abc.abstractmethod
    def encode_masked(
        self, texts: Sequence[str], spans: Sequence[Sequence[tuple[int, int]]]
    ) -> list[tuple[np.ndarray, np.ndarray]]:
        """Ids of each text and a uint8 mask: 1 on tokens starting inside one of its
        ``[start, stop)`` character spans."""

    @abc.abstractmethod
    def fingerprint(self) -> str:
        """A digest of everything that decides the ids (for resuming a conversion)."""

    def require_eos(self, why: str) -> int:
        if self.eos_id is None:
            raise BadInputError(
                f"tokenizer {self.name} has no end-of-text token, which {why} needs: "
                "name one (eos_token=... / --eos-token)"
            )
        return self.eos_id

    def require_chat_template(self) -> ChatTemplate:
        if self.chat_template is None:
            raise BadInputError(
                f"tokenizer {self.name} has no chat template: pass one "
                "(chat_template=... / --chat-template FILE)"
            )
        return self.chat_template


def _mask(starts: np.ndarray, spans: Sequence[tuple[int, int]]) -> np.ndarray:
    """1 where a token's start lies in one of the sorted, disjoint ``spans``."""
    if not spans:
        return np.zeros(len(starts), dtype=np.uint8)
    bounds = np.asarray(spans, dtype=np.int64).reshape(-1)
    inside = np.searchsorted(bounds, starts, side="right") % 2 == 1
    return inside.astype(np.uint8)


@functools.lru_cache(maxsize=4)
def _parse(serialized: str) -> Any:
    from tokenizers import Tokenizer as RustTokenizer

    return RustTokenizer.from_str(serialized)


class TextTokenizer(Tokenizer):
    """A ``tokenizers`` model: from tokenizer.json, a transformers directory or an object.

    Parameters
    ----------
    serialized
        The model's JSON (``tokenizers.Tokenizer.to_str()``).
    eos_token
        The end-of-text token; found among the usual names when omitted.
    chat_template
        A ``ChatTemplate`` for ``sft``/``dpo``/``grpo`` conversations, if any.
    name
        How errors name this tokenizer (its path).
    """

    def __init__(
        self,
        serialized: str,
        *,
        eos_token: str | None = None,
        chat_template: ChatTemplate | None = None,
        name: str = "tokenizer",
    ) -> None:
        self.serialized = serialized
        self.name = name
        self.chat_template = chat_template
        self.eos_token = eos_token
        model = self._model
        vocab = model.get_vocab(with_added_tokens=True)
        self.vocab_size = max(vocab.values()) + 1 if vocab else 0
        if eos_token is not None:
            eos = model.token_to_id(eos_token)
            if eos is None:
                raise BadInputError(f"tokenizer {name} has no token {eos_token!r}")
            self.eos_id: int | None = int(eos)
        else:
            self.eos_id = next((vocab[token] for token in EOS_CANDIDATES if token in vocab), None)

    def __reduce__(self) -> tuple[Any, ...]:
        return (
            _rebuild_text,
            (self.serialized, self.eos_token, self.chat_template, self.name),
        )

    @property
    def _model(self) -> Any:
        return _parse(self.serialized)

    def fingerprint(self) -> str:
        digest = hashlib.sha256(self.serialized.encode())
        digest.update(
            repr((self.eos_id, self.chat_template and self.chat_template.source)).encode()
        )
        return digest.hexdigest()

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        encodings = self._model.encode_batch_fast(list(texts), add_special_tokens=False)
        return [np.asarray(e.ids, dtype=np.int64) for e in encodings]

    def encode_masked(
        self, texts: Sequence[str], spans: Sequence[Sequence[tuple[int, int]]]
    ) -> list[tuple[np.ndarray, np.ndarray]]:
        encodings = self._model.encode_batch(list(texts), add_special_tokens=False)
        out = []
        for encoding, text_spans in zip(encodings, spans, strict=True):
            ids = np.asarray(encoding.ids, dtype=np.int64)
            offsets = np.asarray(encoding.offsets, dtype=np.int64).reshape(-1, 2)
            out.append((ids, _mask(offsets[:, 0], text_spans)))
        return out


def _rebuild_text(
    serialized: str, eos_token: str | None, template: ChatTemplate | None, name: str
) -> TextTokenizer:
    return TextTokenizer(serialized, eos_token=eos_token, chat_template=template, name=name)


class ByteTokenizer(Tokenizer):
    """UTF-8 bytes as ids (0..255) and 256 as the end-of-text id: no vocabulary needed."""

    name = "bytes"
    vocab_size = 257
    eos_id = 256

    def __init__(self, chat_template: ChatTemplate | None = None) -> None:
        self.chat_template = chat_template

    def __reduce__(self) -> tuple[Any, ...]:
        return (ByteTokenizer, (self.chat_template,))

    def fingerprint(self) -> str:
        source = self.chat_template.source if self.chat_template else ""
        return hashlib.sha256(b"bytes\0" + source.encode()).hexdigest()

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        return [np.frombuffer(t.encode("utf-8"), dtype=np.uint8).astype(np.int64) for t in texts]

    def encode_masked(
        self, texts: Sequence[str], spans: Sequence[Sequence[tuple[int, int]]]
    ) -> list[tuple[np.ndarray, np.ndarray]]:
        out = []
        for text, text_spans in zip(texts, spans, strict=True):
            data = text.encode("utf-8")
            mask = np.zeros(len(data), dtype=np.uint8)
            for start, stop in text_spans:
                mask[len(text[:start].encode()) : len(text[:stop].encode())] = 1
            out.append((np.frombuffer(data, dtype=np.uint8).astype(np.int64), mask))
        return out


def load_tokenizer(
    tokenizer: Any,
    *,
    eos_token: str | None = None,
    chat_template: str | os.PathLike[str] | None = None,
) -> Tokenizer:
    """A ``Tokenizer`` from what the user names.

    Parameters
    ----------
    tokenizer
        ``"bytes"``; a path to a ``tokenizer.json``; a local ``transformers`` tokenizer
        directory (its ``chat_template`` and special tokens are used); a
        ``tokenizers.Tokenizer`` or transformers fast tokenizer object; or a ``Tokenizer``.
    eos_token
        The end-of-text token (default: the directory's, or a usual name found in the
        vocabulary).
    chat_template
        A Jinja chat template, or a path to a file holding one; overrides the directory's.
    """
    template_source: str | None = None
    origin: str | None = None
    if chat_template is not None:
        text = os.fspath(chat_template)
        path = Path(text)
        if "{" not in text and path.is_file():
            template_source, origin = path.read_text(), str(path)
        else:
            template_source = text
    try:
        loaded = _load(tokenizer, eos_token, template_source)
    except BadInputError:
        raise
    except Exception as error:  # the tokenizers library raises plain Exception
        if not isinstance(tokenizer, (str, os.PathLike)):
            raise
        raise BadInputError(
            f"{os.fspath(tokenizer)}: not a readable tokenizer ({type(error).__name__}: {error})"
        ) from error
    if origin is not None and loaded.chat_template is not None:
        loaded.chat_template.origin = origin
    return loaded


def _load(tokenizer: Any, eos_token: str | None, template_source: str | None) -> Tokenizer:
    """``load_tokenizer`` once the template's text is known."""
    if isinstance(tokenizer, Tokenizer):
        if template_source is not None:
            tokenizer.chat_template = ChatTemplate(template_source)
        return tokenizer
    if isinstance(tokenizer, str) and tokenizer == "bytes":
        return ByteTokenizer(ChatTemplate(template_source) if template_source else None)
    module = type(tokenizer).__module__ or ""
    if module.startswith("tokenizers"):
        return TextTokenizer(
            tokenizer.to_str(),
            eos_token=eos_token,
            chat_template=ChatTemplate(template_source) if template_source else None,
        )
    if module.startswith("transformers"):
        return _from_transformers(tokenizer, "tokenizer object", eos_token, template_source)
    if not isinstance(tokenizer, (str, os.PathLike)):
        raise TypeError(f"cannot use {type(tokenizer).__name__} as a tokenizer")
    path = Path(tokenizer)
    if path.is_dir():
        return _from_directory(path, eos_token, template_source)
    if path.is_file():
        return TextTokenizer(
            path.read_text(),
            eos_token=eos_token,
            chat_template=ChatTemplate(template_source) if template_source else None,
            name=str(path),
        )
    raise BadInputError(
        f"tokenizer {tokenizer!r} is not 'bytes', a tokenizer.json file or a local tokenizer "
        "directory (nothing is downloaded)"
    )


def _from_directory(path: Path, eos_token: str | None, template: str | None) -> Tokenizer:
    try:
        from transformers import AutoTokenizer
    except ImportError:
        AutoTokenizer = None
    if AutoTokenizer is None:
        # without transformers: tokenizer.json plus tokenizer_config.json's fields
        model = path / "tokenizer.json"
        if not model.is_file():
            raise BadInputError(f"{path} has no tokenizer.json (install transformers to read it)")
        config = (
            json.loads((path / "tokenizer_config.json").read_text())
            if (path / "tokenizer_config.json").is_file()
            else {}
        )
        source = template or config.get("chat_template")
        eos = eos_token or _token_text(config.get("eos_token"))
        variables = {key: _token_text(config.get(key)) for key in ("bos_token", "eos_token")}
        return TextTokenizer(
            model.read_text(),
            eos_token=eos,
            chat_template=ChatTemplate(source, variables) if source else None,
            name=str(path),
        )
    loaded = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    return _from_transformers(loaded, str(path), eos_token, template)


def _token_text(value: Any) -> Any:
    return value.get("content") if isinstance(value, dict) else value


def _from_transformers(
    loaded: Any, name: str, eos_token: str | None, template: str | None
) -> TextTokenizer:
    backend = getattr(loaded, "backend_tokenizer", None)
    if backend is None:
        raise BadInputError(
            f"{name} is a slow (Python) tokenizer; a fast one (with tokenizer.json) is needed"
        )
    source = template or getattr(loaded, "chat_template", None)
    if isinstance(source, dict):  # several named templates: the default one
        source = source.get("default")
    variables = {
        "bos_token": getattr(loaded, "bos_token", None),
        "eos_token": getattr(loaded, "eos_token", None),
    }
    return TextTokenizer(
        backend.to_str(),
        eos_token=eos_token or getattr(loaded, "eos_token", None),
        chat_template=ChatTemplate(source, variables) if source else None,
        name=name,
    )
