"""Checks of the integer arguments users pass, with one wording everywhere.

``True`` is an ``int`` to Python and ``2.0 == 2``; neither is a count or an index a user
means, so both are refused, with the error class of the layer that asks (a loader raises
``LoaderConfigError``, a storage ``ValueError``...).
"""

from __future__ import annotations

import operator
from typing import Any

__all__ = ["integer", "positive_integer"]


def integer(value: Any, name: str, *, minimum: int | None = None,
            error: type[Exception] = ValueError) -> int:  # fmt: skip
    """``value`` as an ``int`` if it is an integer (not a bool) of at least ``minimum``.

    A value of the wrong type raises ``TypeError`` unless ``error`` is a subclass of
    ``ValueError`` other than ``ValueError`` itself (a layer's own configuration error, which
    covers both).
    """
    if type(value) is not int:
        if isinstance(value, bool) or not hasattr(value, "__index__"):
            kind = error if error is not ValueError else TypeError
            raise kind(f"{name} must be an integer, got {value!r}")
        value = operator.index(value)
    if minimum is not None and value < minimum:
        raise error(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def positive_integer(value: Any, name: str, *, error: type[Exception] = ValueError) -> int:
    """``integer(value, name, minimum=1, error=error)``."""
    return integer(value, name, minimum=1, error=error)
