"""Exception classes of rangestream.

Every failure the library detects is raised as one of these, so callers can catch
``RangestreamError`` and know the message names the object, key or value at fault.
Several also derive from the matching builtin (``FileNotFoundError``, ``ValueError``,
``IndexError``) so code written against the builtins keeps working. Every error that comes
from what storage holds or answers (damaged, missing or truncated objects, bad stored
metadata, failed requests) is also an ``OSError``, as a failed read of a file is: code that
catches ``OSError`` around reads (LitData users' code does) sees them.
"""

from __future__ import annotations


class RangestreamError(Exception):
    """Base class of every error raised by rangestream."""


class DatasetNotFoundError(RangestreamError, FileNotFoundError):
    """The URL holds no committed dataset."""


class DatasetExistsError(RangestreamError, FileExistsError):
    """A committed dataset exists at the URL and the writer was not asked to overwrite it."""


class SchemaMismatchError(RangestreamError, ValueError):
    """The format or schema given by the caller differs from the one stored."""


class InvalidRecordError(RangestreamError, ValueError):
    """Data passed to ``append`` does not match the format's contract."""


class InvalidShardError(RangestreamError, ValueError):
    """A shard number is negative, not an integer, or owned by another writer."""


class WriterClosedError(RangestreamError, RuntimeError):
    """The writer was used after it was closed or committed."""


class CommitError(RangestreamError, RuntimeError):
    """A commit could not be completed (conflicting parts, missing parts)."""


class CommitConflictError(CommitError):
    """Another write committed the dataset while this commit ran; this version is not the
    committed one. Its objects stay under ``data/<commit>/`` until ``rangestream gc``."""


class CorruptDataError(RangestreamError, ValueError, OSError):
    """Stored bytes or metadata are damaged or inconsistent.

    Also an ``OSError`` (it comes from storage, like a failed read) and still a
    ``ValueError`` (as it always was), as ``io.UnsupportedOperation`` is both.
    """


class ChecksumError(CorruptDataError):
    """A stored checksum does not match the bytes read."""


class MissingObjectError(CorruptDataError):
    """An object the dataset's metadata refers to does not exist."""


class TruncatedObjectError(CorruptDataError):
    """An object is shorter than the dataset's metadata says; names the URL and byte range.

    Raised when complete responses carry fewer bytes than asked for; a body cut off in
    transit raises a transport error instead and is retried as transient.
    """


class MetadataError(CorruptDataError):
    """Stored metadata (group or array JSON, index arrays) is malformed or hostile."""


class UnsafeKeyError(MetadataError):
    """A key would leave the dataset's root (``..``, an absolute path); refused before I/O."""


class StorageError(RangestreamError, OSError):
    """An object store request failed."""


class AccessDeniedError(StorageError, PermissionError):
    """The store refused the request: HTTP 403, or file permissions."""


class BucketNotFoundError(StorageError, FileNotFoundError):
    """A write went to a bucket that does not exist (S3 creates none on upload); names the
    dataset's URL and the bucket."""


class ConcurrentWriteError(StorageError):
    """A conditional write was refused: the object is no longer the version it was read as."""


class RetriesExhaustedError(StorageError):
    """A transient error persisted through every retry; names the URL and byte range."""


class EndpointUnreachableError(StorageError):
    """The object store endpoint could not be reached within the retry budget."""


class OutOfRangeError(RangestreamError, IndexError):
    """An index, position or counter lies outside the range its object defines."""


class CommandLineError(RangestreamError, ValueError):
    """Arguments of the ``rangestream`` command contradict each other or are malformed."""


class LoaderConfigError(RangestreamError, ValueError):
    """Loader arguments contradict each other or do not fit the storage kind."""


class StateError(RangestreamError, ValueError):
    """A loader ``state_dict`` does not fit the loader it is loaded into."""


class CollateError(RangestreamError, ValueError):
    """Samples of one batch cannot be combined (differing keys, shapes or lengths)."""


class WindowError(OutOfRangeError, ValueError):
    """A frame window is empty or does not lie within its record's frames."""


class UnknownFieldError(RangestreamError, KeyError):
    """A field name is not in the dataset's schema; the message lists the known fields."""

    def __str__(self) -> str:  # KeyError would show the message as a quoted repr
        return str(self.args[0]) if self.args else ""


class BadInputError(RangestreamError, ValueError):
    """An input row cannot be converted; the message names the file and line (or row)."""


class ResumeError(RangestreamError, ValueError):
    """An interrupted write cannot be resumed as asked (its inputs or options differ)."""
