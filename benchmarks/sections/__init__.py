"""The sections of BENCHMARKS.md, one per question, in the page's order, and the page's introduction.

Each module holds one question's :class:`~sections.base.Section`: what it measures, its table, a sentence
read from the figures where one helps, and its plot, all made from saved results.
"""

from __future__ import annotations

from .augment import AUGMENT
from .base import Section, anchor
from .contention import CONTENTION
from .decode import DECODE
from .device import DEVICE
from .durations import DURATIONS
from .epochs import EPOCHS
from .formats import FORMATS
from .free_threaded import FREE_THREADED
from .images import IMAGES
from .overlap import OVERLAP
from .ranks import RANKS
from .raydata import RAY
from .scale import SCALE
from .storage import STORAGE
from .stress import STRESS
from .train import TRAIN
from .transform import TRANSFORM

__all__ = ["INTRO", "SECTIONS", "Section", "anchor"]

INTRO = """\
# Benchmarks

What audiobuffer's loaders gain and cost, a section a question: a table, how it was measured (machine, versions,
date, commit, the command again) and a plot. Ratios compare approaches in one run. **CPU**: a shared virtual
machine, 2 cores, no GPU (differences under about 15% are noise). **H100**: 16 cores, an NVIDIA H100 80GB HBM3
(up to 25% run to run). `--write` saves `benchmarks/results/NAME.json`; `benchmarks/render.py` renders the page."""

#: The page's sections, in order.
SECTIONS = [DECODE, EPOCHS, OVERLAP, CONTENTION, TRAIN, DEVICE, STORAGE, SCALE, FORMATS, DURATIONS, AUGMENT,
            TRANSFORM, IMAGES, RANKS, RAY, STRESS, FREE_THREADED]
