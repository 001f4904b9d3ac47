"""``python -m benchmarks ingest``: conversion speed against the tokenizer and LitData.

One generated JSONL corpus (>= 100 MB of text), one BPE tokenizer trained here, one number
of worker processes, one run. Measured, each ``--repeats`` times, interleaved:

- the tokenizer-alone ceiling: every worker process loads its split's texts, waits at a
  barrier, then runs ``encode_batch_fast`` over them and writes nothing (tokens/s over the
  wall time from the barrier to the last worker's end);
- the same ceiling with reading and JSON parsing timed too;
- ``rangestream.convert(..., preset="seq")`` (read, tokenize, write a committed dataset);
- LitData ``optimize`` with ``TokensLoader`` writing the same tokens (same splits, same
  tokenizer calls, EOS appended per document as the seq preset does).

Tokens are counted without the per-document EOS everywhere, so the rates compare the same
text. Peak RSS of ``convert`` is measured in a fresh process per corpus size (the parent
and the largest worker), for the sizes given (default 100 and 400 MB).

Writes ``benchmarks/.work/ingest/results.json``, which the report renders as the ingestion
section of ``docs/benchmarks.md`` (with this command and its date): rendered at once when
the main benchmark's results exist, else at the next ``python -m benchmarks run`` or
``python -m benchmarks report``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import resource
import shlex
import shutil
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.config import WORK_DIR

INGEST_DIR = WORK_DIR / "ingest"
RESULTS = INGEST_DIR / "results.json"
BATCH_ROWS = 512
VOCAB_SIZE = 32_000
SEED = 20260


# -- corpus and tokenizer ---------------------------------------------------------------------
def _words(rng: np.random.Generator, count: int) -> list[str]:
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    lengths = rng.integers(2, 10, size=count)
    return ["".join(rng.choice(letters, size=n)) for n in lengths]


def corpus(size_mb: int) -> Path:
    """A JSONL file of ``size_mb`` MB: documents of Zipf-distributed words, cached."""
    path = INGEST_DIR / f"corpus-{size_mb}mb.jsonl"
    if path.exists():
        return path
    INGEST_DIR.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(SEED)
    vocabulary = np.array([*_words(rng, 20_000), ",", ".", "!", "?", "the", "a", "of", "and"])
    target = size_mb * 1_000_000
    written = 0
    partial = path.with_suffix(".partial")
    with partial.open("w") as handle:
        while written < target:
            ranks = np.minimum(rng.zipf(1.2, size=400_000), len(vocabulary)) - 1
            words = vocabulary[ranks]
            lengths = rng.integers(50, 1500, size=2000)
            position = 0
            lines = []
            for length in lengths:
                if position + length > len(words):
                    break
                text = " ".join(words[position : position + length].tolist())
                position += length
                lines.append(json.dumps({"text": text}) + "\n")
            chunk = "".join(lines)
            handle.write(chunk)
            written += len(chunk)
    partial.rename(path)
    return path


def tokenizer(sample: Path) -> Path:
    """A byte-level BPE of ``VOCAB_SIZE`` ids trained on the corpus's first 8 MB, cached."""
    path = INGEST_DIR / "tokenizer.json"
    if path.exists():
        return path
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    texts = []
    with sample.open() as handle:
        size = 0
        for line in handle:
            texts.append(json.loads(line)["text"])
            size += len(line)
            if size > 8_000_000:
                break
    model = Tokenizer(models.BPE())
    model.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    model.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    model.train_from_iterator(texts, trainer=trainer)
    model.save(str(path))
    return path


def splits(path: Path) -> list[tuple[str, int, int]]:
    """The corpus's splits exactly as ``convert`` cuts them."""
    from rangestream.ingest.inputs import DEFAULT_SPLIT_BYTES, open_inputs

    (source,) = open_inputs(str(path))
    return [(str(path), s.start, s.stop) for s in source.splits(0, DEFAULT_SPLIT_BYTES, 0)]


def _texts(split: tuple[str, int, int]) -> list[str]:
    from rangestream.ingest.inputs import Split, open_inputs

    path, start, stop = split
    (source,) = open_inputs(path)
    return [row.value["text"] for row in source.rows(Split(0, start, stop, path), ["text"])]


# -- the ceiling: encode_batch in the same processes, writing nothing --------------------------
_barrier: Any = None
_model: Any = None


