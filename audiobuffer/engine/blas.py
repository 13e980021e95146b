"""BLAS thread limits held while producers run: one count per process, shared by every pool.

NOTE [ BLAS threads ]
=====================
numpy's and scipy's BLAS (OpenBLAS, MKL, BLIS) run a matrix product (a mel filter bank applied to
a spectrogram) on a pool of threads of their own, as many as the cores. Called from producer
threads that already keep every core busy, each product's threads wait for cores the other
producers hold, and OpenBLAS's threads spin while they wait: on a loaded machine the transform then
runs several times slower than on one thread. The count is the library's, for the whole process,
so a pool holds a limit rather than setting one: :func:`hold` registers a limit and applies,
through threadpoolctl, the smallest one held to every library of those APIs loaded now; the
release of the last hold sets each library back to the count it had before the first. A library
loaded while a limit holds (scipy's own OpenBLAS, loaded by a transform's first import) is limited
at the next :func:`hold` or :func:`refresh`. A pool whose producers run no matrix product (a
decoder that says ``calls_blas = False``, as ``ImageDecoder`` does, and no transform) holds no
limit: the library scan of a first hold would only delay its first batch. In process,
pools limit BLAS only: torch's intra-op threads (OpenMP) are the trainer's; the trainer's own numpy
products run under the limit while producers run. The helper process of ``IsolatedLoader`` holds
its limit for its whole life, on OpenMP too: nothing else runs there. A library threadpoolctl
cannot read or set is left as it is (the limit is a matter of speed).
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Callable, Iterable

from threadpoolctl import ThreadpoolController  # with the module, not at a pool's start (1.5 ms)

__all__ = ["hold", "refresh"]

logger = logging.getLogger(__name__)

_lock = threading.Lock()
_ids = itertools.count()
#: Each hold's limit and the APIs it limits (threadpoolctl's ``user_api``: "blas", "openmp").
_held: dict[int, tuple[int, frozenset[str]]] = {}
#: Each library limited so far (by path and API), with the count it had before: restored at the end.
_original: dict[tuple[str, str], int] = {}


def hold(threads: int | None, apis: Iterable[str] = ("blas",)) -> Callable[[], None]:
    """Limit the libraries of ``apis`` to ``threads`` threads until the returned release is called
    (NOTE [ BLAS threads ]); ``None`` limits nothing. The release is idempotent; any thread."""
    if threads is None:
        return _nothing
    with _lock:
        key = next(_ids)
        _held[key] = (threads, frozenset(apis))
        _apply()

    def release() -> None:
        with _lock:
            if _held.pop(key, None) is not None:
                _apply()

    return release


def refresh() -> None:
    """Apply the limits held to the libraries loaded since (a transform's first imports)."""
    with _lock:
        if _held:
            _apply()


def _nothing() -> None:
    pass


def _apply() -> None:
    """Set every library to the smallest limit held on its API, or back to its own count (called
    under ``_lock``)."""
    limits: dict[str, int] = {}
    for threads, apis in _held.values():
        for api in apis:
            limits[api] = min(threads, limits.get(api, threads))
    if not limits and not _original:
        return
    try:
        for library in ThreadpoolController().lib_controllers:
            key = (library.filepath, library.user_api)
            if library.user_api in limits:
                _original.setdefault(key, library.num_threads)
                wanted = limits[library.user_api]
            elif key in _original:
                wanted = _original.pop(key)
            else:
                continue
            if library.num_threads != wanted:
                library.set_num_threads(wanted)
    except Exception as exc:  # a library that cannot be read or set: it keeps its threads
        logger.debug("BLAS thread limit not applied: %s: %s", type(exc).__name__, exc)
    if not limits:
        _original.clear()
