"""Tar header blocks: :func:`parse_header` reads one (ustar, GNU, v7), :func:`check_member` checks that the
header before a member's data in a shard is that member's, as its index says.
"""

from __future__ import annotations

import tarfile

from ...errors import StorageError

__all__ = ["ENCODING", "ERRORS", "HEADER", "check_member", "parse_header"]

#: How tar member names are decoded: bytes that are not UTF-8 kept as surrogates.
ENCODING, ERRORS = "utf-8", "surrogateescape"
#: Bytes of a tar header block, the one that lies just before each member's data.
HEADER = tarfile.BLOCKSIZE


# NOTE [ Members where an index says ]
# ====================================
# An index records where each member's data lies in its shard. A shard written again under the same
# name (a re-run ShardWriter job: the same samples in another order, the same size) or a server that
# answers a range from the wrong offset puts another member's bytes there, and the sample would come
# back with another's audio under its own label. So every read by index takes the 512-byte tar header
# just before the member along with it (index.read_member; a block read, blocks.py, holds its
# members' headers already), and check_member compares it with the index: a header block (its
# checksum right), of a file, of the member's size, naming the member. A name that does not fit a
# header's 100-byte field whole (longer, or not ASCII) is in a PAX or GNU header before it, and
# writers shorten the name in the block each their own way: there the size and type are checked. A
# mismatch is a StorageError naming the shard and member and saying to index the shards again. The
# index records no modification time or ETag, so an index of any age reads as before: copying or
# uploading the shards changes both while the bytes stay right, and neither catches a wrong range.


def check_member(header: bytes, url: str, member: str, offset: int, size: int) -> None:
    """Check that ``header``, the 512 bytes before ``offset`` in shard ``url``, is the tar header of a file
    ``member`` of ``size`` bytes (NOTE [ Members where an index says ]).

    Raises:
        StorageError: it is not, naming the shard, the member and what the header holds instead.
    """
    if _names_exactly(header, member, size):
        return
    found = _member_header(header)
    if found is None:
        what = "no tar header"
    else:
        name, length, kind = found
        fits = length == size or (length == 0 and size >= 8**11)  # a size beyond the field: in a PAX record
        if fits and kind in tarfile.REGULAR_TYPES and (name == member or not _whole_in_header(member)):
            return
        what = f"the header of {name!r} ({length} bytes)" if kind in tarfile.REGULAR_TYPES \
            else f"the header of {name!r}, not a file"
    raise StorageError(f"shard {url!r} does not hold member {member!r} ({size} bytes) at byte {offset} where "
                       f"its index says: the 512 bytes before it are {what}. The shard was written again after "
                       f"the index was made (or the server answered another range): run `audiobuffer index` "
                       f"on the shards (or pack them again) to index them as they are now", url=url,
                       member=member)


def _names_exactly(block: bytes, member: str, size: int) -> bool:
    """Whether ``block`` is a header of a file whose name field holds ``member`` whole (no ustar prefix)
    and whose size field ``size``: the common case, read from the fields without the checksum (a block
    of other bytes does not hold both by chance)."""
    name = member.encode(ENCODING, ERRORS)
    n = len(name)
    if len(block) != HEADER or n > 100 or block[:n] != name or (n < 100 and block[n] != 0):
        return False
    if block[156:157] not in tarfile.REGULAR_TYPES or (block[257:263] == b"ustar\0" and block[345] != 0):
        return False
    try:
        return int(block[124:136].split(b"\0", 1)[0].strip() or b"0", 8) == size
    except ValueError:
        return False


def _member_header(block: bytes) -> tuple[str, int, bytes] | None:
    """``(name, size, type)`` of a tar header block, or ``None`` where ``block`` is not one."""
    if len(block) != HEADER:
        return None
    parsed = parse_header(block)
    if parsed is not None:
        return parsed
    try:
        info = tarfile.TarInfo.frombuf(block, ENCODING, ERRORS)
    except tarfile.HeaderError:
        return None
    return info.name, info.size, info.type


def _whole_in_header(name: str) -> bool:
    """Whether every tar writer puts ``name`` whole in the member's own header block (ASCII, 100 bytes)."""
    return name.isascii() and len(name) <= 100


def parse_header(block: bytes) -> tuple[str, int, bytes] | None:
    """``(name, size, type)`` of a ustar, GNU or v7 header block, as ``tarfile.TarInfo.frombuf`` reads them.

    ``None`` for what this leaves to tarfile: a size in base-256, a checksum that is not the unsigned
    one, a field that is not octal. It reads only these three fields; ``frombuf`` parses every one.
    """
    size_field, checksum_field = block[124:136], block[148:156]
    if size_field[0] & 0x80:
        return None
    try:
        size = int(size_field.split(b"\0", 1)[0].strip() or b"0", 8)
        checksum = int(checksum_field.split(b"\0", 1)[0].strip() or b"0", 8)
    except ValueError:
        return None
    if checksum != sum(block) - sum(checksum_field) + 256:  # the checksum field counts as 8 spaces
        return None
    kind = block[156:157]
    name = block[:100].split(b"\0", 1)[0]
    if kind not in tarfile.GNU_TYPES:  # a ustar name split in two (tarfile reads the field in every format)
        prefix = block[345:500].split(b"\0", 1)[0]
        if prefix:
            name = prefix + b"/" + name
    return name.decode(ENCODING, ERRORS), size, kind
