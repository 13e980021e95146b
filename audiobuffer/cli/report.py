"""Where the time went: the summary ``audiobuffer run`` and ``audiobuffer demo`` print, and its verdict."""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..engine.stats import PaddingMeter
from ..options import usable_cores

if TYPE_CHECKING:
    from ..loaders.dataset import DatasetStats

__all__ = ["RunSummary", "Timer", "write_json"]

#: The share of the run the consumer may wait for data before the run counts as input-bound.
INPUT_BOUND_SHARE = 0.10
#: How many failures the summary lists by name.
LISTED_FAILURES = 20


class Timer:
    """Accumulates the seconds spent inside ``with timer:`` blocks."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._start = 0.0

    def __enter__(self) -> Timer:
        self._start = time.perf_counter()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.seconds += time.perf_counter() - self._start


@dataclass
class RunSummary:
    """Totals of a run over its epochs, and what they say.

    Attributes:
        kind: ``"audio"`` or ``"image"``: what the samples are; it picks the throughput unit (seconds of
            audio per second, or images per second) and the advice on making decoding cheaper.
        consumer_wait_s: seconds the loop waited for data: for samples from the buffer (it was empty), or
            with an ``IsolatedLoader`` for batches from its helper process.
        producer_wait_s: seconds the producers waited for room, summed over producers (it was full).
        inline_s: of ``decode_s``, the seconds the loop's own thread decoded (``auto`` at 0 producers):
            time the loop spent on its input, counted with ``consumer_wait_s`` in the verdict.
        augment_s: of ``decode_s``, the seconds the decoder's augmentations ran (``decode.augment``).
        step_s: seconds the loop spent on its own work (the train step, device copies).
        padding: each epoch's padding fraction (padded seconds / seconds in batches): measured on the
            loop's own audio batches (each row's ``lengths``, the real frames, against the padded
            batch, whatever the decoder's crop and pad), else ``DatasetStats.padding`` (batches by
            duration); empty when neither is known.
        producers: the last epoch's producer count: pinned, or what ``producers: auto`` settled on (0:
            decoding in the loop's thread); auto: whether it was tuned; changes: how often the count
            changed in the last epoch.
        gil_enabled: whether the GIL was enabled (a free-threaded build can run without it).
    """

    kind: str = "audio"
    epochs: int = 0
    samples: int = 0
    batches: int = 0
    failed: int = 0
    failures: list = field(default_factory=list)
    wall_s: float = 0.0
    audio_s: float = 0.0
    decode_s: float = 0.0
    inline_s: float = 0.0
    augment_s: float = 0.0
    consumer_wait_s: float = 0.0
    producer_wait_s: float = 0.0
    step_s: float = 0.0
    producers: int = 0
    padding: list[float] = field(default_factory=list)
    auto: bool = False
    changes: int = 0
    gil_enabled: bool = True
    verdict: str = ""
    advice: str = ""

    def __post_init__(self) -> None:
        self._meter = PaddingMeter()  # this epoch's batches, so far (not a field: not in as_dict)

    def add_epoch(self, stats: DatasetStats | None) -> None:
        """Add one epoch's dataset stats."""
        self.epochs += 1
        if stats is None:
            return
        self.failed += stats.failed
        room = LISTED_FAILURES - len(self.failures)
        self.failures.extend([{"index": i, "path": p, "error": e} for i, p, e in stats.failures[:max(0, room)]])
        self.decode_s += stats.decode_s
        self.augment_s += stats.augment_s
        self.producers = stats.num_producers
        if self._meter.padded > 0:  # the batches the loop got this epoch
            self.padding.append(self._meter.fraction)
        elif stats.padding is not None:
            self.padding.append(stats.padding)
        self._meter = PaddingMeter()
        history = stats.producer_history
        self.auto = bool(history) and history[0][2] != "pinned"
        self.changes = sum(1 for (_, a, _), (_, b, _) in zip(history, history[1:]) if a != b)
        self.gil_enabled = stats.gil_enabled
        if stats.transfer:  # an IsolatedLoader: the buffer's consumer is the helper; the loop is the trainer
            self.consumer_wait_s += stats.transfer["trainer_wait_s"]
        else:
            self.inline_s += stats.inline_s  # decoded in the loop's own thread
            if stats.buffer is not None:
                self.consumer_wait_s += stats.buffer.get_wait_s
        if stats.buffer is not None:
            self.producer_wait_s += stats.buffer.put_wait_s

    def add_batch(self, batch: Any) -> None:
        """Count a batch's samples and, for audio, its seconds (from ``lengths`` and ``sample_rate``)."""
        self.batches += 1
        if isinstance(batch, dict):
            paths = batch.get("path")
            self.samples += len(paths) if isinstance(paths, list) else 0
            lengths, rates = batch.get("lengths"), batch.get("sample_rate")
            if self.kind == "audio" and lengths is not None and rates is not None:
                self.audio_s += float((lengths.double().cpu() / rates.double().cpu()).sum())
                self._meter.add_collated(batch)

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.wall_s if self.wall_s else 0.0

    @property
    def audio_s_per_s(self) -> float:
        return self.audio_s / self.wall_s if self.wall_s else 0.0

    def judge(self, *, producers_key: str = "buffer.num_producers") -> None:
        """Set ``verdict`` and ``advice`` from the waits on both sides of the buffer."""
        wall = self.wall_s or 1e-9
        inline = self.inline_s / wall
        waited = self.consumer_wait_s / wall
        full = self.producer_wait_s / (wall * max(1, self.producers))
        cores = usable_cores()
        if self.kind == "image":
            cheaper = cheapest = "smaller images, a cheaper resample filter"
        else:
            cheaper = "shorter crops, a lower sample rate"
            cheapest = f"{cheaper}, fewer channels"
        if waited + inline >= INPUT_BOUND_SHARE:  # decoding in the loop's thread is time spent on input too
            self.verdict = "input-bound"
            spent = f"the loop waited for data {waited:.0%} of the time"
            if inline > 0.005:
                spent += f" and decoded in its own thread {inline:.0%} of the time"
            if self.auto:
                self.advice = (f"{spent} with {producers_key}: auto, which settled on {self.producers} "
                               f"({cores} cores here): make decoding cheaper ({cheapest})")
            elif self.producers < cores:
                self.advice = (f"{spent}: raise {producers_key} (now {self.producers}, {cores} cores here) "
                               f"or make decoding cheaper ({cheaper})")
            else:
                self.advice = (f"{spent} and the {self.producers} producers already cover the {cores} cores: "
                               f"make decoding cheaper ({cheapest})")
        else:
            self.verdict = "compute-bound"
            self.advice = (f"loading keeps up: the loop waited for data {waited:.0%} of the time and the "
                           f"producers waited for room {full:.0%} of theirs; the loop's own work sets the pace")

    def as_dict(self) -> dict:
        """The summary as plain builtins, rates included (the audio ones only for ``kind="audio"``)."""
        data = asdict(self)
        data["samples_per_s"] = self.samples_per_s
        if self.kind == "audio":
            data["audio_s_per_s"] = self.audio_s_per_s
        else:
            del data["audio_s"]
        return data

    def lines(self) -> list[str]:
        """The summary for people."""
        throughput = (f"{self.samples_per_s:.1f} images/s" if self.kind == "image"
                      else f"{self.samples_per_s:.1f} samples/s, {self.audio_s_per_s:.1f} s of audio/s")
        out = [
            f"samples       {self.samples} in {self.epochs} epoch(s), {self.batches} batches, {self.wall_s:.2f} s",
            f"throughput    {throughput}",
            f"time split    loop waited for data {self.consumer_wait_s:.2f} s | producers waited for room "
            f"{self.producer_wait_s:.2f} s ({self.producers} producers) | decoding {self.decode_s:.2f} s "
            f"(summed over producers{self._inline_part()}) | loop's own work {self.step_s:.2f} s",
            f"producers     {self._producers_line()}",
            f"verdict       {self.verdict}: {self.advice}",
            *([f"padding       {sum(self.padding) / len(self.padding):.1%} of the batches' audio (zeros against "
               f"real frames; per epoch: {', '.join(f'{p:.1%}' for p in self.padding)})"] if self.padding else []),
            f"skipped files {self.failed}",
        ]
        out.extend(f"  {f['path']}: {f['error']}" for f in self.failures)
        return out

    def _inline_part(self) -> str:
        augmenting = f"; {self.augment_s:.2f} s of them augmenting" if self.augment_s >= 0.005 else ""
        return augmenting + (f"; {self.inline_s:.2f} s of them in the loop's thread" if self.inline_s >= 0.005
                             else "")

    def _producers_line(self) -> str:
        gil = "GIL enabled" if self.gil_enabled else "GIL disabled (free-threaded)"
        if not self.auto:
            return f"{self.producers} (pinned); {gil}"
        where = " (decoding in the loop's thread)" if self.producers == 0 else ""
        return (f"auto, settled on {self.producers}{where} after {self.changes} change(s) in the last epoch; "
                f"{gil}")


def write_json(target: str | os.PathLike[str] | None, data: Any) -> None:
    """Write ``data`` as indented JSON to ``target`` (``"-"``: stdout; ``None``: nowhere)."""
    if target is None:
        return
    text = json.dumps(data, indent=2, default=str)
    if str(target) == "-":
        sys.stdout.write(text + "\n")
    else:
        Path(target).write_text(text + "\n", encoding="utf-8", newline="\n")
