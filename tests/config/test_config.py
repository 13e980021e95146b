import inspect
import re
import sys
import warnings
from pathlib import Path

import pytest
import torch
import yaml
from helpers import REPO, make_corpus
from pydantic import BaseModel
from torch.utils.data import DataLoader

import audiobuffer
from audiobuffer import (
    AudioDecoder,
    BatchSlotLoader,
    BufferedDataset,
    ConfigError,
    DevicePrefetcher,
    ImageDecoder,
    IsolatedLoader,
)
from audiobuffer.config import (
    PipelineConfig,
    apply_overrides,
    build_dataset,
    build_decoder,
    build_isolated,
    build_loader,
    load_config,
    parse_config,
    reference_config,
)
from audiobuffer.config.schema import _RENAMED
from audiobuffer.options import DEFAULT_WARN_AFTER, LoaderOptions

CONFIGS = sorted((REPO / "configs").glob("*.yaml"))


def test_configs_folder_is_not_empty():
    assert len(CONFIGS) >= 2


@pytest.mark.parametrize("path", CONFIGS, ids=[p.name for p in CONFIGS])
def test_every_shipped_config_loads_and_builds(path, fsdd):
    # the reference config leaves source.root for its user to fill in
    config = load_config(path, [f"source.root={fsdd}"] if path.name == "reference.yaml" else [])
    dataset = build_dataset(config)
    assert isinstance(dataset, BufferedDataset) and len(dataset) == 3000
    assert build_loader(config, dataset).batch_size == config.loader.batch_size


def write(tmp_path, data, name="pipeline.yaml"):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data) if not isinstance(data, str) else data)
    return path


@pytest.fixture
def corpus(tmp_path):
    make_corpus(tmp_path / "audio", 6)
    return tmp_path


def test_relative_paths_resolve_against_the_config_file(corpus, monkeypatch):
    monkeypatch.chdir("/")
    config = load_config(write(corpus, {"source": {"root": "audio"}, "train": {"checkpoint": "ck/model.pt"}}))
    assert config.source.root == str(corpus / "audio")
    assert config.train.checkpoint == str(corpus / "ck" / "model.pt")
    assert len(build_dataset(config)) == 6


def test_defaults(corpus):
    config = load_config(write(corpus, {"source": {"root": "audio"}}))
    assert (config.buffer.num_producers, config.buffer.buffer_size, config.buffer.on_error) == ("auto", 64, "raise")
    assert (config.loader.batch_size, config.device, config.epochs, config.decode.kind) == (32, "auto", 1, "audio")


def test_producers_auto_or_pinned_reach_the_dataset(corpus):
    config = load_config(write(corpus, {"source": {"root": "audio"}, "buffer": {"num_producers": "auto"}}))
    dataset = build_dataset(config)
    assert dataset.num_producers == "auto"
    assert sorted(s["path"] for s in dataset) == sorted(str(p) for p in (corpus / "audio").rglob("*.wav"))
    assert dataset.stats().producer_history[0][2] == "start"
    pinned = build_dataset(load_config(write(corpus, {"source": {"root": "audio"}, "buffer": {"num_producers": 3}})))
    assert pinned.num_producers == 3


def test_overrides_apply_and_are_validated(corpus):
    path = write(corpus, {"source": {"root": "audio"}})
    config = load_config(path, ["buffer.num_producers=8", "loader.pin_memory=false", "decode.crop_seconds=0.5",
                                "source.patterns=['class1/*.wav']", "epochs=3"])
    assert (config.buffer.num_producers, config.loader.pin_memory, config.decode.crop_seconds) == (8, False, 0.5)
    assert config.epochs == 3 and len(build_dataset(config)) == 2
    with pytest.raises(ConfigError,
                       match=r"buffer\.num_producers: must be an integer in \[1, 1024\] or 'auto', got 'eight'"):
        load_config(path, ["buffer.num_producers=eight"])
    assert load_config(path, ["buffer.num_producers=auto"]).buffer.num_producers == "auto"


@pytest.mark.parametrize("override, match", [
    ("buffer.num_producers", r"expected key\.path=value"),
    ("=3", r"expected key\.path=value"),
    ("epochs.x=3", "epochs is not a section"),
    ("decode.size=[1, ", "not valid YAML"),
])
def test_bad_overrides(override, match):
    with pytest.raises(ConfigError, match=match):
        apply_overrides({"epochs": 1}, [override])


