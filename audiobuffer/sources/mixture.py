"""A weighted mixture of sources: :func:`mix` and the :class:`Mixture` source it makes.

NOTE [ Mixtures ]
=================
A mixture's items are its sources' items one after another (item ``g`` of the mixture is item ``g -
offset[k]`` of source ``k``): paths, labels, fields and durations are read over that concatenation once.
An epoch is ``size`` *draws* from it, a pure function of the seed and the epoch (:meth:`Mixture.draw`):
each source gets ``size x weight`` draws (the fractions handed out at random, in proportion, so that no
source gains from rounding over the epochs), taken without replacement within the epoch where the source
has that many items (whole passes over it first where it has fewer), and the draws are interleaved in a
seeded order. The epoch plan runs over the ``size`` draws as over any source's items (``len()`` is
``size``; :meth:`Mixture.item` turns draw ``i`` of an epoch into its source's work item), so shuffling,
ranks, DataLoader workers, batches by duration (the durations of the epoch's draws) and exact resume
(the mask counts draws; the draws are the same when the epoch is planned again) work unchanged, and
every rank and the isolated loader's helper draw the same epoch with no communication.
"""

from __future__ import annotations

import hashlib
import math
import numbers
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from .blocks import BlockReads
from .listing import table_of_paths
from .source import ReadClock, Source, SourceSpec, WorkItem, class_order
from .storage import Storage
from .table import ABSENT, ItemTable, as_column

__all__ = ["Mixture", "mix"]

#: Keeps a mixture's random stream apart from the epoch plan's (``seed + epoch``).
_STREAM = 0x6D6978
#: How many epochs' draws a mixture remembers.
_REMEMBERED = 4
#: The most draws an epoch may hold (``mix(size=...)``): its table takes 8 bytes a draw, 32 GiB at this
#: size; a larger size is refused when the mixture is made, not met as a MemoryError when an epoch starts.
MAX_DRAWS = 2**32


def mix(*sources: SourceSpec | Source, weights: Sequence[float] | None = None, size: int | None = None) -> Mixture:
    """A source that draws each epoch's items from ``sources`` with the given ``weights``.

    Example:
        >>> speech = mix("librispeech/", "commonvoice.csv", weights=[0.7, 0.3], size=10000)  # doctest: +SKIP
        >>> ds = BufferedDataset(speech, AudioDecoder(16000), shuffle=True)  # doctest: +SKIP

    Args:
        sources: two or more sources: :class:`~audiobuffer.Source` objects, or what ``Source()`` takes
            (a folder, a manifest, an index, a list of files), listed with the audio patterns.
        weights: each source's share of an epoch's draws (any positive numbers, normalised); ``None``:
            in proportion to the sources' sizes.
        size: draws per epoch (``len()``), at most ``MAX_DRAWS`` (2**32); ``None``: the sources' items
            together.

    Each epoch draws ``size`` items, each source's share of them its weight's, seeded by the loader's seed
    and the epoch (NOTE [ Mixtures ] in ``sources/mixture.py``). Labels are the union of the sources' classes.

    Raises:
        TypeError, ValueError: fewer than two sources, or weights or size of the wrong type or value.
        SourceError: a source cannot be listed.
    """
    return Mixture(sources, weights=weights, size=size)


