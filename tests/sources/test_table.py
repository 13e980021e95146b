"""The item table (audiobuffer/sources/table.py) and the listings that fill it (sources/listing.py)."""

from __future__ import annotations

import csv
import hashlib
import json
import pickle
import subprocess
import sys

import numpy as np
import pytest
from helpers import REPO, make_corpus

from audiobuffer.errors import SourceError
from audiobuffer.sources.source import Source
from audiobuffer.sources.table import ABSENT, Coded, Numbers, Objects, Strings, column_of


def write_csv(path, rows, header=("path", "speaker", "seconds")):
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(rows)
    return path


def rows_of(n):
    return [(f"spk{i % 3}/{i}_x.wav", f"spk{i % 3}", f"{0.5 + i / 100:.2f}") for i in range(n)]


def items_of(source):
    return [(w.index, w.path, w.label, w.label_name, dict(w.fields)) for w in map(source.item, range(len(source)))]


@pytest.mark.parametrize("names", [["a.wav", "bb/c.wav", "", "\u00e9t\u00e9.flac"], ["x\udcff.wav", "y.wav"]])
def test_strings_round_trip_and_take(names):
    column = Strings.from_strings(names)
    assert column.tolist() == names and [column[i] for i in range(len(names))] == names
    order = np.array(list(reversed(range(len(names)))))
    assert column.take(order).tolist() == names[::-1]


def test_column_of_keeps_each_value_as_given():
    assert isinstance(column_of(["a", "b", "a"]), Coded)
    ints = column_of([1, 2, 3])
    assert isinstance(ints, Numbers) and [ints[i] for i in range(3)] == [1, 2, 3] and type(ints[0]) is int
    mixed = column_of([1, 2.5, ABSENT])
    assert isinstance(mixed, Objects) and mixed[2] is ABSENT and type(mixed[0]) is int


def test_csv_manifest_items_and_the_fingerprint_of_their_paths(tmp_path):
    manifest = write_csv(tmp_path / "m.csv", rows_of(50))
    source = Source(manifest, labels="speaker")
    assert source.classes == ["spk0", "spk1", "spk2"]
    assert list(source.paths) == [str(tmp_path / f"spk{i % 3}" / f"{i}_x.wav") for i in range(50)]
    item = source.item(7)
    assert item.fields == {"speaker": "spk1", "seconds": "0.57"} and item.label_name == "spk1"
    digest = hashlib.sha256(b"".join(p.encode() + b"\0" for p in source.paths)).hexdigest()[:16]
    assert source.fingerprint() == f"50:{digest}"


def test_a_ragged_csv_reads_as_the_csv_module_reads_it(tmp_path):
    manifest = tmp_path / "m.csv"
    manifest.write_text("path,speaker\na.wav,x\nb.wav\nc.wav,y,extra\n", encoding="utf-8", newline="\n")
    source = Source(manifest)
    assert [dict(f) for f in source.fields] == [{"speaker": "x"}, {"speaker": None}, {"speaker": "y", None: ["extra"]}]