BAD_CONFIGS = [
    ("unknown key", {"source": {"root": "audio"}, "buffer": {"num_prodcers": 8}},
     r"buffer\.num_prodcers: unknown key; allowed keys here: num_producers, buffer_size"),
    ("unknown section", {"source": {"root": "audio"}, "model": {}}, r"model: unknown key; allowed keys here: source"),
    ("wrong type", {"source": {"root": "audio"}, "buffer": {"num_producers": "eight"}},
     r"buffer\.num_producers: must be an integer in \[1, 1024\] or 'auto', got 'eight'"),
    ("float for int", {"source": {"root": "audio"}, "loader": {"batch_size": 3.5}}, r"loader\.batch_size: .*got 3\.5"),
    ("not a bool", {"source": {"root": "audio"}, "buffer": {"isolate": "maybe"}},
     r"buffer\.isolate: must be true or false, got 'maybe'"),
    ("too small", {"source": {"root": "audio"}, "buffer": {"num_producers": 0}},
     r"buffer\.num_producers: must be an integer in \[1, 1024\] or 'auto', got 0"),
    ("bad choice", {"source": {"root": "audio"}, "buffer": {"on_error": "ignore"}},
     r"buffer\.on_error: Input should be 'raise', 'warn' or 'skip', got 'ignore'"),
    ("bad device", {"source": {"root": "audio"}, "device": "tpu"},
     r"device: must be 'auto', 'cpu', 'cuda' or 'cuda:N', got 'tpu'"),
    ("missing source", {"epochs": 1}, r"source: required key is missing"),
    ("two sources", {"source": {"root": "audio", "files": ["a.wav"]}},
     r"source: give exactly one of root, manifest, files or mix"),
    ("mix of one", {"source": {"mix": [{"root": "audio"}]}}, r"source\.mix: .*at least 2"),
    ("weights without mix", {"source": {"root": "audio", "weights": [1, 2]}},
     r"source: weights and size shape a mixture: give mix"),
    ("mix weights", {"source": {"mix": [{"root": "audio"}, {"root": "audio"}], "weights": [1]}},
     r"source: weights must give one number per source of mix: 2 sources, 1 weights"),
    ("mix entry", {"source": {"mix": [{"root": "audio"}, {"root": "nowhere"}]}},
     r"source\.mix\[1\]\.root: no such file or directory, got 'nowhere'"),
    ("missing root", {"source": {"root": "nowhere"}}, r"source\.root: no such directory, got 'nowhere'"),
    ("missing manifest", {"source": {"manifest": "m.csv"}}, r"source\.manifest: no such file, got 'm\.csv'"),
    ("image option on audio", {"source": {"root": "audio"}, "decode": {"size": 32}},
     r"decode: size applies to kind: image"),
    ("audio option on image", {"source": {"root": "audio"}, "decode": {"kind": "image", "sample_rate": 8000}},
     r"decode: sample_rate apply to kind: audio"),
    ("negative crop", {"source": {"root": "audio"}, "decode": {"crop_seconds": -1}},
     r"decode\.crop_seconds: must be a number of seconds > 0 and <= 86400, got -1"),
    ("section not a mapping", {"source": {"root": "audio"}, "decode": 3},
     r"decode: must be a section \(a mapping of keys: kind, sample_rate, .*\), got 3$"),
    ("source not a mapping", {"source": "audio"}, r"source: must be a section \(a mapping of keys: root, manifest"),
    ("image size", {"source": {"root": "audio"}, "decode": {"kind": "image", "size": [1, "a"]}},
     r"decode\.size: must be an integer or a list \[height, width\] of two integers, got \(1, 'a'\)$"),
    ("unknown keys", {"source": {"root": "audio"}, "buffer": {"a": 1, "b": 2}},
     r"buffer: unknown keys a, b; allowed keys here: num_producers, buffer_size"),
    ("empty pattern", {"source": {"root": "audio", "patterns": ["*.wav", ""]}},
     r"source\.patterns\.1: must not be empty, got ''$"),
]


@pytest.mark.parametrize("name, data, match", BAD_CONFIGS, ids=[b[0] for b in BAD_CONFIGS])
def test_bad_config_names_key_value_and_what_is_allowed(corpus, name, data, match):
    path = write(corpus, data)
    with pytest.raises(ConfigError, match=match) as info:
        load_config(path)
    message = str(info.value)
    assert message.startswith(f"{path}: ") and "\n" not in message
    assert "instance of" not in message and "tuple[" not in message  # no pydantic internals


# Values that pass a type check but fail (or hang, or overflow) later: each is refused up front,
# naming the file, the key path, the value and the range allowed.
OUT_OF_RANGE = [
    ("seed", {"seed": -1}, r"seed: must be >= 0 and <= 9223372036854775807, got -1"),
    ("seed too large", {"seed": 2**63}, r"seed: must be >= 0 and <= 9223372036854775807, got 9223372036854775808"),
    ("timeout nan", {"buffer": {"timeout": float("nan")}},
     r"buffer\.timeout: must be a number of seconds > 0, got nan"),
    ("crop 1e300", {"decode": {"crop_seconds": 1e300}}, r"decode\.crop_seconds: .* <= 86400, got 1e\+300"),
    ("crop 1e9", {"decode": {"crop_seconds": 1e9}}, r"decode\.crop_seconds: .* <= 86400, got 1000000000\.0"),
    ("batch_size", {"loader": {"batch_size": 100000000000}},
     r"loader\.batch_size: must be >= 1 and <= 1048576, got 100000000000"),
    ("num_producers", {"buffer": {"num_producers": 100000}},
     r"buffer\.num_producers: must be an integer in \[1, 1024\] or 'auto', got 100000"),
    ("buffer_size", {"buffer": {"buffer_size": 1 << 21}},
     r"buffer\.buffer_size: must be >= 1 and <= 1048576, got 2097152"),
]


