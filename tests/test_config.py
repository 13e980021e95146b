from pathlib import Path

import pytest
import yaml

from audiobuffer import BufferedDataset, ConfigError
from audiobuffer.config import apply_overrides, build_dataset, build_loader, load_config, parse_config
from helpers import REPO, make_corpus

CONFIGS = sorted((REPO / "configs").glob("*.yaml"))


def test_configs_folder_is_not_empty():
    assert len(CONFIGS) >= 2


@pytest.mark.parametrize("path", CONFIGS, ids=[p.name for p in CONFIGS])
def test_every_shipped_config_loads_and_builds(path, fsdd):
    config = load_config(path)
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
    assert (config.buffer.producers, config.buffer.capacity, config.buffer.on_error) == (2, 64, "raise")
    assert (config.loader.batch_size, config.device, config.epochs, config.decode.kind) == (32, "auto", 1, "audio")


def test_overrides_apply_and_are_validated(corpus):
    path = write(corpus, {"source": {"root": "audio"}})
    config = load_config(path, ["buffer.producers=8", "loader.pin_memory=false", "decode.crop_seconds=0.5",
                                "source.patterns=['class1/*.wav']", "epochs=3"])
    assert (config.buffer.producers, config.loader.pin_memory, config.decode.crop_seconds) == (8, False, 0.5)
    assert config.epochs == 3 and len(build_dataset(config)) == 2
    with pytest.raises(ConfigError, match=r"buffer\.producers: Input should be a valid integer, got 'eight'"):
        load_config(path, ["buffer.producers=eight"])


@pytest.mark.parametrize("override, match", [
    ("buffer.producers", r"expected key\.path=value"),
    ("=3", r"expected key\.path=value"),
    ("epochs.x=3", "epochs is not a section"),
    ("decode.size=[1, ", "not valid YAML"),
])
def test_bad_overrides(override, match):
    with pytest.raises(ConfigError, match=match):
        apply_overrides({"epochs": 1}, [override])


BAD_CONFIGS = [
    ("unknown key", {"source": {"root": "audio"}, "buffer": {"prodcers": 8}},
     r"buffer\.prodcers: unknown key; allowed keys here: producers, capacity"),
    ("unknown section", {"source": {"root": "audio"}, "model": {}}, r"model: unknown key; allowed keys here: source"),
    ("wrong type", {"source": {"root": "audio"}, "buffer": {"producers": "eight"}},
     r"buffer\.producers: Input should be a valid integer, got 'eight'"),
    ("float for int", {"source": {"root": "audio"}, "loader": {"batch_size": 3.5}}, r"loader\.batch_size: .*got 3\.5"),
    ("too small", {"source": {"root": "audio"}, "buffer": {"producers": 0}},
     r"buffer\.producers: Input should be greater than or equal to 1, got 0"),
    ("bad choice", {"source": {"root": "audio"}, "buffer": {"on_error": "ignore"}},
     r"buffer\.on_error: Input should be 'raise', 'warn' or 'skip', got 'ignore'"),
    ("bad device", {"source": {"root": "audio"}, "device": "tpu"}, r"device: must be 'auto', 'cpu', 'cuda' or 'cuda:N', got 'tpu'"),
    ("missing source", {"epochs": 1}, r"source: required key is missing"),
    ("two sources", {"source": {"root": "audio", "files": ["a.wav"]}}, r"source: give exactly one of root, manifest or files"),
    ("missing root", {"source": {"root": "nowhere"}}, r"source\.root: no such directory, got 'nowhere'"),
    ("missing manifest", {"source": {"manifest": "m.csv"}}, r"source\.manifest: no such file, got 'm\.csv'"),
    ("image option on audio", {"source": {"root": "audio"}, "decode": {"size": 32}}, r"decode: size applies to kind: image"),
    ("audio option on image", {"source": {"root": "audio"}, "decode": {"kind": "image", "sample_rate": 8000}},
     r"decode: sample_rate apply to kind: audio"),
    ("negative crop", {"source": {"root": "audio"}, "decode": {"crop_seconds": -1}}, r"decode\.crop_seconds: .*greater than 0"),
    ("section not a mapping", {"source": {"root": "audio"}, "decode": 3}, r"decode: Input should be a valid dictionary"),
]


@pytest.mark.parametrize("name, data, match", BAD_CONFIGS, ids=[b[0] for b in BAD_CONFIGS])
def test_bad_config_names_key_value_and_what_is_allowed(corpus, name, data, match):
    path = write(corpus, data)
    with pytest.raises(ConfigError, match=match) as info:
        load_config(path)
    assert str(path) in str(info.value)


def test_empty_corpus_is_a_config_error(corpus):
    (corpus / "empty").mkdir()
    config = load_config(write(corpus, {"source": {"root": "empty"}}))
    with pytest.raises(ConfigError, match=r"source\.root: no files in"):
        build_dataset(config)


def test_label_regex_errors_are_config_errors(corpus):
    with pytest.raises(ConfigError, match=r"source\.root: file .* does not match the label expression"):
        build_dataset(load_config(write(corpus, {"source": {"root": "audio", "labels": "^x"}})))
    with pytest.raises(ConfigError, match=r"source\.labels: .*not a valid regular expression"):
        build_dataset(load_config(write(corpus, {"source": {"root": "audio", "labels": "(x"}})))


@pytest.mark.parametrize("text, match", [
    ("source: [unclosed", "not valid YAML"),
    ("- a\n- b\n", "expected a mapping of sections"),
])
def test_unreadable_yaml(tmp_path, text, match):
    with pytest.raises(ConfigError, match=match):
        load_config(write(tmp_path, text))


def test_missing_config_file(tmp_path):
    with pytest.raises(ConfigError, match="cannot read config"):
        load_config(tmp_path / "nope.yaml")


def test_parse_config_without_a_file(corpus):
    config = parse_config({"source": {"root": "audio"}}, base_dir=corpus)
    assert Path(config.source.root) == corpus / "audio"
    with pytest.raises(ConfigError, match="expected a mapping"):
        parse_config(["source"])
