"""A loader's place in its run: the epoch its next ``iter()`` runs, this process's shard, the point a
loaded state resumes at, and the state-dict encoding (:class:`EpochCursor`, :class:`StateKeys`), written
once for every loader; :class:`PipelineViews`, what every loader shows of its pipeline and cursor."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, cast

import torch
from torch.utils.data import get_worker_info

from .._checks import check_int
from ..engine import state as _format
from ..engine.plan import EpochShard
from ..engine.resize import (
    MERGED_FORMAT,
    STATE_MERGED,
    STATE_RANKS,
    Dealt,
    EpochUnits,
    check_ranks,
    is_merged,
)
from ..errors import ResumeError

if TYPE_CHECKING:
    from ..engine.pipeline import EpochLayout, Pipeline
    from ..sources.source import Source
    from ..sources.stream import ShardStream

__all__ = ["EpochCursor", "PipelineViews", "Resume", "StateKeys", "dataloader_worker"]

#: What a loaded state resumes: a consumed mask of the rank's shard, or a dealt epoch's share.
Resume = bytes | Dealt


class StateKeys:
    """The keys of a loader's ``state_dict()`` as class constants (``BufferedDataset.STATE_EPOCH``): the
    strings of ``engine/state.py``."""

    STATE_VERSION, STATE_EPOCH, STATE_ITEMS, STATE_CONSUMED, STATE_BATCHING = (
        _format.STATE_VERSION, _format.STATE_EPOCH, _format.STATE_ITEMS, _format.STATE_CONSUMED,
        _format.STATE_BATCHING)
    STATE_SEED, STATE_SHUFFLE, STATE_RANK, STATE_WORLD_SIZE, STATE_EVEN_SHARDS, STATE_SOURCE = (
        _format.SETUP_KEYS)


def dataloader_worker() -> tuple[int, int] | None:
    """``(worker id, num_workers)`` in a DataLoader worker process, else ``None``."""
    info = get_worker_info()
    return None if info is None else (info.id, info.num_workers)


class EpochCursor:
    """Where a loader is in its run: the epoch its next ``iter()`` runs, and the units of it that a loaded
    state already consumed; :meth:`state_dict` and :meth:`load_state_dict` encode and check them.

    A loaded state resumes its own epoch once: :meth:`set_epoch` to another epoch forgets it, and so does
    the next :meth:`begin`. Thread safety: any thread.
    """

    def __init__(self, pipeline: Pipeline) -> None:
        self.pipeline = pipeline
        self._lock = threading.Lock()
        self._epoch = 0
        self._resume: tuple[int, Resume] | None = None  # (epoch, consumed) from load_state_dict
        self._dealt: tuple[int, bytes] | None = None  # (epoch, done) of the dealt epoch run last
        self._start: int | None = None  # the epoch whose start a loaded state marks, until begun

    def __getstate__(self) -> dict[str, Any]:
        with self._lock:
            return {"pipeline": self.pipeline, "epoch": self._epoch, "resume": self._resume}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["pipeline"])  # type: ignore[misc]
        self._epoch, self._resume = state["epoch"], state["resume"]

    @property
    def epoch(self) -> int:
        """The epoch the next ``iter()`` runs."""
        return self._epoch

    def set_epoch(self, epoch: int) -> None:
        """Set the epoch of the next ``iter()``; a loaded state of another epoch is forgotten."""
        check_int("epoch", epoch, 0)
        with self._lock:
            self._epoch = epoch
            if self._resume is not None and self._resume[0] != epoch:
                self._resume = None
            if self._start != epoch:
                self._start = None

    def shard_info(self) -> tuple[int, int]:
        """This process's ``(rank, world_size)``: as given, else from ``torch.distributed``, else (0, 1)."""
        options = self.pipeline.options
        if options.world_size is not None:
            return options.rank, options.world_size  # type: ignore[return-value]  # given together
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            return torch.distributed.get_rank(), torch.distributed.get_world_size()
        return 0, 1

    def begin(self, worker: tuple[int, int] | None = None) -> tuple[EpochShard, Resume | None]:
        """The shard of the epoch starting now (``worker``: its DataLoader worker and their count) and the
        units a loaded state consumed of it, or its dealt share (``None``: a fresh epoch), taken once;
        :meth:`lay_out` lays it out."""
        rank, world_size = self.shard_info()
        with self._lock:
            number, resume = self._epoch, self._resume
            self._resume, self._start = None, None
            consumed = resume[1] if resume is not None and resume[0] == number else None
            self._dealt = (number, consumed.done) if isinstance(consumed, Dealt) else None
        return EpochShard(number, rank, world_size, *(worker or (0, 1))), consumed

    def lay_out(self, shard: EpochShard, resume: Resume | None) -> EpochLayout:
        """The layout of :meth:`begin`'s epoch: ``Pipeline.lay_out``, or a dealt epoch's share
        (NOTE [ Resume on another world size ] in ``engine/resize.py``).

        Raises:
            ResumeError: the resumed mask does not fit this shard's epoch.
        """
        return self.pipeline.lay_out(shard, resume)

    def length(self) -> int:
        """Items (batches, by duration) this rank yields in the next epoch: ``Pipeline.length``, or
        of a loaded merged state, this rank's share of the dealt epoch (of streamed tar shards,
        their samples)."""
        with self._lock:
            epoch, resume = self._epoch, self._resume
        if resume is None or not isinstance(resume[1], Dealt):
            return self.pipeline.length(epoch, *self.shard_info())
        rank, world_size = self.shard_info()
        if self.pipeline.streamed and self.pipeline.budget is not None:  # batches cut as they
            return self.pipeline.length(epoch, rank, world_size)  # stream: raises, as any epoch
        share = EpochUnits(self.pipeline, epoch).share(resume[1].done, rank, world_size)
        if self.pipeline.streamed:  # the units are tar shards: their samples
            return cast("ShardStream", self.pipeline.source).samples_in(share.tolist())
        return len(share)

    def state_dict(self, progress: tuple[int, bytes] | None) -> dict[str, Any]:
        """The state of plain builtins: a loaded state not yet resumed, else ``progress`` (the epoch run last
        here and its consumed mask) if it is of the next epoch, else the start of the next epoch."""
        with self._lock:
            epoch, resume, dealt, start = self._epoch, self._resume, self._dealt, self._start
        consumed: bytes | None = None
        done: bytes | None = None
        if resume is not None:
            epoch, saved = resume
            consumed, done = (saved.consumed, saved.done) if isinstance(saved, Dealt) else (saved, None)
        elif progress is not None and progress[0] == epoch and start != epoch:  # not a loaded start
            consumed = progress[1]
            done = dealt[1] if dealt is not None and dealt[0] == epoch else None
        return _format.encode_state(self._setup(), epoch, consumed, done)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Make the next ``iter()`` resume ``state``; checked whole before anything changes.

        A merged state (``audiobuffer.merge_states``) of any number of ranks loads on any rank: the
        units its ranks had not delivered are dealt again over this world (NOTE [ Resume on another
        world size ] in ``engine/resize.py``).

        Raises:
            ResumeError: the state is malformed or was saved under another setup.
        """
        resume: Resume | None
        if is_merged(state):
            epoch, resume = self._resolve(state)
        else:
            epoch, consumed = _format.decode_state(self._setup(), state)
            done = _format.decode_dealt(state)
            resume = consumed if done is None else Dealt(done, consumed)
        if resume is not None:  # the mask fits this rank's epoch (as saved: no DataLoader workers)
            self.pipeline.lay_out(EpochShard(epoch, *self.shard_info(), 0, 1), resume)
        with self._lock:
            self._epoch = epoch
            self._resume = None if resume is None else (epoch, resume)
            self._start = epoch if resume is None else None  # not an epoch run here before

    def _resolve(self, merged: dict[str, Any]) -> tuple[int, Dealt | None]:
        """A merged state's epoch and what it deals (``None``: no rank had begun it)."""
        if merged.get(STATE_MERGED) != MERGED_FORMAT:
            raise ResumeError(f"merged state format {merged.get(STATE_MERGED)!r} is not "
                              f"{MERGED_FORMAT}")
        epoch, world = merged.get(_format.STATE_EPOCH), merged.get(_format.STATE_WORLD_SIZE)
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise ResumeError(f"the merged state's epoch must be an integer >= 0, got {epoch!r}")
        if isinstance(world, bool) or not isinstance(world, int) or world < 1:
            raise ResumeError(f"the merged state's world_size must be an integer >= 1, got "
                              f"{world!r}")
        setup = self._setup()
        setup[_format.STATE_BATCHING] = self.pipeline.mask_setup(world)  # as the old ranks counted
        for key in (_format.STATE_SEED, _format.STATE_SHUFFLE, _format.STATE_EVEN_SHARDS,
                    _format.STATE_SOURCE, _format.STATE_BATCHING, _format.STATE_READ_BLOCK):
            if merged.get(key) != setup.get(key):
                raise ResumeError(f"the merged state was saved with {key}={merged.get(key)!r}, "
                                  f"this dataset has {key}={setup.get(key)!r}; resume with the "
                                  f"setup it was saved under")
        entries = check_ranks(merged.get(STATE_RANKS), world)
        begun = any(e.get(_format.STATE_ITEMS) is not None for e in entries)
        if not begun and merged.get(_format.STATE_DEALT) is None:
            return epoch, None  # every rank at the start of the epoch: a fresh one here
        return epoch, Dealt(EpochUnits(self.pipeline, epoch).done_of(merged))

    def _setup(self) -> dict[str, Any]:
        """What a state must have been saved under (``state.SETUP_KEYS`` and the batching)."""
        pipeline, options = self.pipeline, self.pipeline.options
        rank, world_size = self.shard_info()
        return {_format.STATE_SEED: options.seed, _format.STATE_SHUFFLE: options.shuffle,
                _format.STATE_RANK: rank, _format.STATE_WORLD_SIZE: world_size,
                _format.STATE_EVEN_SHARDS: options.even_shards,
                _format.STATE_SOURCE: pipeline.source.fingerprint(),
                _format.STATE_BATCHING: pipeline.mask_setup(world_size),
                _format.STATE_READ_BLOCK: pipeline.read_block()}


class PipelineViews:
    """What every loader shows of the :class:`~audiobuffer.engine.pipeline.Pipeline` it holds
    (``self.pipeline``) and of its :class:`EpochCursor` (``self._cursor``), both set by its constructor."""

    pipeline: Pipeline
    _cursor: EpochCursor

    @property
    def source(self) -> Source | ShardStream:
        """The listed source."""
        return self.pipeline.source

    @property
    def classes(self) -> list[str]:
        """The sorted label names; a sample's ``label`` (a batch's ``label`` entries) indexes this list."""
        return self.pipeline.source.classes

    @property
    def epoch(self) -> int:
        """The epoch the next ``iter()`` runs."""
        return self._cursor.epoch

    def set_epoch(self, epoch: int) -> None:
        """Set the epoch of the next ``iter()``: it seeds the shuffle and random crops.

        Call it at the start of every epoch, as with ``DistributedSampler``. With
        ``persistent_workers=True`` DataLoader workers keep the epoch they started with.
        """
        self._cursor.set_epoch(epoch)