@pytest.mark.parametrize("name, data, match", OUT_OF_RANGE, ids=[b[0] for b in OUT_OF_RANGE])
def test_values_out_of_range_are_config_errors(corpus, name, data, match):
    path = write(corpus, {"source": {"root": "audio"}, **data})
    with pytest.raises(ConfigError, match=match) as info:
        load_config(path)
    assert str(info.value).startswith(f"{path}: ")


def test_exponents_are_numbers(corpus):
    """PyYAML alone reads 1e9 as a string (YAML 1.1); a config reads it as YAML 1.2 does."""
    path = write(corpus, "source: {root: audio}\ndecode: {crop_seconds: 5e-1}\n"
                         "buffer: {timeout: 1E3, warn_after: 2.5e+1}\n")
    config = load_config(path, ["buffer.max_bytes=1_000", "train.lr=1e-4"])
    assert (config.decode.crop_seconds, config.buffer.timeout, config.buffer.warn_after) == (0.5, 1000.0, 25.0)
    assert (config.buffer.max_bytes, config.train.lr) == (1000, 1e-4)
    with pytest.raises(ConfigError, match=r"decode\.crop_seconds: .* <= 86400, got 1000000000\.0"):
        load_config(path, ["decode.crop_seconds=1e9"])


def test_values_at_the_bounds_are_accepted(corpus):
    path = write(corpus, {"source": {"root": "audio"}, "seed": 2**63 - 1, "loader": {"batch_size": 1 << 20},
                          "buffer": {"timeout": 86400, "warn_after": 86400.0, "num_producers": 1024},
                          "decode": {"crop_seconds": 86400.0}})
    config = load_config(path)
    assert (config.seed, config.loader.batch_size, config.buffer.timeout) == (2**63 - 1, 1 << 20, 86400)


def test_several_problems_are_listed_on_one_line(corpus):
    path = write(corpus, {"source": {"root": "audio"}, "seed": -1, "epochs": 0,
                          "buffer": {"num_producers": "x", "buffer_size": 0, "timeout": -1, "warn_after": 0},
                          "loader": {"batch_size": 0}})
    with pytest.raises(ConfigError, match=r"buffer\.num_producers: .*, got 'x'; buffer\.buffer_size: ") as info:
        load_config(path)
    message = str(info.value)
    assert "\n" not in message and message.count("; ") == 5 and message.endswith("; and 2 more")


def billion_laughs(levels: int) -> str:
    """A YAML file of a few hundred bytes whose ``source.root`` expands to 9**levels strings."""
    lines = ['l0: &l0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]" for i in range(1, levels)]
    return "\n".join(lines + [f"source: {{root: *l{levels - 1}}}"]) + "\n"


@pytest.mark.timeout(60)
def test_alias_bomb_is_quoted_by_its_prefix(tmp_path):
    path = write(tmp_path, billion_laughs(9))
    with pytest.raises(ConfigError, match=r"source\.root: Input should be a valid string, got \[\[\[\[") as info:
        load_config(path)
    message = str(info.value)
    assert len(message) < 600 and "\n" not in message
    assert "(top level): unknown keys l0, l1, l2, l3, l4, l5, l6, l7 and 1 more" in message


@pytest.mark.timeout(60)
def test_huge_and_recursive_values_are_quoted_by_their_prefix(tmp_path):
    for text, match in [("source: {root: &r [*r]}", r"source\.root: "),
                        (f"source: {{root: [{'x' * 100000}]}}", r"source\.root: "),
                        ("- " + "y" * 100000, "expected a mapping of sections")]:
        with pytest.raises(ConfigError, match=match) as info:
            load_config(write(tmp_path, text))
        assert len(str(info.value)) < 400, str(info.value)[:400]


def test_empty_corpus_is_a_config_error(corpus):
    (corpus / "empty").mkdir()
    path = write(corpus, {"source": {"root": "empty"}})
    config = load_config(path)
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(path))}: source\.root: no files in"):
        build_dataset(config)


def test_label_regex_errors_are_config_errors(corpus):
    path = write(corpus, {"source": {"root": "audio", "labels": "^x"}})
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(path))}: source\.root: file .* does not match the label"):
        build_dataset(load_config(path))
    path = write(corpus, {"source": {"root": "audio", "labels": "(x"}})
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(path))}: source\.labels: .*not a valid regular"):
        build_dataset(load_config(path))


def test_override_errors_name_the_file(corpus):
    path = write(corpus, {"source": {"root": "audio"}})
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(path))}: --set 'epochs\.x=3': epochs is not a section"):
        load_config(path, ["epochs=1", "epochs.x=3"])