class Mixture(Source):
    """A weighted mixture of sources, drawn anew each epoch: build it with :func:`mix`.

    Attributes:
        sources: the mixed sources, in order.
        weights: each source's share of the draws (summing to 1).
        size: draws per epoch.
        names: one name per source (its description), as ``stats().sources`` keys them.
        offsets: where each source's items start in the mixture's items.

    Thread safety: read-only but for a cache of the last few epochs' draws, which any thread may fill.
    """

    sources: list[Source]

    def __init__(self, sources: Sequence[SourceSpec | Source], *, weights: Sequence[float] | None = None,
                 size: int | None = None) -> None:
        if len(sources) < 2:
            raise TypeError(f"mix() takes two or more sources, got {len(sources)}")
        listed = [s if isinstance(s, Source) else Source(s) for s in sources]
        if any(isinstance(s, Mixture) for s in listed):
            raise TypeError("mix() takes sources, not mixtures: give the sources of the inner mixture instead")
        lengths = np.array([len(s.paths) for s in listed], dtype=np.int64)
        self.weights = _check_weights(weights, len(listed), lengths)
        total = int(lengths.sum())
        if size is None:
            size = total
        elif isinstance(size, bool) or not isinstance(size, numbers.Integral) or size < 1:
            raise ValueError(f"mix() size must be an integer >= 1 (draws per epoch) or None, got {size!r}")
        elif size > MAX_DRAWS:
            raise ValueError(f"mix() size={size} is too large: an epoch's draws take 8 bytes each "
                             f"({size * 8 / 2**40:.1f} TiB); give at most {MAX_DRAWS} draws an epoch")
        self.sources = listed
        self.size = int(size)
        self.offsets = np.concatenate(([0], np.cumsum(lengths)[:-1])).astype(np.int64)
        self._lengths = lengths
        names = [s.description for s in listed]
        self.names = [n if names.count(n) == 1 else f"{n} #{i}" for i, n in enumerate(names)]
        # The concatenation, as a Source: what durations, labels and fields are read over.
        self.description = f"a mixture of {', '.join(self.names)}"
        self.table = _concatenated(listed)
        self.storage = Storage(None, listed[0].retry)  # each source reads through its own
        labelled = [s.label_names for s in listed]
        label_names: list[str | None] = [
            name for s in listed for name in (s.label_names if s.label_names is not None else [None] * len(s))]
        # Folder names in ImageFolder's order where every labelled source takes its labels from folders.
        folders = all(getattr(s, "folder_labels", False) for s in listed if s.label_names is not None)
        self.classes = class_order({n for n in label_names if n is not None}, "parent" if folders else None)
        self.class_to_idx = {name: i for i, name in enumerate(self.classes)}
        if any(n is not None for n in labelled):
            self.table.label_of = np.array([-1 if n is None else self.class_to_idx[n] for n in label_names],
                                           dtype=np.int32)
        self._draws: dict[tuple[int, int], np.ndarray] = {}
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_draws"], state["_lock"] = {}, None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return self.size

    def __repr__(self) -> str:
        shares = ", ".join(f"{n}: {w:.3g}" for n, w in zip(self.names, self.weights))
        return f"Mixture({shares}; {self.size} draws an epoch)"

    @property
    def known_durations(self) -> list[float | None] | None:
        """Each of the mixture's items' duration where every source knows it (see ``Source``), else ``None``."""
        known = [s.known_durations for s in self.sources]
        if any(k is None for k in known):
            return None
        return [d for k in known for d in k]  # type: ignore[union-attr]  # None ruled out above

    def fingerprint(self) -> str:
        """The sources' fingerprints, weights and size: a saved state names the mixture it came from."""
        digest = hashlib.sha256(repr((self.size, self.weights.round(12).tolist(),
                                      [s.fingerprint() for s in self.sources])).encode("utf-8"))
        return f"mix{len(self.sources)}:{self.size}:{digest.hexdigest()[:16]}"

    def subset(self, indices: Sequence[int]) -> Source:
        raise TypeError("a Mixture has no subset: mix subsets of its sources instead")

    def draw(self, seed: int, epoch: int) -> np.ndarray:
        """The mixture's items of epoch ``epoch``: ``size`` indices into the concatenation (NOTE [ Mixtures ])."""
        key = (int(seed), int(epoch))
        table = self._draws.get(key)
        if table is not None:
            return table
        rng = np.random.default_rng([int(seed), int(epoch), _STREAM])
        quota = self.size * self.weights
        counts = np.floor(quota).astype(np.int64)
        left = self.size - int(counts.sum())
        if left:
            extra = quota - counts
            counts[rng.choice(len(counts), size=left, replace=False, p=extra / extra.sum())] += 1
        picks = []
        for k, (count, n) in enumerate(zip(counts.tolist(), self._lengths.tolist())):
            passes, rest = divmod(count, n)
            chosen = [rng.permutation(n) for _ in range(passes)] + [rng.permutation(n)[:rest]]
            picks.append(self.offsets[k] + np.concatenate(chosen))
        table = rng.permutation(np.concatenate(picks)).astype(np.int64)
        with self._lock:
            if len(self._draws) >= _REMEMBERED:
                self._draws.clear()
            self._draws[key] = table
        return table

    def source_of(self, items: np.ndarray) -> np.ndarray:
        """The source (its position in :attr:`sources`) of each of the mixture's ``items``."""
        return np.searchsorted(self.offsets, items, side="right") - 1

    def counts(self, seed: int, epoch: int, draws: np.ndarray | None = None) -> dict[str, int]:
        """Draws per source name in epoch ``epoch`` (of the draws ``draws`` only, where given)."""
        table = self.draw(seed, epoch)
        chosen = table if draws is None else table[np.asarray(draws, dtype=np.int64)]
        tally = np.bincount(self.source_of(chosen), minlength=len(self.sources))
        return {name: int(c) for name, c in zip(self.names, tally.tolist())}

    def item(self, index: int, *, epoch: int = 0, seed: int = 0, seq: int = 0,
             clock: ReadClock | None = None, blocks: BlockReads | None = None) -> WorkItem:
        """The work item of draw ``index`` of epoch ``epoch``: its source's item, whose ``index`` is its place
        in the mixture's items (stable across epochs) and whose ``label`` counts in the mixture's classes.
        A mixture reads a member at a time: ``blocks`` must be ``None``."""
        if blocks is not None:
            raise ValueError("a mixture reads its sources' members one at a time, not in blocks")
        g = int(self.draw(seed, epoch)[index])
        k = int(self.source_of(np.array([g]))[0])
        inner = self.sources[k].item(g - int(self.offsets[k]), epoch=epoch, seed=seed, seq=seq, clock=clock)
        label = None if inner.label_name is None else self.class_to_idx[inner.label_name]
        return WorkItem(g, inner.path, label, inner.label_name, inner.fields, epoch, seed, seq, inner.read,
                        inner.segment)