def test_parquet_manifest(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    table = pa.table({"path": [f"{i}.wav" for i in range(5)], "n": list(range(5)), "tag": ["a", None, "b", "a", "c"]})
    pq.write_table(table, tmp_path / "m.parquet")
    source = Source(tmp_path / "m.parquet", labels="tag")
    assert source.paths[4] == str(tmp_path / "4.wav")
    assert source.item(1).fields == {"n": 1, "tag": None} and source.item(1).label is None
    assert source.classes == ["a", "b", "c"] and source.item(2).label_name == "b"


def test_parent_labels_and_a_subset_keep_their_classes(tmp_path):
    source = Source(write_csv(tmp_path / "m.csv", rows_of(12)), labels="parent")
    part = source.subset([11, 0, 4])
    assert [w.label_name for w in map(part.item, range(3))] == ["spk2", "spk0", "spk1"]
    assert part.classes == source.classes and list(part.paths) == [source.paths[i] for i in (11, 0, 4)]


def test_a_bad_duration_names_its_row(tmp_path):
    from audiobuffer.prepare.durations import read_durations

    rows = rows_of(6)
    rows[4] = (rows[4][0], rows[4][1], "soon")
    with pytest.raises(SourceError, match=r"row 5: column 'seconds' holds 'soon'"):
        read_durations(Source(write_csv(tmp_path / "m.csv", rows)), duration_column="seconds")
    good = read_durations(Source(write_csv(tmp_path / "n.csv", rows_of(6))), duration_column="seconds")[0]
    assert good.tolist() == [0.5 + i / 100 for i in range(6)]


def test_a_shared_table_pickles_as_its_region_and_maps_the_same_items(tmp_path):
    from audiobuffer.loaders.isolated.tables import TableRegion

    small = Source(write_csv(tmp_path / "small.csv", rows_of(10)), labels="speaker")
    large = Source(write_csv(tmp_path / "large.csv", rows_of(5000)), labels="speaker")
    sizes = []
    regions: list[TableRegion] = []
    for source in (small, large):
        here, there = source.shared(lambda size: regions.append(TableRegion(size)) or regions[-1])
        payload = pickle.dumps(there)
        sizes.append(len(payload))
        copy = pickle.loads(payload)  # this process holds the descriptor, as a helper inherits it
        for shared in (here, copy):
            assert items_of(shared) == items_of(source) and shared.classes == source.classes
            assert shared.fingerprint() == source.fingerprint()
            if len(source) > 1000:  # arrays under 4 KiB go in the pickle of the rest
                assert not shared.table.names.data.flags.writeable and not shared.label_of.flags.writeable
        assert pickle.loads(pickle.dumps(here)).fingerprint() == source.fingerprint()  # by value, as any table
        del copy, here
    assert sizes[1] < 2048 < len(pickle.dumps(large))  # the items are in the region, not in the pickle
    for region in regions:
        region.close()


def test_a_shared_table_refuses_a_region_that_does_not_hold_it(tmp_path):
    from audiobuffer.loaders.isolated.tables import RegionHandle, TableRegion

    source = Source(write_csv(tmp_path / "m.csv", rows_of(3000)))
    regions: list[TableRegion] = []
    _, there = source.shared(lambda size: regions.append(TableRegion(size)) or regions[-1])
    regions.append(TableRegion(there.table.handle.size))  # the same size, empty: as a section made anew
    there.table.handle = regions[-1].handle
    with pytest.raises(ValueError, match="not in the region mapped"):
        pickle.loads(pickle.dumps(there))
    with pytest.raises(OSError, match="cannot map the item table shared by descriptor 10000"):
        RegionHandle(4096, fd=10_000).map()  # a descriptor this process does not have
    for region in regions:
        region.close()


def test_a_shared_table_crosses_in_a_named_section_on_windows(tmp_path, monkeypatch):
    # Windows maps the paging file by tag: sections are stood in for by anonymous maps kept by tag.
    import mmap
    import sys

    from audiobuffer.loaders.isolated import tables

    sections: dict[str, mmap.mmap] = {}
    real_mmap = mmap.mmap

    def windows_mmap(fileno: int, length: int, tagname: str | None = None, **kwargs: object) -> mmap.mmap:
        assert fileno == -1 and tagname and not kwargs
        if tagname not in sections:  # CreateFileMapping makes a section the first time, opens it after
            sections[tagname] = real_mmap(-1, length)
        return sections[tagname]

    monkeypatch.setattr(sys, "platform", "win32")
    monkeypatch.setattr(mmap, "mmap", windows_mmap)
    source = Source(write_csv(tmp_path / "m.csv", rows_of(3000)), labels="speaker")
    region = tables.TableRegion(1)
    assert region.pass_fds == () and region.handle.fd == -1 and region.handle.tag.startswith("audiobuffer-table-")
    here, there = source.shared(tables.TableRegion)
    copy = pickle.loads(pickle.dumps(there))
    assert items_of(copy) == items_of(here) == items_of(source)
    assert not copy.table.names.data.flags.writeable  # a section maps writable: the arrays are not
    gone = tables.RegionHandle(there.table.handle.size, tag="audiobuffer-table-gone")
    there.table.handle = gone  # opening a tag nobody holds makes an empty section: refused by its token
    with pytest.raises(ValueError, match="not in the region mapped"):
        pickle.loads(pickle.dumps(there))
    region.close()


def test_jsonl_keeps_missing_keys_missing(tmp_path):
    manifest = tmp_path / "m.jsonl"
    rows = [{"path": "a.wav", "n": 1}, {"path": "b.wav"}, {"path": "c.wav", "n": 2.5, "tags": ["x"]}]
    manifest.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8", newline="\n")
    assert [dict(f) for f in Source(manifest).fields] == [{"n": 1}, {}, {"n": 2.5, "tags": ["x"]}]


def test_paths_split_into_the_folders_some_path_has():
    from audiobuffer.sources.listing import table_of_paths

    paths = ["a.wav", "x/b.wav", "c.wav", "x/y/d.wav", "x/e.wav", "dir/"]
    table = table_of_paths(paths)
    assert table.paths() == paths
    assert sorted(table.prefixes) == ["", "dir/", "x/", "x/y/"]  # no code for a folder no path has
    assert [table.prefixes[c] for c in table.prefix_of] == ["", "x/", "", "x/y/", "x/", "dir/"]
    assert table.names.tolist() == ["a.wav", "b.wav", "c.wav", "d.wav", "e.wav", ""]


_FIRST_BATCH = """
import sys
import audiobuffer.sources.table as table
from torch.utils.data import DataLoader
from audiobuffer import AudioDecoder, BufferedDataset, pad_collate
source, by_arrow = sys.argv[1], sys.argv[2] == "arrow"
if by_arrow:
    table.ARROW_ROWS = 0  # the bulk readers of a large index, on this small one
with BufferedDataset(source, AudioDecoder(sample_rate=8000), num_producers=1, labels="label"
                     if source.endswith(".csv") else None) as dataset:
    batch = next(iter(DataLoader(dataset, batch_size=4, collate_fn=pad_collate)))
print(len(batch["audio"]), "pandas" in sys.modules, "pyarrow" in sys.modules)
"""


@pytest.fixture(scope="module")
def packed_and_listed(tmp_path_factory):
    from audiobuffer.sources import pack

    root = tmp_path_factory.mktemp("nopandas")
    files = make_corpus(root / "src", 12)
    pack(root / "src", root / "out", shard_size=20_000, labels="parent", progress=False)
    write_csv(root / "m.csv", [(str(f), f.parent.name) for f in files], header=("path", "label"))
    return root


@pytest.mark.subprocess
@pytest.mark.timeout(240)
@pytest.mark.parametrize("what, parser", [("index", "json"), ("index", "arrow"), ("csv", "arrow")])
def test_an_index_or_a_csv_manifest_is_read_without_importing_pandas(packed_and_listed, what, parser):
    """pyarrow imports pandas, where it is installed, on its first conversion from or to Python or
    numpy values (``pa.array``, ``pa.scalar``, ``to_numpy``): half a second and 60 MiB that a loader
    does not need. A small index is parsed by json, without pyarrow."""
    source = packed_and_listed / ("out/index.json" if what == "index" else "m.csv")
    result = subprocess.run([sys.executable, "-c", _FIRST_BATCH, str(source), parser], capture_output=True,
                            text=True, timeout=200, cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    count, pandas, pyarrow = result.stdout.split()
    assert count == "4" and pandas == "False"
    if what == "index" and parser == "json":
        assert pyarrow == "False"