def test_overridden_relative_paths_resolve_against_the_current_directory(corpus, tmp_path_factory, monkeypatch):
    conf_dir = corpus / "conf"
    conf_dir.mkdir()
    path = write(conf_dir, {"source": {"root": "../audio"}, "train": {"checkpoint": "ck/model.pt"}})
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    make_corpus(elsewhere / "mine", 4)
    monkeypatch.chdir(elsewhere)
    config = load_config(path, ["source.root=mine"])
    assert config.source.root == str(elsewhere / "mine") and len(build_dataset(config)) == 4
    assert config.train.checkpoint == str(conf_dir / "ck" / "model.pt")  # the file's own value: its folder
    config = load_config(path, ["source={files: [mine/class0/0_0000.wav]}", "train.checkpoint=out/m.pt"])
    assert config.source.files == [str(elsewhere / "mine" / "class0" / "0_0000.wav")]
    assert config.train.checkpoint == str(elsewhere / "out" / "m.pt")
    assert load_config(path).source.root == str(conf_dir / "../audio")  # without --set: the file's folder
    with pytest.raises(ConfigError, match=r"source\.root: no such directory, got '.*elsewhere.*nope'"):
        load_config(path, ["source.root=nope"])


@pytest.mark.parametrize("text, match", [
    ("source: [unclosed", r"not valid YAML at line 1, column 18: expected ',' or '\]', but got '<stream end>' "
                          r"\(while parsing a flow sequence at line 1, column 9\)$"),
    ("source: {root: a}\n  bad: indent",
     r"not valid YAML at line 2, column 3: expected <block end>, but found '<block mapping start>' "
     r"\(while parsing a block mapping at line 1, column 1\)$"),
    ("source: !!python/name:os.system", "not valid YAML at line 1, column 9: could not determine a constructor"),
    ("seed: " + "1" * 5000, r"not valid YAML: a value cannot be converted: Exceeds the limit \(4300 digits\)"),
    ("seed: 2020-13-45", "not valid YAML: a value cannot be converted: month must be in 1..12"),
    ("seed: " + "[" * 5000 + "]" * 5000, "not valid YAML: nested too deeply"),
    ("- a\n- b\n", "expected a mapping of sections"),
], ids=["unclosed", "indent", "python tag", "huge int", "bad date", "deep", "list"])
def test_unreadable_yaml(tmp_path, text, match):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError, match=match) as info:
        load_config(path)
    assert str(info.value).startswith(f"{path}: ") and "\n" not in str(info.value)


def test_config_that_is_not_utf8(corpus):
    path = corpus / "latin1.yaml"
    path.write_bytes("# caf\u00e9\nsource: {root: audio}\n".encode("latin-1"))
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(path))}: not UTF-8 text: byte 0xe9 at line 1, "
                                          r"column 6 cannot be decoded; save the file as UTF-8$"):
        load_config(path)
    path.write_bytes("\ufeff# caf\u00e9\nsource: {root: audio}\n".encode("utf-8"))  # a BOM is fine
    assert load_config(path).source.root == str(corpus / "audio")


def test_missing_config_file(tmp_path):
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(tmp_path / 'nope.yaml'))}: cannot read config file"):
        load_config(tmp_path / "nope.yaml")


def test_packaged_reference_is_the_reference_config():
    packaged = Path(audiobuffer.__file__).parent / "reference.yaml"
    assert packaged.read_bytes() == (REPO / "configs" / "reference.yaml").read_bytes()
    assert reference_config() == packaged.read_text(encoding="utf-8")


def test_packaged_reference_loads_with_a_source(corpus):
    config = load_config(Path(audiobuffer.__file__).parent / "reference.yaml", [f"source.root={corpus / 'audio'}"])
    top_level = load_config(REPO / "configs" / "reference.yaml", [f"source.root={corpus / 'audio'}"])
    assert config.model_dump() == top_level.model_dump()
    assert len(build_dataset(config)) == 6


def test_parse_config_without_a_file(corpus):
    config = parse_config({"source": {"root": "audio"}}, base_dir=corpus)
    assert Path(config.source.root) == corpus / "audio"
    with pytest.raises(ConfigError, match="expected a mapping"):
        parse_config(["source"])


# -- batches by duration --------------------------------------------------------------------------------

@pytest.fixture
def durations_cached_here(tmp_path, monkeypatch):
    from audiobuffer.prepare.durations import CACHE_ENV

    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))


@pytest.mark.subprocess
@pytest.mark.usefixtures("durations_cached_here")
def test_loader_max_batch_seconds_builds_batches_by_duration(corpus):
    path = write(corpus, {"source": {"root": "audio"}, "loader": {"max_batch_seconds": 0.25, "buckets": 2,
                                                                  "max_batch_size": 3, "quadratic_duration": 30,
                                                                  "sync_buckets": False}})
    config = load_config(path)
    dataset = build_dataset(config)
    batching = dataset.batching
    assert (batching.max_batch_seconds, batching.buckets, batching.max_batch_size) == (0.25, 2, 3)
    assert batching.quadratic_duration == 30.0  # 2 x (0.1 + 0.01 / 30) s: still two 0.1 s files a batch
    assert batching.sync_buckets is False
    loader = build_loader(config, dataset)
    assert loader.batch_size is None  # the dataset yields whole batches
    batches = list(loader)
    assert len(batches) == len(dataset) == 3 and all(b["audio"].shape[0] == 2 for b in batches)  # 0.1 s files
    isolated = build_isolated(config)
    assert isolated.batch_size is None and isolated.pipeline.batching.max_batch_seconds == 0.25
    assert isolated.pipeline.batching.quadratic_duration == 30.0
    isolated.close()
    assert load_config(path, ["loader.max_batch_seconds=null", "loader.buckets=null", "loader.max_batch_size=null",
                              "loader.quadratic_duration=null", "loader.sync_buckets=null"]
                       ).loader.max_batch_seconds is None


