"""Retrying transient storage failures: the policy (:class:`Retry`) and what counts as transient.

A transient failure (a timeout, a reset or refused connection, an HTTP 5xx, 408 or 429) is retried
with exponential backoff, then a :class:`~audiobuffer.StorageError` names the URL, the shard member,
the attempts and the last cause; a missing object or a refused access (404, 403) fails at once.
:mod:`audiobuffer.sources.storage` re-exports the public names.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from .._checks import MAX_SECONDS, check_seconds
from ..errors import StorageError

__all__ = ["Retry", "RetrySpec", "as_retry", "is_transient", "where", "with_retry"]

logger = logging.getLogger("audiobuffer.sources.storage")

T = TypeVar("T")


@dataclass(frozen=True)
class Retry:
    """How transient failures are retried: ``attempts`` tries, waits growing from ``base_delay``.

    The wait before try ``k + 1`` (``k`` = 1, 2, ...) is ``min(max_delay, base_delay * 2 ** (k - 1))``
    seconds: 0.25, 0.5, 1, 2 s by default, so a read that keeps failing at once gives up after about
    4 s. A try's request that waits more than ``timeout`` seconds to connect, or for the next bytes of
    the answer, fails as transient: a store that accepts connections and never answers is given up on
    after about ``attempts * timeout`` seconds plus the waits (a size over HTTP may take two requests a
    try), where the HTTP clients' own waits are minutes a try.

    Args:
        attempts: tries in all (1: no retry).
        base_delay: seconds to wait after the first failure.
        max_delay: the longest wait between two tries.
        timeout: seconds a request of a remote read waits to connect, and then for each part of the
            answer (the socket timeouts of s3fs's, gcsfs's and fsspec's HTTP clients; a steady slow
            download is not cut); ``None``: the clients' own defaults. Options given in
            ``storage_options`` (``config_kwargs`` of s3fs, ``client_kwargs`` of HTTP) take precedence.

    Example:
        >>> Retry(attempts=3, base_delay=0.1).delay(2)
        0.2
    """

    attempts: int = 5
    base_delay: float = 0.25
    max_delay: float = 8.0
    timeout: float | None = 30.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "timeout", check_seconds("retry timeout", self.timeout, maximum=MAX_SECONDS))
        if isinstance(self.attempts, bool) or not isinstance(self.attempts, int):
            raise TypeError(f"retry attempts must be an integer >= 1, got {self.attempts!r}")
        if self.attempts < 1:
            raise ValueError(f"retry attempts must be an integer >= 1, got {self.attempts!r}")
        for name in ("base_delay", "max_delay"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError(f"retry {name} must be a number of seconds >= 0, got {value!r}")
            if not 0 <= value < float("inf"):
                raise ValueError(f"retry {name} must be a number of seconds >= 0, got {value!r}")

    def delay(self, failures: int) -> float:
        """Seconds to wait after the ``failures``-th failed try."""
        return min(self.max_delay, self.base_delay * 2 ** (failures - 1))


#: What the ``retry=`` options take: a :class:`Retry`, a mapping of its fields (from YAML), or ``None``.
RetrySpec = Retry | Mapping[str, Any] | None


def as_retry(retry: RetrySpec) -> Retry:
    """``retry`` as a :class:`Retry` (``None``: the defaults; a mapping: its fields)."""
    if retry is None:
        return _DEFAULT_RETRY
    if isinstance(retry, Retry):
        return retry
    if isinstance(retry, Mapping):
        unknown = set(retry) - {"attempts", "base_delay", "max_delay", "timeout"}
        if unknown:
            raise ValueError(f"retry takes attempts, base_delay, max_delay and timeout, got unknown keys "
                             f"{sorted(unknown)}")
        return Retry(**retry)
    raise TypeError(f"retry must be a Retry, a mapping of its fields or None, got {retry!r}")


_DEFAULT_RETRY = Retry()

# -- failures ------------------------------------------------------------------------------------

# Exception classes (by name, so that botocore and aiohttp need not be imported) whose failures a
# retry may cure: dropped, reset or refused connections, timeouts, bodies cut short.
_TRANSIENT_NAMES = frozenset({
    "HTTPClientError", "EndpointConnectionError", "ConnectionClosedError", "ReadTimeoutError",
    "ConnectTimeoutError", "ProxyConnectionError", "ResponseStreamingError", "IncompleteReadError",
    "IncompleteRead", "ResponseParserError", "ClientConnectionError", "ClientPayloadError",
    "ServerDisconnectedError", "ServerTimeoutError", "FSTimeoutError",
})
_PERMANENT_OS = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)


def _status(exc: BaseException) -> int | None:
    """The HTTP status an exception carries (botocore's ClientError, aiohttp's ClientResponseError)."""
    response = getattr(exc, "response", None)
    if isinstance(response, Mapping):
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if isinstance(status, int):
            return status
    status = getattr(exc, "status", None)
    return status if isinstance(status, int) and 100 <= status < 600 else None


def _chain(exc: BaseException) -> Iterable[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen and len(seen) < 16:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def is_transient(exc: BaseException) -> bool:
    """Whether a failed read may succeed if tried again (timeouts, resets, HTTP 5xx/408/429).

    A missing file or a refused access is judged by its explicit cause when it has one: fsspec's HTTP
    filesystem reports any failure to learn a size (a 500, a reset) as ``FileNotFoundError`` raised
    ``from`` the real failure.
    """
    for link in _chain(exc):
        status = _status(link)
        if status is not None:
            return status >= 500 or status in (408, 429)
        if isinstance(link, _PERMANENT_OS):
            if link.__cause__ is None:
                return False
            continue  # _chain goes on to the cause
        if isinstance(link, (ConnectionError, TimeoutError)):
            return True
        if any(cls.__name__ in _TRANSIENT_NAMES for cls in type(link).__mro__):
            return True
    return False


def where(url: str, member: str | None) -> str:
    return f"member {member!r} of {url!r}" if member else repr(url)


def _reason(exc: BaseException) -> str:
    if isinstance(exc, _PERMANENT_OS) and exc.__cause__ is not None and is_transient(exc):
        return _reason(exc.__cause__)  # a transient failure reported as a missing file: say what it was
    if isinstance(exc, FileNotFoundError):
        return "no such file or object"
    if isinstance(exc, PermissionError):
        return "access denied"
    status = next((s for s in map(_status, _chain(exc)) if s is not None), None)
    text = f"{type(exc).__name__}: {exc}"
    return f"HTTP {status} ({text})" if status is not None else text


def with_retry(op: Callable[[], T], *, url: str, retry: RetrySpec, member: str | None = None,
                action: str = "read") -> T:
    """``op()``, tried again on transient failures as ``retry`` says; a :class:`StorageError` otherwise."""
    policy = as_retry(retry)
    started = time.monotonic()
    for attempt in range(1, policy.attempts + 1):
        try:
            return op()
        except StorageError:
            raise
        except Exception as exc:
            transient = is_transient(exc)
            if transient and attempt < policy.attempts:
                wait = policy.delay(attempt)
                logger.info("cannot %s %s (try %d of %d, retrying in %.2f s): %s", action,
                            where(url, member), attempt, policy.attempts, wait, _reason(exc))
                time.sleep(wait)
                continue
            if transient:
                message = (f"cannot {action} {where(url, member)}: {_reason(exc)}; gave up after "
                           f"{attempt} tries in {time.monotonic() - started:.1f} s (raise retry "
                           f"attempts or base_delay if the store is slow to recover)")
            else:
                message = f"cannot {action} {where(url, member)}: {_reason(exc)}"
            raise StorageError(message, url=url, member=member, attempts=attempt,
                               transient=transient) from exc
    raise AssertionError("unreachable")  # the loop returns or raises