def _concatenated(sources: Sequence[Source]) -> ItemTable:
    """One table of the sources' items, in order: their paths, fields (a row lacks what its source has not)
    and segments (a whole file: from 0 s to its end)."""
    paths = [p for s in sources for p in s.paths]
    table: ItemTable | None = None
    if any(s.fields is not None for s in sources):
        rows = [row for s in sources for row in (s.fields if s.fields is not None else [{}] * len(s))]
        keys = list(dict.fromkeys(k for row in rows for k in row))
        table = table_of_paths(paths, columns=keys,
                               fields={k: as_column([row.get(k, ABSENT) for row in rows]) for k in keys})
    else:
        table = table_of_paths(paths)
    if any(s.table.segments is not None for s in sources):
        whole = np.array([[0.0, np.nan]])
        table.segments = np.concatenate([s.table.segments if s.table.segments is not None
                                         else np.repeat(whole, len(s), axis=0) for s in sources])
    return table


def _check_weights(weights: Sequence[float] | None, count: int, lengths: np.ndarray) -> np.ndarray:
    if weights is None:
        return lengths / lengths.sum()
    if isinstance(weights, (str, bytes)) or not isinstance(weights, Sequence):
        raise TypeError(f"mix() weights must be a sequence of numbers, one per source, got {weights!r:.80}")
    if len(weights) != count:
        raise ValueError(f"mix() weights must give one number per source: {count} sources, {len(weights)} weights")
    for w in weights:
        if isinstance(w, bool) or not isinstance(w, numbers.Real) or not math.isfinite(w) or w <= 0:
            raise ValueError(f"mix() weights must be finite numbers > 0, got {w!r}")
    values = np.asarray(weights, dtype=np.float64)
    values = values / values.max()  # each in (0, 1]: their sum cannot overflow (weights=[1e308, 1e308])
    return values / values.sum()