@pytest.mark.usefixtures("durations_cached_here")
def test_source_duration_column_reads_a_manifest(corpus):
    (corpus / "m.csv").write_text("path,secs\n" + "".join(
        f"{p},{0.1 * (i + 1)}\n" for i, p in enumerate(sorted((corpus / "audio").rglob("*.wav")))))
    config = load_config(write(corpus, {"source": {"manifest": "m.csv", "duration_column": "secs"},
                                        "loader": {"max_batch_seconds": 1.0}}))
    assert build_dataset(config).batching.durations.tolist() == pytest.approx([0.1 * (i + 1) for i in range(6)])


@pytest.mark.parametrize("data, match", [
    ({"loader": {"buckets": 4}}, r"loader: buckets shape batches by duration: set max_batch_seconds too"),
    ({"loader": {"max_batch_size": 4}}, r"loader: max_batch_size shape batches by duration"),
    ({"loader": {"quadratic_duration": 15}}, r"loader: quadratic_duration shape batches by duration"),
    ({"loader": {"max_batch_seconds": 2, "quadratic_duration": 0}}, r"loader\.quadratic_duration: must be a number"),
    ({"loader": {"max_batch_seconds": 2, "drop_last": True}}, r"loader: drop_last applies to batch_size batches"),
    ({"loader": {"max_batch_seconds": 0}}, r"loader\.max_batch_seconds: must be a number of seconds > 0"),
    ({"loader": {"max_batch_seconds": "long"}}, r"loader\.max_batch_seconds: .*got 'long'"),
    ({"loader": {"max_batch_seconds": 2, "buckets": 0}}, r"loader\.buckets: must be >= 1, got 0"),
    ({"source": {"duration_column": "secs"}}, r"source\.duration_column: read for batches by duration, set "
                                               r"loader\.max_batch_seconds too, got 'secs'"),
])
def test_batch_by_duration_keys_are_checked(corpus, data, match):
    data = {**data, "source": {"root": "audio", **data.get("source", {})}}
    with pytest.raises(ConfigError, match=match):
        load_config(write(corpus, data))


# -- Windows paths, booleans, the key an error names, the reference config anywhere ------------------

def test_a_double_quoted_windows_path_says_how_to_write_it(corpus):
    path = write(corpus, 'source: {root: "C:\\data\\audio"}\n')
    with pytest.raises(ConfigError, match=r"unknown escape character 'd'.*single quotes \('C:\\data'\) or "
                                          r"with forward slashes \(C:/data\)") as info:
        load_config(path)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("word", ["yes", "no", "on", "off", "Yes", "OFF", "y", "n"])
def test_yaml_11_booleans_are_refused_alike_with_a_hint(corpus, word):
    """YAML 1.2 has only true and false: a config refuses yes/no/on/off in the file and in --set alike."""
    path = write(corpus, f"source: {{root: audio}}\nbuffer: {{isolate: {word}}}\n")
    hint = rf"buffer\.isolate: must be true or false \(.*\), got '{word}'"
    with pytest.raises(ConfigError, match=hint):
        load_config(path)
    with pytest.raises(ConfigError, match=hint):
        load_config(write(corpus, "source: {root: audio}\n", name="plain.yaml"), [f"buffer.isolate={word}"])


@pytest.mark.parametrize("word, value", [("true", True), ("false", False), ("True", True), ("FALSE", False)])
def test_true_and_false_are_booleans(corpus, word, value):
    path = write(corpus, f"source: {{root: audio}}\nbuffer: {{isolate: {word}}}\nloader: {{shuffle: {word}}}\n")
    config = load_config(path)
    assert config.buffer.isolate is value and config.loader.shuffle is value


def test_a_bad_brace_pattern_names_source_root(corpus):
    path = write(corpus, {"source": {"root": "shards/shard-{000..0x1}.tar", "labels": r"^(\d+)_"}})
    with pytest.raises(ConfigError, match=r"source\.root: brace pattern .*\{000\.\.0x1\}") as info:
        build_dataset(load_config(path))
    assert "source.labels" not in str(info.value)


def test_a_bad_label_expression_still_names_source_labels(corpus):
    path = write(corpus, {"source": {"root": "audio", "labels": "(unclosed"}})
    with pytest.raises(ConfigError, match=r"source\.labels: .*not a valid regular expression"):
        build_dataset(load_config(path))


@pytest.mark.parametrize("where", ["tmp", "configs", "package"])
def test_the_reference_config_says_what_to_fill_in_wherever_it_is(tmp_path, where):
    """Saved anywhere (`audiobuffer config --reference > my.yaml`), it fails the same way: naming the key
    to fill in and how, not with a path that only resolves beside the repository's configs/."""
    path = {"tmp": tmp_path / "my.yaml", "configs": REPO / "configs" / "reference.yaml",
            "package": Path(audiobuffer.__file__).parent / "reference.yaml"}[where]
    if where == "tmp":
        path.write_text(reference_config(), encoding="utf-8", newline="\n")
    with pytest.raises(ConfigError, match=r"source\.root: fill in the folder of your audio files .*"
                                          r"--set source\.root=PATH") as info:
        load_config(path)
    assert str(info.value).startswith(f"{path}: ")


