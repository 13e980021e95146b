"""The sections of BENCHMARKS.md, one per question, in the page's order, and the page's introduction.

Each module holds one question's :class:`~sections.base.Section`: what it measures, its table, a sentence
read from the figures where one helps, and its plot, all made from saved results.
"""

from __future__ import annotations

from .base import Section, anchor
from .contention import CONTENTION
from .decode import DECODE
from .device import DEVICE
from .durations import DURATIONS
from .epochs import EPOCHS
from .formats import FORMATS
from .free_threaded import FREE_THREADED
from .overlap import OVERLAP
from .ranks import RANKS
from .scale import SCALE
from .storage import STORAGE
from .stress import STRESS
from .train import TRAIN

__all__ = ["INTRO", "SECTIONS", "Section", "anchor"]

INTRO = """\
# Benchmarks

What audiobuffer's loaders gain and cost, one section per question: a table, how and where it was measured
(machine, versions, date, commit, the command that measures it again) and a plot. Ratios compare approaches
measured in one run; compare figures across sections only where the machine and the date match. **CPU**: a
virtual machine with 2 cores and no GPU, shared with other work (read differences under about 15% as noise).
**H100**: 16 cores and one NVIDIA H100 80GB HBM3 (timings varied by up to 25% from run to run). A benchmark run
with `--write` saves its results (`benchmarks/results/NAME.json`) and renders its section again;
`python benchmarks/render.py` renders the page and every plot from the saved results, measuring nothing."""

#: The page's sections, in order.
SECTIONS = [DECODE, EPOCHS, OVERLAP, CONTENTION, TRAIN, DEVICE, STORAGE, SCALE, FORMATS, DURATIONS, RANKS, STRESS,
            FREE_THREADED]
