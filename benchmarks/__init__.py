"""Benchmark harness for rangestream: one command runs every system on the same data.

Run ``python -m benchmarks setup`` once (installs the peers), then
``python -m benchmarks run [--quick]``. Results go to ``docs/benchmarks.md`` and
``docs/benchmarks.png``. Everything generated lives in ``benchmarks/.work/`` (gitignored).
"""
