"""What a DataLoader worker imports before its first batch, imported once ahead of it.

Every worker imports torch (its worker loop), numpy's random module (torch seeds it in
every worker) and this package (to unpickle the dataset) before it reads anything; each
start method can have that done once rather than per worker:

- ``fork``: workers inherit the parent's imports; the loader imports ``numpy.random`` and
  the storage's client code there (:meth:`BatchIterableDataset.preload`).
- ``forkserver`` (Python 3.14's default on Linux): workers are forked from the server,
  which imports only its preload list first, by default ``["__main__"]``, the training
  script when it was started as a file. Started any other way (``python -m``, a notebook,
  ``torchrun -m``, pytest), nothing is preloaded and every worker imports torch afresh
  (1-3 s of CPU each); the loader adds :data:`FORKSERVER_PRELOAD` to that list
  (:func:`preload_forkserver`), keeping what is there. The server reads the list when it
  starts: a forkserver already running (started earlier in the process) keeps its own.
- ``spawn``: a fresh interpreter per worker; nothing can be shared.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Sequence

__all__ = ["FORKSERVER_PRELOAD", "forkserver_preload", "preload_forkserver"]

FORKSERVER_PRELOAD = ("torch", "numpy.random", "rangestream", "rangestream.loader")
"""Modules every worker imports before its first batch, whatever its dataset."""


def forkserver_preload() -> list[str]:
    """The forkserver's preload list now (``["__main__"]`` unless changed)."""
    from multiprocessing import forkserver

    return list(getattr(forkserver._forkserver, "_preload_modules", None) or ["__main__"])


def preload_forkserver(modules: Sequence[str] = FORKSERVER_PRELOAD) -> None:
    """Have the forkserver import ``modules`` before it forks workers, after what its
    list already holds (a module that fails to import is skipped by the server)."""
    current = forkserver_preload()
    wanted = current + [module for module in modules if module not in current]
    if wanted != current:
        multiprocessing.get_context("forkserver").set_forkserver_preload(wanted)