def _start(barrier: Any, tokenizer_path: str) -> None:
    global _barrier, _model
    from tokenizers import Tokenizer

    _barrier = barrier
    _model = Tokenizer.from_file(tokenizer_path)


def _cpu_self() -> float:
    """CPU seconds of this process, all its threads (the tokenizer's included)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _cpu_all() -> float:
    """CPU seconds of this process and of every child it has waited for."""
    mine = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return mine.ru_utime + mine.ru_stime + children.ru_utime + children.ru_stime


def _ceiling_task(
    split: tuple[str, int, int], include_read: bool
) -> tuple[float, float, int, float]:
    if include_read:
        _barrier.wait()
        began, cpu = time.time(), _cpu_self()
        texts = _texts(split)
    else:
        texts = _texts(split)
        _barrier.wait()
        began, cpu = time.time(), _cpu_self()
    tokens = 0
    for a in range(0, len(texts), BATCH_ROWS):
        batch = texts[a : a + BATCH_ROWS]
        for encoding in _model.encode_batch_fast(batch, add_special_tokens=False):
            tokens += len(encoding.ids)
    return began, time.time(), tokens, _cpu_self() - cpu


def ceiling(path: Path, tokenizer_path: Path, workers: int, include_read: bool) -> dict[str, Any]:
    parts = splits(path)
    context = multiprocessing.get_context("fork")
    # every split's task must be running at once for the barrier: one process per split
    processes = len(parts) if len(parts) <= workers else workers
    if len(parts) > workers:
        raise SystemExit(f"the ceiling needs splits <= workers ({len(parts)} > {workers})")
    barrier = context.Barrier(processes)
    with ProcessPoolExecutor(
        processes, mp_context=context, initializer=_start, initargs=(barrier, str(tokenizer_path))
    ) as pool:
        results = list(pool.map(_ceiling_task, parts, [include_read] * len(parts)))
    began = min(r[0] for r in results)
    ended = max(r[1] for r in results)
    tokens = sum(r[2] for r in results)
    cpu = sum(r[3] for r in results)
    return {
        "tokens": tokens,
        "seconds": ended - began,
        "tokens_per_s": tokens / (ended - began),
        "cpu_s": cpu,
        "tokens_per_cpu_s": tokens / cpu,
    }


# -- rangestream ------------------------------------------------------------------------------
def run_convert(path: Path, tokenizer_path: Path, workers: int, out: Path) -> dict[str, Any]:
    import rangestream

    cpu = _cpu_all()
    began = time.perf_counter()
    summary = rangestream.convert(
        str(path),
        str(out),
        preset="seq",
        tokenizer=str(tokenizer_path),
        workers=workers,
        progress=False,
        overwrite=True,
    )
    seconds = time.perf_counter() - began
    cpu = _cpu_all() - cpu
    text_tokens = summary.tokens - summary.records  # without the EOS of each document
    return {
        "cpu_s": cpu,
        "tokens_per_cpu_s": text_tokens / cpu,
        "tokens": text_tokens,
        "records": summary.records,
        "seconds": seconds,
        "tokens_per_s": text_tokens / seconds,
        "stored_mb": summary.nbytes / 1e6,
        "shards": summary.shards,
    }


# -- LitData ------------------------------------------------------------------------------------
_lit_model: Any = None


def _lit_tokenize(split: tuple[str, int, int]) -> Any:
    global _lit_model
    import torch
    from tokenizers import Tokenizer

    if _lit_model is None:
        _lit_model = Tokenizer.from_file(os.environ["RANGESTREAM_BENCH_TOKENIZER"])
    eos = _lit_model.token_to_id("<|endoftext|>")
    texts = _texts(split)
    for a in range(0, len(texts), BATCH_ROWS):
        for encoding in _lit_model.encode_batch_fast(
            texts[a : a + BATCH_ROWS], add_special_tokens=False
        ):
            ids = np.empty(len(encoding.ids) + 1, dtype=np.int32)
            ids[:-1] = encoding.ids
            ids[-1] = eos
            yield torch.from_numpy(ids)


def _lit_tokenize_each(split: tuple[str, int, int]) -> Any:
    """The fn LitData's examples write: one ``encode`` call per document."""
    global _lit_model
    import torch
    from tokenizers import Tokenizer

    if _lit_model is None:
        _lit_model = Tokenizer.from_file(os.environ["RANGESTREAM_BENCH_TOKENIZER"])
    eos = _lit_model.token_to_id("<|endoftext|>")
    for text in _texts(split):
        ids = _lit_model.encode(text, add_special_tokens=False).ids
        yield torch.tensor([*ids, eos], dtype=torch.int32)