# -- one vocabulary: a key is the Python keyword of the same name, with its default ----------------------

#: The constructors each section's keys feed ("": the top level's).
FEEDS = {
    "source": (BufferedDataset,),
    "decode": (AudioDecoder, ImageDecoder),
    "buffer": (BufferedDataset,),
    "loader": (BufferedDataset, IsolatedLoader, BatchSlotLoader, DataLoader),
    "": (BufferedDataset, DevicePrefetcher),
}
#: Keys that feed no keyword of their name, and why.
NOT_KEYWORDS = {
    "source.root": "a form of BufferedDataset's source argument",
    "source.manifest": "a form of BufferedDataset's source argument",
    "source.files": "a form of BufferedDataset's source argument",
    "source.mix": "a form of BufferedDataset's source argument: audiobuffer.mix(*sources)",
    "source.weights": "audiobuffer.mix(weights=...)",
    "source.size": "audiobuffer.mix(size=...)",
    "decode.kind": "picks the decoder, AudioDecoder or ImageDecoder",
    "buffer.isolate": "picks the loader, IsolatedLoader",
    "epochs": "the loop of audiobuffer run and scripts/train_audio.py",
    "train": "the section of scripts/train_audio.py",
}
#: Keys whose default is the config's own: the keywords they feed have none a config could share.
OWN_DEFAULTS = {
    "loader.batch_size": "BatchSlotLoader needs it; IsolatedLoader's None means batches by duration",
    "decode.crop": "AudioDecoder's; a kind: image section without crop takes ImageDecoder's (null)",
}
#: Keywords no key feeds, and why.
PYTHON_ONLY = {
    BufferedDataset: {"source": "the source section", "decoder": "the decode section",
                      "transform": "a callable", "rank": "torch.distributed's (or build_dataset's argument)",
                      "world_size": "torch.distributed's (or build_dataset's argument)"},
    AudioDecoder: {"native_wav": "benchmarks compare the readers", "tensors": "the loader's choice"},
    ImageDecoder: {"apply_exif_orientation": "left at its default", "tensors": "the loader's choice"},
    IsolatedLoader: {"source": "", "decoder": "", "num_slots": "tuning", "slot_bytes": "tuning",
                     "key": "the decode kind's", "background": "tests", "options": "BufferedDataset's",
                     "start_in_trainer": "a script that iterates at once"},
    BatchSlotLoader: {"source": "", "decoder": "", "num_slots": "tuning", "transform": "a callable",
                      "options": "BufferedDataset's"},
}


def keywords(owner):
    return {name: p for name, p in inspect.signature(owner).parameters.items()
            if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}


def config_keys():
    """Every key of the schema as (section, name, field): top-level keys in section ''."""
    for name, field in PipelineConfig.model_fields.items():
        if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
            for key, inner in field.annotation.model_fields.items():
                yield name, key, inner
        else:
            yield "", name, field


def test_every_key_is_a_python_keyword_of_the_same_name_and_default():
    own_defaults = set()
    for section, name, field in config_keys():
        path = f"{section}.{name}" if section else name
        if path in NOT_KEYWORDS or section in NOT_KEYWORDS:
            continue
        owners = [owner for owner in FEEDS[section] if name in keywords(owner)]
        assert owners, f"{path} names no keyword of {[o.__name__ for o in FEEDS[section]]}"
        for owner in owners:
            python = keywords(owner)[name].default
            if python is inspect.Parameter.empty or not owner.__module__.startswith("audiobuffer"):
                continue  # a required keyword, or torch's DataLoader: names only
            if field.default != python:
                own_defaults.add(path)
    assert own_defaults == set(OWN_DEFAULTS)


def test_every_python_keyword_is_a_key_or_said_why_not():
    keys = {name for _, name, _ in config_keys()}
    for owner, unfed in PYTHON_ONLY.items():
        missing = set(inspect.signature(owner).parameters) - keys - set(unfed) - {"self"}
        assert not missing, f"{owner.__name__}: {missing} are no config key: add them, or say why in PYTHON_ONLY"


def test_the_defaults_that_differed_are_one_constant():
    assert BufferedDataset.__init__.__kwdefaults__["warn_after"] == LoaderOptions.warn_after == DEFAULT_WARN_AFTER
    config = parse_config({"source": {"files": []}})
    assert config.buffer.warn_after == DEFAULT_WARN_AFTER == 5.0
    assert config.loader.shuffle is LoaderOptions.shuffle is False
    assert config.loader.pin_memory == keywords(IsolatedLoader)["pin_memory"].default == "auto"
    assert keywords(BatchSlotLoader)["pin_memory"].default == "auto"


