"""The exceptions audiobuffer raises.

Every error is rooted at :class:`AudioBufferError`, so ``except AudioBufferError`` catches all of them.
Errors about a bad argument also derive from the builtin a caller would expect (``ValueError``),
following python-soundfile's ``SoundFileRuntimeError`` pattern::

    AudioBufferError
    ├── BufferClosed                  put() on a closed Buffer, get() on a closed and drained one
    ├── SourceError (+ ValueError)    a source that cannot be listed: missing path, bad manifest, no files
    ├── ConfigError (+ ValueError)    a pipeline configuration that does not validate
    ├── ResumeError (+ ValueError)    a saved state that does not fit the dataset it is loaded into
    ├── StallError (+ TimeoutError)   no sample came within the dataset's timeout
    ├── StorageError (+ OSError)      a file or object missing, forbidden, or failing after the retries
    ├── HelperError                   the isolated loader's helper process failed to start, crashed or died
    ├── ProducerError                 a producer thread crashed outside any decode (a bug, a failed thread)
    └── SampleError                   one work item could not be turned into a sample
        └── DecodeError               ... because its file could not be decoded

A :class:`SampleError` raised in a producer thread reaches the consumer chained (``raise ... from``)
to the original exception, and names the file, its index and the producer that failed; so does a
``BaseException`` (``SystemExit``, ``KeyboardInterrupt``) escaping a decoder.

Builtins raised as they are: ``TypeError`` and ``ValueError`` for a constructor argument of the wrong
type or value (the message names the option, the value and what is allowed); ``TimeoutError`` when a
``Buffer`` wait with a timeout runs out; ``RuntimeError`` for a ``ProducerPool`` started twice or a
``BatchSlotLoader`` iterated while an epoch of it still runs; and whatever a user's decoder, transform or
collate raises, chained inside a :class:`SampleError`.
"""

from __future__ import annotations

__all__ = [
    "AudioBufferError",
    "BufferClosed",
    "ConfigError",
    "DecodeError",
    "HelperError",
    "ProducerError",
    "ResumeError",
    "SampleError",
    "SourceError",
    "StallError",
    "StorageError",
]


class AudioBufferError(Exception):
    """Base class of every audiobuffer error."""


class BufferClosed(AudioBufferError):
    """The :class:`~audiobuffer.Buffer` is closed: nothing more can be put, or nothing is left to get."""


class SourceError(AudioBufferError, ValueError):
    """A source (directory, file list or manifest) cannot be read or holds no usable item."""


class ConfigError(AudioBufferError, ValueError):
    """A pipeline configuration is invalid; the message names the key path, the value and what is allowed."""


class ResumeError(AudioBufferError, ValueError):
    """A state dict that was saved under another setup (seed, shard, source) or is malformed."""


class StorageError(AudioBufferError, OSError):
    """A file or object could not be read: missing, forbidden, or still failing after the retries.

    Attributes:
        url: the path or URL that failed.
        member: the member of a tar shard that was being read, or ``None``.
        attempts: how many times the read was tried.
        transient: whether the last failure was one that retrying may cure (a timeout, a 5xx status,
            a reset connection); ``False`` for a missing object or a refused access, which fail at once.
    """

    def __init__(self, message: str, *, url: str | None = None, member: str | None = None,
                 attempts: int = 1, transient: bool = False) -> None:
        super().__init__(message)
        self.url = url
        self.member = member
        self.attempts = attempts
        self.transient = transient

    def __reduce__(self):  # keyword-only attributes survive pickling (a DataLoader worker's error)
        return (_rebuild_storage_error, (str(self), self.url, self.member, self.attempts, self.transient))


def _rebuild_storage_error(message: str, url: str | None, member: str | None, attempts: int,
                           transient: bool) -> StorageError:
    return StorageError(message, url=url, member=member, attempts=attempts, transient=transient)


class StallError(AudioBufferError, TimeoutError):
    """No sample arrived within the dataset's ``timeout``; the message names what the producers are stuck on."""


class HelperError(AudioBufferError):
    """The helper process of an :class:`~audiobuffer.IsolatedLoader` could not start, crashed or was killed.

    The message says what happened (the exit code or signal, or the helper's own error and traceback).
    """


class ProducerError(AudioBufferError):
    """A producer thread crashed outside any decode; the message names the producer, the cause is chained."""


class SampleError(AudioBufferError):
    """A work item could not be turned into a sample (a decoder or transform raised).

    Attributes:
        path: the file of the work item.
        index: the item's index in the source.
        producer: the name of the producer thread that failed, or ``None``.
    """

    def __init__(self, message: str, *, path: str | None = None, index: int | None = None,
                 producer: str | None = None) -> None:
        super().__init__(message)
        self.path = path
        self.index = index
        self.producer = producer


class DecodeError(SampleError):
    """A file could not be decoded (unreadable, malformed, or in a format no backend can open)."""
