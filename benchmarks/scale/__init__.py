"""Scale benchmarks: what opening, reading, writing and committing cost as datasets grow.

Run everything with ``python -m benchmarks.scale --label after`` (or one series:
``python -m benchmarks.scale --label after --only open``); results go to
``benchmarks/.work/scale/<label>/<series>.json`` and a summary is printed. The same scripts
measured the code before the scale work (``PYTHONPATH=<old checkout>/src``); the figures and
their fits are in ``docs/scale.md``.

Counts (requests, bytes, traced memory) are exact and do not depend on the machine; times
are medians over repeats on whatever machine runs them (ranges are reported too).
"""
