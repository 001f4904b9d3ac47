"""The node-local byte cache: the tier under the range reader (see ``byte_cache``)."""

from rangestream.io.cache.byte_cache import ByteCache, is_cacheable_key
from rangestream.io.cache.directory import CacheSummary, clear_cache, summarize_cache
from rangestream.io.cache.settings import CACHE_BYTES_ENV, CACHE_DIR_ENV, cache_for

__all__ = [
    "CACHE_BYTES_ENV",
    "CACHE_DIR_ENV",
    "ByteCache",
    "CacheSummary",
    "cache_for",
    "clear_cache",
    "is_cacheable_key",
    "summarize_cache",
]
