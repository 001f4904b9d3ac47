"""Session tokens out of the S3 client libraries' debug logs.

Secrets never enter our own reprs, errors or logs (``repr=False`` fields, stores that do
not show their options). botocore, though, logs every signed request at DEBUG: the
``x-amz-security-token`` header in ``botocore.endpoint``'s "Sending http request" line and
in ``botocore.auth``'s canonical request. The secret key is never sent, so it never
appears; the session token is sent with every request, and a token is as good as the key
until it expires. A filter on those loggers rewrites such records before any handler sees
them: the header's value, and any token value this process was given, become
``<redacted>``. Filters run only for records that pass the level check, so this costs
nothing unless DEBUG logging is on.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["REDACTED", "hide_session_tokens"]

REDACTED = "<redacted>"
#: Loggers of the S3 client stack that may log request headers or credentials. Their
#: children, once created, are covered too (see ``hide_session_tokens``).
_CLIENT_LOGGERS = (
    "botocore",
    "botocore.auth",
    "botocore.endpoint",
    "botocore.hooks",
    "botocore.parsers",
    "botocore.credentials",
    "botocore.httpsession",
    "botocore.awsrequest",
    "botocore.retryhandler",
    "botocore.client",
    "aiobotocore",
    "aiobotocore.endpoint",
    "aiobotocore.httpsession",
    "aiobotocore.credentials",
    "s3fs",
    "fsspec",
    "urllib3",
)
_PREFIXES = tuple(name.split(".", 1)[0] + "." for name in _CLIENT_LOGGERS)
#: The header as botocore prints it: ``x-amz-security-token:VALUE`` (canonical request),
#: ``'X-Amz-Security-Token': b'VALUE'`` (a headers dict), any case.
_HEADER = re.compile(r"""(x-amz-security-token['"]?\s*[:=]\s*b?['"]?)([^'"\s,}]+)""", re.IGNORECASE)
#: Distinct token values remembered; tokens rotate, so old ones are dropped.
_MAX_VALUES = 64


class _SessionTokenFilter(logging.Filter):
    def __init__(self) -> None:
        super().__init__("rangestream-session-tokens")
        self.values: list[str] = []
        self._lock = threading.Lock()

    def remember(self, values: Iterable[str]) -> None:
        with self._lock:
            for value in values:
                if value and value not in self.values:
                    self.values.append(value)
            del self.values[:-_MAX_VALUES]

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            text = record.getMessage()
        except Exception:  # a malformed record: leave it to logging's own error path
            return True
        hidden = _HEADER.sub(lambda match: match.group(1) + REDACTED, text)
        for value in list(self.values):
            hidden = hidden.replace(value, REDACTED)
        if hidden != text:
            record.msg, record.args = hidden, None
        return True


_FILTER = _SessionTokenFilter()


def hide_session_tokens(storage_options: Mapping[str, Any] | None = None) -> None:
    """Filter session tokens out of the S3 client loggers' records (idempotent, cheap).

    ``storage_options`` (``token``, ``client_kwargs.aws_session_token``) and
    ``AWS_SESSION_TOKEN`` name token values to hide wherever they appear; the
    ``x-amz-security-token`` header is hidden whatever its value (tokens from botocore's
    credential chain included). Call it when an S3 client is made: the client's modules
    are imported by then, so every logger they created is covered.
    """
    options = dict(storage_options or {})
    client_kwargs = options.get("client_kwargs") or {}
    values = [
        options.get("token"),
        client_kwargs.get("aws_session_token") if isinstance(client_kwargs, Mapping) else None,
        os.environ.get("AWS_SESSION_TOKEN"),
    ]
    _FILTER.remember(value for value in values if isinstance(value, str))
    names = set(_CLIENT_LOGGERS)
    names.update(
        name for name in list(logging.root.manager.loggerDict) if name.startswith(_PREFIXES)
    )
    for name in names:
        logger = logging.getLogger(name)
        if _FILTER not in logger.filters:
            logger.addFilter(_FILTER)
