"""``python -m benchmarks.scale --label NAME [--quick] [--only SERIES ...]``: every series.

``--max-records`` caps the records series of ``open`` (10^7 by default: writing 10^7 tiny
records takes 3 to 15 minutes per kind on two cores); ``--documents`` sets the documents
series' size (10^7 by default, ~4.5 minutes per shard count to write, 10 GB each).
"""

from __future__ import annotations

import argparse

from benchmarks.scale import commit, disk, documents, harness, mapped, open_cost, writers

SERIES = ("disk", "open", "mapped", "commit", "writers", "documents")


def main() -> None:
    parser = argparse.ArgumentParser(description="Scale benchmarks (see benchmarks/scale).")
    parser.add_argument("--label", required=True, help="results go to .work/scale/LABEL/")
    parser.add_argument("--quick", action="store_true", help="smaller series, for a try-out")
    parser.add_argument("--only", action="append", choices=SERIES)
    parser.add_argument("--max-records", type=int, default=10**7)
    parser.add_argument("--documents", type=int)
    args = parser.parse_args()
    chosen = args.only or SERIES
    for series in chosen:
        if series == "disk":
            result = disk.run(args.label)
        elif series == "open":
            result = open_cost.run(args.label, args.quick, s3=True, max_records=args.max_records)
        elif series == "mapped":
            result = mapped.run(args.label, args.quick)
        elif series == "commit":
            result = commit.run(args.label, args.quick)
        elif series == "writers":
            result = writers.run(args.label, args.quick)
        else:
            count = args.documents or (10**5 if args.quick else 10**7)
            result = documents.run(args.label, count, [1000, 4], 10**4 if args.quick else 10**6)
            series = f"documents-{count}"
        print(harness.save(args.label, series, result), flush=True)


if __name__ == "__main__":
    main()
