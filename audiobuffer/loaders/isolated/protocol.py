"""The messages that cross the pipe between the trainer and the isolated loader's helper process.

Each message is a small named type; a frame on the pipe is one message, pickled. Nothing here imports
torch or numpy: the helper process imports this module too.

NOTE [ Helper protocol ]
========================
Who sends what, and when (the process around it: NOTE [ Helper process lifecycle ] in ``helper.py``;
how the trainer reads: NOTE [ Reading the helper on demand ] in ``channel.py``).

Handshake. The trainer's first frame is :class:`Setup` (its :data:`PROTOCOL_VERSION`, its
``sys.path``, the pickled :class:`HelperSpec`: the pipeline and the slots). The helper answers
:class:`Ready` (its version and what it reports of itself: ``pid``, ``torch``, ``gil``, the names
of its slots' ``segments``) or :class:`SetupFailed` (its version, and why: the pipeline did not
load, or the versions differ).
Each side checks the other's version before it reads anything else: a helper that imported another
audiobuffer (one in the current directory comes first on ``python -m``'s path) is a ``HelperError``
naming both versions. So that any two versions can read each other's handshake, :class:`Setup`,
:class:`Ready` and :class:`SetupFailed` keep this module, their names and their fields in every
version (a pickled NamedTuple is rebuilt from its fields by position): what a new version adds goes
into :class:`HelperSpec` or ``info``, and a change to the spec or to any other message raises
:data:`PROTOCOL_VERSION` (the spec is unpickled only once the versions agree).

Epochs, trainer -> helper. :class:`StartEpoch` starts epoch ``gen`` (each epoch a new generation,
which tags every message of it, so nothing of an abandoned epoch is taken for the next one's);
:class:`Free` hands a slot back once the trainer copied it out; :class:`StopEpoch` ends an epoch the
trainer leaves early; :class:`Close` (or the end of the pipe) ends the helper.

Epochs, helper -> trainer. Data frames, which the helper's writer holds back when too many wait
(``Channel.DATA_FRAMES``): :class:`Batch` (a batch collated into a slot), :class:`SampleFailed` (a
sample that failed, in its batch's place), :class:`Skipped` (a batch by duration whose samples all
failed). Control frames: :class:`EpochEnd` (the last of a finished epoch), :class:`Stalled` (a
producer stuck past ``timeout``), :class:`EpochError` (a bug of the helper's own), :class:`Stopped`
(the answer to :class:`StopEpoch`), :class:`Warm` (the warm-up is over: generation 0, no epoch's, so
an epoch's consumer drops it). :class:`Log` (a warning of the helper's) may come at any time; the
trainer's reader logs it and reads on.

Until :class:`Warm` comes, the trainer decodes an epoch's first batches itself and gives the helper
the rest of it (NOTE [ Starting in the trainer ] in ``loader.py``): the trainer makes its own
batches as the same messages (:class:`Batch` with slot -1 and the tensors in ``fields``), so one
consumer reads both.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from ...engine.pipeline import EpochLayout, Pipeline
    from ...engine.plan import EpochShard

#: Raised whenever a message other than the handshake's changes (NOTE [ Helper protocol ]).
PROTOCOL_VERSION = 3

__all__ = ["PROTOCOL_VERSION", "Batch", "Close", "EpochEnd", "EpochError", "Free", "FromHelper",
           "HelperSpec", "Log", "Ready", "SampleFailed", "Setup", "SetupFailed", "Skipped",
           "SlotArray", "Stalled", "StartEpoch", "StopEpoch", "Stopped", "ToHelper", "Warm",
           "package_description", "version_mismatch"]


# -- handshake (the same fields in every version) ------------------------------------------------


class Setup(NamedTuple):
    """Trainer -> helper, first: the trainer's protocol ``version``, its ``sys_path`` (put in place before
    the pipeline is unpickled, so that the user's modules import as in the trainer) and ``spec``, a
    :class:`HelperSpec` pickled by reference (unpickled only once the versions agree)."""

    version: int
    sys_path: list[str]
    spec: bytes


class Ready(NamedTuple):
    """Helper -> trainer, the answer to :class:`Setup`: the helper's protocol ``version`` and ``info``, what
    it reports of itself (``pid``, ``torch``: whether it imported torch, ``gil``, ``segments``: each slot's
    shared-memory name)."""

    version: int
    info: dict[str, Any]


class SetupFailed(NamedTuple):
    """Helper -> trainer, the answer to :class:`Setup` when the helper cannot serve: its protocol ``version``,
    and ``text`` and ``trace`` (the pipeline did not load), or where its audiobuffer is (the versions differ;
    ``trace`` empty)."""

    version: int
    text: str
    trace: str


@dataclass(frozen=True)
class HelperSpec:
    """What the helper runs, made once by the trainer and sent in :class:`Setup`; its fields are
    part of the protocol (NOTE [ Helper protocol ], Handshake).

    Attributes:
        pipeline: the trainer's pipeline, its source listed (the table in shared memory) and its
            batches by duration planned by the trainer (each epoch's layout comes with the epoch).
        batch_size: samples per batch; ``None`` with batches by duration.
        drop_last: drop the last, short batch of an epoch.
        num_slots: shared-memory slots; slot_bytes: the bytes each starts with.
        key: the sample key padded into the batch.
        background: run at a lower scheduling priority.
    """

    pipeline: Pipeline
    batch_size: int | None
    drop_last: bool
    num_slots: int
    slot_bytes: int
    key: str
    background: bool


# -- trainer -> helper -----------------------------------------------------------------------------


class StartEpoch(NamedTuple):
    """Start epoch ``gen``: the trainer's ``shard`` of epoch ``shard.number``, the units a loaded state
    ``consumed`` of it (``None``: a fresh epoch), and, for batches by duration, the ``layout`` the trainer
    planned (``None``: the helper plans the samples itself)."""

    gen: int
    shard: EpochShard
    consumed: bytes | None
    layout: EpochLayout | None


class Free(NamedTuple):
    """The trainer copied ``slot`` out (a :class:`Batch` of epoch ``gen``): the helper may fill it again."""

    gen: int
    slot: int


class StopEpoch(NamedTuple):
    """End epoch ``gen`` early (the trainer left it); the helper answers :class:`Stopped`."""

    gen: int


class Close(NamedTuple):
    """End the helper process (as the end of its stdin does)."""


# -- helper -> trainer -----------------------------------------------------------------------------


class SlotArray(NamedTuple):
    """Where a batch's array lies in its slot: from byte ``offset``, ``shape``, numpy ``dtype`` string."""

    offset: int
    shape: tuple[int, ...]
    dtype: str


class Batch(NamedTuple):
    """A batch of epoch ``gen`` collated into ``slot``, now the shared-memory ``segment`` of that name (a
    slot grows into a new segment when a batch does not fit). A batch the trainer made itself has
    slot -1, no segment, and its tensors in ``fields`` (NOTE [ Starting in the trainer ]).

    Attributes:
        fields: the batch's keys, in order: a :class:`SlotArray` for an array in the slot, else the
            values themselves (a list of strings, say).
        positions: the units the batch consumes of the epoch: its samples' and the failures' since the
            last batch (one batch position, for a batch by duration).
        rows: samples in the batch.
        decode_s: seconds the producers decoded so far this epoch.
        indices: each row's source index, for a batch by duration (its padding is counted from their
            durations); ``None`` otherwise.
    """

    gen: int
    slot: int
    segment: str
    fields: dict[str, Any]
    positions: list[int]
    rows: int
    decode_s: float
    indices: list[int] | None


class SampleFailed(NamedTuple):
    """A sample of epoch ``gen`` failed: item ``item_index`` (``path``) in ``producer``, with ``type_name`` and
    ``text`` of the exception, the exception pickled (``payload``; ``None`` where it does not pickle) and
    its traceback (``trace``). ``fatal``: the error policy is ``raise``, and the epoch ends here."""

    gen: int
    fatal: bool
    item_index: int
    path: str
    producer: str | None
    type_name: str
    text: str
    payload: bytes | None
    trace: str


class Skipped(NamedTuple):
    """The batch by duration at ``position`` of epoch ``gen`` is empty: every one of its samples failed."""

    gen: int
    position: int


class EpochEnd(NamedTuple):
    """Epoch ``gen`` is done: what only the helper knows of it (``stats``: ``decode_s``, ``buffer``,
    ``slot_wait_s``, ``num_producers``, ``producer_history``, ``gil_enabled``) and the ``positions`` of
    failures after the last batch."""

    gen: int
    stats: dict[str, Any]
    positions: list[int]


class Stalled(NamedTuple):
    """A producer of epoch ``gen`` was stuck past ``timeout``: the ``StallError``'s ``text``."""

    gen: int
    text: str


class EpochError(NamedTuple):
    """Epoch ``gen`` ended on an error of the helper's own (a bug): its ``text`` and ``trace``."""

    gen: int
    text: str
    trace: str


class Stopped(NamedTuple):
    """Epoch ``gen`` is stopped, its pool closed: the answer to :class:`StopEpoch`."""

    gen: int


class Warm(NamedTuple):
    """The helper's warm-up is over (NOTE [ Helper process lifecycle ], Start): it took ``seconds``.
    ``gen`` is 0, no epoch's."""

    gen: int
    seconds: float


class Log(NamedTuple):
    """A warning the helper logged, at ``level`` under ``logger``'s name, for the trainer to log."""

    level: int
    logger: str
    text: str


#: What the trainer sends.
ToHelper = Setup | StartEpoch | Free | StopEpoch | Close
#: What the helper sends.
FromHelper = (Ready | SetupFailed | Batch | SampleFailed | Skipped | EpochEnd | Stalled | EpochError
              | Stopped | Warm | Log)


def package_description() -> str:
    """This side's audiobuffer, as a version mismatch names it: its version and folder."""
    from ... import __version__

    return f"audiobuffer {__version__} in {Path(__file__).resolve().parents[2]}"


def version_mismatch(answer: object) -> str:
    """Why the helper's first message ``answer`` (a :class:`Ready` or :class:`SetupFailed` of another
    version, or whatever a helper without this protocol sent) cannot be served; for a ``HelperError``."""
    if isinstance(answer, (Ready, SetupFailed)):
        speaks = f"speaks protocol version {answer.version}"
    else:
        speaks = f"answered {type(answer).__name__} {str(answer)[:60]!r}, not a protocol version"
    said = f" (it says: {answer.text})" if isinstance(answer, SetupFailed) and answer.text else ""
    return (f"the helper process {speaks} and this trainer version {PROTOCOL_VERSION}: the helper imported another "
            f"audiobuffer than the trainer's ({package_description()}), one earlier on its path (python -m puts the "
            f"current directory first): run from another directory, or remove the other copy{said}")
