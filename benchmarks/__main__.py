"""``python -m benchmarks {setup,run,report}``: the one entry point of the harness.

- ``setup``: install the peers (LitData into this environment without its torchvision
  dependency; MosaicML Streaming into its own virtualenv). Idempotent.
- ``run [--quick] [--only WORKLOAD] [--systems A,B] [--latency-ms 20]``: generate data, start
  the S3 server and proxy, measure every system on the same windows, replay each system's
  GETs (the S3 ceiling), measure shuffle quality from each loader's emitted order, write
  ``docs/benchmarks.md`` and ``docs/benchmarks.png``. Installs what is missing first.
- ``report``: re-render the docs from the last results file (no measuring).
- ``ingest [--size-mb 100] [--workers 2]``: conversion speed (see ``benchmarks/ingest.py``),
  rendered as a section of ``docs/benchmarks.md`` from its own results.
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import sys
from pathlib import Path

from benchmarks.config import (
    FULL_BUDGET,
    FULL_SHUFFLE,
    FULL_SIZES,
    QUICK_BUDGET,
    QUICK_SHUFFLE,
    QUICK_SIZES,
    SHUFFLE_QUALITY,
    WORK_DIR,
    WORKLOADS,
    RunConfig,
)

# Hard upper bounds for the measuring phase; budgets are sized to finish well inside them.
FULL_DEADLINE_S = 45 * 60  # every row of every peer; the last full run cut rows at 27 min
QUICK_DEADLINE_S = 10 * 60  # the S3 rows now include their replay (per repeat)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("setup", help="install the peers (idempotent)")
    s.add_argument("--no-main", action="store_true", help="skip the main environment")
    s.add_argument("--no-mosaic", action="store_true", help="skip the MosaicML virtualenv")
    r = sub.add_parser("run", help="measure and write docs/benchmarks.md + .png")
    r.add_argument("--quick", action="store_true", help="~2M tokens, short repeats (< 5 min)")
    r.add_argument(
        "--only",
        action="append",
        choices=(*WORKLOADS, SHUFFLE_QUALITY),
        help="workload or section (repeatable); default: every workload and shuffle-quality",
    )
    r.add_argument(
        "--no-shuffle-quality",
        action="store_true",
        help="leave out the shuffle-quality section (emitted orders of the shuffled loaders)",
    )
    r.add_argument("--systems", help="comma-separated system names (default: all)")
    r.add_argument("--latency-ms", type=float, default=20.0, help="delay added per S3 request")
    r.add_argument(
        "--concurrency", default="1,16,64", help="comma-separated levels (default 1,16,64)"
    )
    r.add_argument("--no-setup", action="store_true", help="do not install missing peers")
    r.add_argument(
        "--reprepare",
        metavar="FAMILIES",
        help="comma-separated families (rangestream, litdata-window, litdata-dataset, mosaic) "
        "or 'all' whose prepared data is rewritten, e.g. after a format change",
    )
    r.add_argument("--out", type=Path, help="markdown path (default docs/benchmarks.md)")
    rep = sub.add_parser("report", help="re-render docs from the last results")
    rep.add_argument("--quick", action="store_true", help="use the last quick run's results")
    rep.add_argument("--out", type=Path, help="markdown path (default docs/benchmarks.md)")
    sub.add_parser("ingest", help="conversion speed: python -m benchmarks ingest --help")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["ingest"]:
        from benchmarks import ingest

        return ingest.main(argv[1:])
    args = _parser().parse_args(argv)
    from benchmarks import environment, report

    if args.cmd == "setup":
        environment.setup(main=not args.no_main, mosaic=not args.no_mosaic)
        return 0
    if args.cmd == "report":
        md = args.out
        report.write(
            WORK_DIR / f"results-{'quick' if args.quick else 'full'}.json",
            md,
            md.with_suffix(".png") if md else None,
        )
        return 0

    from benchmarks.run import Orchestrator

    if not args.no_setup:
        for problem in environment.ensure():
            print(f"warning: {problem}", file=sys.stderr)
    only = tuple(args.only or (*WORKLOADS, SHUFFLE_QUALITY))
    shuffle = SHUFFLE_QUALITY in only and not args.no_shuffle_quality
    config = RunConfig(
        quick=args.quick,
        latency_ms=args.latency_ms,
        concurrency=tuple(int(c) for c in args.concurrency.split(",")),
        workloads=tuple(w for w in only if w in WORKLOADS),
        shuffle=(QUICK_SHUFFLE if args.quick else FULL_SHUFFLE) if shuffle else None,
        systems=tuple(args.systems.split(",")) if args.systems else None,
        sizes=QUICK_SIZES if args.quick else FULL_SIZES,
        budget=QUICK_BUDGET if args.quick else FULL_BUDGET,
    )
    if args.reprepare:
        drop = args.reprepare.split(",")
        root = config.prepared_dir
        for d in sorted(root.glob("*")) if root.exists() else []:
            if "all" in drop or d.name in drop:
                shutil.rmtree(d)
    command = "python -m benchmarks " + shlex.join(argv)
    orchestrator = Orchestrator(
        config, command, QUICK_DEADLINE_S if args.quick else FULL_DEADLINE_S
    )
    results = orchestrator.run()
    md = args.out
    report.write(results, md, md.with_suffix(".png") if md else None)
    print(f"wrote {md or 'docs/benchmarks.md'} and its plot; raw results in {results}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