def test_every_key_reaches_the_keyword_of_its_name(corpus):
    """Values other than the defaults, so that a key feeding the wrong keyword shows."""
    buffer = {"num_producers": 3, "buffer_size": 7, "max_bytes": 10**6, "ordered": True, "on_error": "warn",
              "warn_after": 2.5, "timeout": 100.0, "even_shards": "drop"}
    decode = {"sample_rate": 8000, "mono": False, "crop_seconds": 0.05, "crop": "center", "pad": False,
              "quality": "LQ"}
    config = load_config(write(corpus, {"source": {"root": "audio"}, "buffer": buffer, "decode": decode,
                                        "loader": {"shuffle": True, "batch_size": 2, "drop_last": True}, "seed": 9}))
    dataset = build_dataset(config)
    options = dataset.options
    assert {name: getattr(options, name) for name in buffer} == buffer
    assert (options.shuffle, options.seed) == (True, 9)
    decoder = build_decoder(config)
    assert {name: getattr(decoder, name) for name in decode} == decode
    loader = build_loader(config, dataset)
    assert (loader.batch_size, loader.drop_last, loader.pin_memory) == (2, True, torch.cuda.is_available())


def test_every_image_key_reaches_the_keyword_of_its_name(corpus):
    pytest.importorskip("PIL.Image", reason="kind: image needs Pillow")
    decode = {"size": (96, 128), "crop": "random_resized", "scale": (0.25, 0.9),
              "ratio": (0.5, 2.0), "crop_fraction": 0.8, "flip": True, "layout": "hwc",
              "draft": False, "resample": "bicubic", "jpeg": "device"}
    yaml_decode = {**decode, "kind": "image", "size": [96, 128], "scale": [0.25, 0.9],
                   "ratio": [0.5, 2]}
    config = load_config(write(corpus, {"source": {"root": "audio"}, "decode": yaml_decode}))
    decoder = build_decoder(config)
    assert isinstance(decoder, ImageDecoder)
    assert {name: getattr(decoder, name) for name in decode} == decode
    plain = build_decoder(load_config(write(corpus, {"source": {"root": "audio"},
                                                     "decode": {"kind": "image", "size": 32}})))
    assert (plain.crop, plain.flip, plain.layout, plain.size) == (None, False, "chw", (32, 32))
    center = parse_config({"source": {"files": []},
                           "decode": {"kind": "image", "crop": "center", "size": 8}})
    assert center.decode.crop == "center"


@pytest.mark.parametrize("decode, match", [
    ({"kind": "image", "size": 8, "crop": "random"},
     r"decode: crop with kind: image must be null, 'random_resized' or 'center', got 'random'"),
    ({"crop": "random_resized"}, r"decode: crop with kind: audio must be 'random', 'start' or "
                                 r"'center', got 'random_resized' \(an image crop: give kind"),
    ({"flip": True, "scale": [0.5, 1]}, r"decode: scale, flip apply to kind: image, not kind: "),
    ({"kind": "image", "size": 8, "scale": [0.5]}, r"decode\.scale"),
    ({"kind": "image", "size": 8, "crop_fraction": 1.5}, r"decode\.crop_fraction: .*1\.5"),
    ({"kind": "image", "crop": "center"}, r"decode: crop='center' scales its box to size: give "),
    ({"kind": "image", "size": 8, "scale": [0.9, 0.1]}, r"decode: scale must be .* \(0\.9, 0\.1\)"),
    ({"kind": "image", "size": 8, "jpeg": "gpu"}, r"decode\.jpeg: .*'host' or 'device'"),
    ({"kind": "image", "jpeg": "device"}, r"decode: jpeg='device' .* give size="),
    ({"jpeg": "device"}, r"decode: jpeg applies to kind: image, not kind: audio"),
])
def test_bad_image_decode_names_key_value_and_what_is_allowed(corpus, decode, match):
    pytest.importorskip("PIL.Image", reason="kind: image needs Pillow")
    with pytest.raises(ConfigError, match=match):
        config = load_config(write(corpus, {"source": {"root": "audio"}, "decode": decode}))
        build_decoder(config)


def test_jpeg_on_the_device_is_a_step_after_the_copy(corpus, monkeypatch):
    pytest.importorskip("PIL.Image", reason="kind: image needs Pillow")
    from audiobuffer.config import build_device_step

    image = {"kind": "image", "size": 8, "jpeg": "device"}
    with pytest.raises(ConfigError, match=r"decode\.jpeg: device .* give buffer\.isolate: false"):
        load_config(write(corpus, {"source": {"root": "audio"}, "decode": image,
                                   "buffer": {"isolate": True}}))
    host = load_config(write(corpus, {"source": {"root": "audio"},
                                      "decode": {**image, "jpeg": "host"}}))
    assert build_device_step(host, "cpu") is None
    config = load_config(write(corpus, {"source": {"root": "audio"}, "decode": image}))
    monkeypatch.setitem(sys.modules, "torchvision", None)  # as where it is not installed
    with pytest.raises(ConfigError, match=r"decode\.jpeg: device: .*install torchvision"):
        build_device_step(config, "cpu")


