"""Tar shards in WebDataset's layout: packing a source into them, and reading them back.

The layout :func:`pack` writes (WebDataset's: ``OUT/shard-NNNNNN.tar`` with each sample's original
file and a ``<key>.json`` sidecar, and ``OUT/index.json``) is described in ``audiobuffer/_pack.py``.

Reading, two ways:

* **By index** (random access): :func:`read_index` gives :class:`Member` records with the URL of
  the shard, and the offset and size of the member's data in it, so a producer reads one member with
  one ranged request (:meth:`Member.reader`, :func:`~audiobuffer.storage.read_range`); the epoch can
  shuffle across every member of every shard.
* **Streaming** (no index needed, any WebDataset shard): :func:`iter_shard` reads one shard from start
  to end and yields a :class:`ShardSample` per key (its files grouped, WebDataset's rule: consecutive
  members with the same key); :func:`stream_shards` chains shards in order through a seeded shuffle
  buffer (:func:`shuffle_buffer`, WebDataset's ``shuffle(n)``). A truncated shard yields the members
  before the cut, then raises a :class:`~audiobuffer.DecodeError` naming the shard and the member
  that was cut.

The path of a sample (:attr:`Member.path`, :attr:`ShardSample.path`) is ``<shard URL>/<original
relative path>``: it names the shard and ends with the original file name, so label expressions
and ``"parent"`` labels apply as they did to the original files.

As a dataset's source: ``BufferedDataset("packed/index.json", ...)`` reads members by range (a
:class:`~audiobuffer.Source` of the index), ``BufferedDataset("packed/shard-{000000..000011}.tar", ...)``
streams the shards (a :class:`ShardStream`, NOTE [ Streamed shards ] in ``_stream.py``).

The code, by concept: ``_shard_index.py`` (the index and ranged member reads), ``_tar.py`` (reading
shards from start to end), ``_pack.py`` (packing), ``_stream.py`` (streamed shards as a source); this
module gathers their public names.
"""

from __future__ import annotations

from ._pack import pack
from ._shard_index import INDEX_NAME, Member, ShardIndex, read_index, shard_name
from ._stream import ShardStream
from ._tar import ShardSample, iter_shard, shuffle_buffer, stream_shards

__all__ = [
    "INDEX_NAME",
    "Member",
    "ShardIndex",
    "ShardSample",
    "ShardStream",
    "iter_shard",
    "pack",
    "read_index",
    "shard_name",
    "shuffle_buffer",
    "stream_shards",
]
