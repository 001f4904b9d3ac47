"""Ingestion: inputs, tokenizers and training presets turned into datasets.

``convert`` (files or Hugging Face datasets, tokenized with a preset) and ``write`` (any
``fn`` over any inputs, for every storage kind) run their tasks on any
``concurrent.futures.Executor`` and commit one dataset.
"""

from rangestream.ingest.convert import convert
from rangestream.ingest.preset import Fields, Limits
from rangestream.ingest.presets import PRESETS
from rangestream.ingest.summary import Summary
from rangestream.ingest.tokenizers import ByteTokenizer, TextTokenizer, Tokenizer, load_tokenizer
from rangestream.ingest.write import write, write_records

__all__ = [
    "PRESETS",
    "ByteTokenizer",
    "Fields",
    "Limits",
    "Summary",
    "TextTokenizer",
    "Tokenizer",
    "convert",
    "load_tokenizer",
    "write",
    "write_records",
]
