"""Where the work items come from: folders, manifests, tar shards (by index or streamed), object
storage. The names below are imported on first use, so that the helper process, which needs only
:class:`WorkItem`, imports no more than that; ``pack`` and ``index_shards`` come from
:mod:`audiobuffer.prepare`, which reads through this package and the decoders.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "AUDIO_PATTERNS": ".item",
    "IMAGE_PATTERNS": ".item",
    "INDEX_NAME": ".index",
    "IndexColumns": ".index",
    "LabelSpec": ".source",
    "Member": ".index",
    "Mixture": ".mixture",
    "ReadClock": ".item",
    "ShardIndex": ".index",
    "ShardSample": ".tar",
    "ShardStream": ".stream",
    "Source": ".source",
    "SourceSpec": ".source",
    "WorkItem": ".item",
    "as_source": ".stream",
    "index_shards": "..prepare.pack",
    "iter_shard": ".tar",
    "mix": ".mixture",
    "pack": "..prepare.pack",
    "read_index": ".index",
    "read_index_columns": ".index",
    "shard_name": ".index",
    "shuffle_buffer": ".tar",
    "stream_shards": ".tar",
}

__all__ = [
    "AUDIO_PATTERNS",
    "IMAGE_PATTERNS",
    "INDEX_NAME",
    "IndexColumns",
    "LabelSpec",
    "Member",
    "Mixture",
    "ReadClock",
    "ShardIndex",
    "ShardSample",
    "ShardStream",
    "Source",
    "SourceSpec",
    "WorkItem",
    "as_source",
    "index_shards",
    "iter_shard",
    "mix",
    "pack",
    "read_index",
    "read_index_columns",
    "shard_name",
    "shuffle_buffer",
    "stream_shards",
]
assert set(__all__) == set(_EXPORTS), "__all__ and _EXPORTS name the same things"


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    loaded = importlib.import_module(module, __name__)
    # every name of that module at once (a submodule of this package named as one of them, bound
    # here as it is imported, would hide it)
    for other, where in _EXPORTS.items():
        if where == module:
            globals()[other] = getattr(loaded, other)
    return globals()[name]


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


if TYPE_CHECKING:
    from ..prepare.pack import index_shards, pack
    from .index import (
        INDEX_NAME,
        IndexColumns,
        Member,
        ShardIndex,
        read_index,
        read_index_columns,
        shard_name,
    )
    from .item import AUDIO_PATTERNS, IMAGE_PATTERNS, ReadClock, WorkItem
    from .mixture import Mixture, mix
    from .source import LabelSpec, Source, SourceSpec
    from .stream import ShardStream, as_source
    from .tar import ShardSample, iter_shard, shuffle_buffer, stream_shards