@pytest.mark.parametrize("value, pinned", [("auto", None), (True, None), (False, False)])
def test_pin_memory_takes_the_python_values(corpus, value, pinned):
    """``auto`` and ``true`` pin where CUDA is available (a config runs unchanged on a machine without)."""
    config = load_config(write(corpus, {"source": {"root": "audio"}, "loader": {"pin_memory": value}}))
    assert config.loader.pin_memory == value
    expected = torch.cuda.is_available() if pinned is None else pinned
    assert build_loader(config, build_dataset(config)).pin_memory is expected
    with pytest.raises(ConfigError, match=r"loader\.pin_memory: must be true, false or 'auto' \(YAML 1\.2.*got 'yes'"):
        load_config(write(corpus, {"source": {"root": "audio"}, "loader": {"pin_memory": "yes"}}))


@pytest.mark.parametrize("old, new", [(f"{s}.{o}", f"{s}.{n}") for (s, o), n in _RENAMED.items()])
def test_old_key_names_load_with_a_warning_naming_the_new_key(corpus, old, new):
    section, old_key = old.split(".")
    new_key = new.split(".")[1]
    path = write(corpus, {"source": {"root": "audio"}, section: {old_key: 3}})
    with pytest.warns(DeprecationWarning, match=rf"^{re.escape(str(path))}: {old} is deprecated: write {new}$"):
        config = load_config(path)
    assert getattr(config.buffer, new_key) == 3
    plain = write(corpus, {"source": {"root": "audio"}}, name="plain.yaml")
    with pytest.warns(DeprecationWarning, match=rf"{old} is deprecated: write {new}") as caught:
        assert getattr(load_config(plain, [f"{old}=4"]).buffer, new_key) == 4
    assert caught[0].filename == __file__  # the caller's line, where the default filters show it
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the new name: no warning
        assert getattr(load_config(plain, [f"{new}=5"]).buffer, new_key) == 5
    with pytest.warns(DeprecationWarning, match=f"config: {old} is deprecated"):
        assert getattr(parse_config({"source": {"root": "audio"}, section: {old_key: 6}}, base_dir=corpus).buffer,
                       new_key) == 6


def test_old_names_reach_the_dataset_and_errors_name_the_key_as_written(corpus):
    with pytest.warns(DeprecationWarning):
        dataset = build_dataset(load_config(write(corpus, {"source": {"root": "audio"},
                                                           "buffer": {"producers": 3, "capacity": 5}})))
    assert (dataset.num_producers, dataset.buffer_size) == (3, 5)
    path = write(corpus, {"source": {"root": "audio"}, "buffer": {"producers": "eight", "capacity": 0}})
    with pytest.warns(DeprecationWarning), pytest.raises(
            ConfigError, match=r"buffer\.producers: must be an integer in \[1, 1024\] or 'auto', got 'eight'; "
                               r"buffer\.capacity: must be >= 1 and <= 1048576, got 0$"):
        load_config(path)
    with pytest.warns(DeprecationWarning), pytest.raises(ConfigError, match=r"buffer\.producers: .*got 100000$"):
        load_config(path, ["buffer.producers=100000", "buffer.capacity=1"])


def test_an_option_under_both_names_is_an_error(corpus):
    path = write(corpus, {"source": {"root": "audio"}, "buffer": {"producers": 2, "num_producers": 4}})
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(path))}: buffer\.producers: the old name of "
                                          r"buffer\.num_producers, which is given too: keep only "
                                          r"buffer\.num_producers, got buffer\.producers: 2 and "
                                          r"buffer\.num_producers: 4$"):
        load_config(path)
    with pytest.raises(ConfigError, match=r"buffer\.capacity: the old name of buffer\.buffer_size"):
        parse_config({"source": {"root": "audio"}, "buffer": {"buffer_size": 8, "capacity": 8}}, base_dir=corpus)


def test_an_override_replaces_the_option_under_either_name(corpus):
    old = write(corpus, {"source": {"root": "audio"}, "buffer": {"producers": 2}}, name="old.yaml")
    assert load_config(old, ["buffer.num_producers=4"]).buffer.num_producers == 4
    new = write(corpus, {"source": {"root": "audio"}, "buffer": {"num_producers": 2}}, name="new.yaml")
    with pytest.warns(DeprecationWarning, match="buffer.producers is deprecated"):
        assert load_config(new, ["buffer.producers=4"]).buffer.num_producers == 4


def test_the_old_attribute_names_still_read(corpus):
    config = load_config(write(corpus, {"source": {"root": "audio"}, "buffer": {"num_producers": 3}}))
    with pytest.warns(DeprecationWarning, match="BufferConfig.producers is deprecated: use num_producers"):
        assert config.buffer.producers == 3
    with pytest.warns(DeprecationWarning, match="BufferConfig.capacity is deprecated: use buffer_size"):
        assert config.buffer.capacity == 64


def test_the_reference_config_lists_every_key_with_its_default(corpus):
    text = reference_config()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no old name in it
        config = parse_config({**yaml.safe_load(text), "source": {**yaml.safe_load(text)["source"],
                                                                   "root": "audio"}}, base_dir=corpus)
    defaults = parse_config({"source": {"root": "audio"}}, base_dir=corpus)
    assert config.model_dump() == defaults.model_dump()
    for section, name, _ in config_keys():
        pattern = rf"^ +(# )?{name}:" if section else rf"^{name}:"
        assert re.search(pattern, text, re.MULTILINE), f"{section}.{name} is not in the reference config"