def run_litdata(
    path: Path, tokenizer_path: Path, workers: int, out: Path, per_document: bool = False
) -> dict[str, Any]:
    from litdata import optimize
    from litdata.streaming.item_loader import TokensLoader

    if out.exists():
        shutil.rmtree(out)
    os.environ["RANGESTREAM_BENCH_TOKENIZER"] = str(tokenizer_path)
    parts = splits(path)
    cpu = _cpu_all()
    began = time.perf_counter()
    optimize(
        fn=_lit_tokenize_each if per_document else _lit_tokenize,
        inputs=parts,
        output_dir=str(out),
        chunk_size=(2049 * 8012),
        item_loader=TokensLoader(),
        num_workers=workers,
        mode="overwrite",
        verbose=False,
        start_method="fork",
    )
    seconds = time.perf_counter() - began
    index = json.loads((out / "index.json").read_text())
    tokens = sum(chunk["dim"] or 0 for chunk in index["chunks"])
    stored = sum(f.stat().st_size for f in out.glob("*.bin"))
    return {
        "seconds": seconds,
        "cpu_s": _cpu_all() - cpu,
        "stored_mb": stored / 1e6,
        "tokens_with_eos": tokens,
    }


# -- peak memory -------------------------------------------------------------------------------
def peak_rss(path: Path, tokenizer_path: Path, workers: int, out: Path) -> dict[str, Any]:
    """Convert in a fresh process; its peak RSS and its largest worker's."""
    code = (
        "import json, resource, rangestream;"
        f"s = rangestream.convert({str(path)!r}, {str(out)!r}, preset='seq', "
        f"tokenizer={str(tokenizer_path)!r}, workers={workers}, progress=False, overwrite=True);"
        "print(json.dumps({'parent_mb': resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,"
        " 'worker_mb': resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,"
        " 'tokens': s.tokens}))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True, cwd=Path.cwd()
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks ingest", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--size-mb", type=int, default=100, help="corpus for the speed rows")
    parser.add_argument("--rss-sizes-mb", default="100,400", help="corpora for peak RSS")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    command = "python -m benchmarks ingest " + shlex.join(argv or [])
    path = corpus(args.size_mb)
    tokenizer_path = tokenizer(path)
    with path.open() as handle:
        documents = sum(1 for _ in handle)
    results: dict[str, Any] = {
        "command": command.strip(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": (
            f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
        ),
        "workers": args.workers,
        "corpus_mb": args.size_mb,
        "documents": documents,
        "ceiling": [],
        "ceiling_read": [],
        "convert": [],
        "litdata": [],
        "litdata_each": [],
        "rss": {},
    }
    for repeat in range(args.repeats):
        results["ceiling"].append(ceiling(path, tokenizer_path, args.workers, include_read=False))
        results["ceiling_read"].append(
            ceiling(path, tokenizer_path, args.workers, include_read=True)
        )
        results["convert"].append(
            run_convert(path, tokenizer_path, args.workers, INGEST_DIR / "out-rangestream")
        )
        results["litdata"].append(
            run_litdata(path, tokenizer_path, args.workers, INGEST_DIR / "out-litdata")
        )
        results["litdata_each"].append(
            run_litdata(path, tokenizer_path, args.workers, INGEST_DIR / "out-litdata", True)
        )
        print(
            f"repeat {repeat}: "
            + json.dumps(
                {
                    k: results[k][-1]
                    for k in ("ceiling", "ceiling_read", "convert", "litdata", "litdata_each")
                }
            ),
            flush=True,
        )
    for size in (int(s) for s in args.rss_sizes_mb.split(",")):
        results["rss"][str(size)] = peak_rss(
            corpus(size), tokenizer_path, args.workers, INGEST_DIR / f"out-rss-{size}"
        )
        print(f"rss {size} MB: {results['rss'][str(size)]}", flush=True)
    RESULTS.write_text(json.dumps(results, indent=2))
    from benchmarks import report

    print("\n".join(report.ingest_section(results)))
    main_results = WORK_DIR / "results-full.json"
    if main_results.exists():
        report.write(main_results)
        print(f"wrote {RESULTS} and docs/benchmarks.md (with {main_results.name})")
    else:
        print(f"wrote {RESULTS}; `python -m benchmarks run` puts it in docs/benchmarks.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
