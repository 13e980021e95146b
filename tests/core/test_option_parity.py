"""Every option's rule is written once (``audiobuffer.options.OPTIONS``): the loaders, the YAML schema,
the reference config and the docstrings agree with it, and give the same verdict on the same value."""

from __future__ import annotations

import inspect
import math

import pytest
import yaml
from helpers import IndexDecoder, duration_manifest, fake_paths
from plain_decoders import IndexDecoder as PlainIndexDecoder

from audiobuffer import BatchSlotLoader, BufferedDataset, ConfigError, IsolatedLoader
from audiobuffer._checks import MAX_SEED
from audiobuffer.config import parse_config, reference_config
from audiobuffer.options import MAX_BATCH_SIZE, OPTIONS, LoaderOptions

#: (option, value, whether it is taken), each given alone (with max_batch_seconds where it shapes
#: batches by duration): the same verdict from every loader and from the YAML.
CASES = [
    ("seed", 2**70, False), ("seed", 2**63, False), ("seed", -1, False), ("seed", 1.5, False),
    ("seed", True, False), ("seed", MAX_SEED, True),
    ("num_producers", 0, False), ("num_producers", 1025, False), ("num_producers", "eight", False),
    ("num_producers", 2.0, False), ("num_producers", None, True), ("num_producers", "auto", True),
    ("buffer_size", 0, False), ("buffer_size", (1 << 20) + 1, False), ("buffer_size", "64", False),
    ("max_bytes", 0, False), ("max_bytes", 1.0, False),
    ("warn_after", math.inf, True), ("warn_after", 0, False), ("warn_after", -1.0, False),
    ("warn_after", math.nan, False), ("warn_after", "5", False), ("warn_after", 1e12, True),
    ("timeout", math.inf, True), ("timeout", 10**12, True), ("timeout", 0.0, False), ("timeout", True, False),
    ("on_error", "ignore", False), ("on_error", None, False), ("even_shards", "even", False),
    ("even_shards", None, True), ("ordered", "yes", False), ("ordered", 1, False), ("shuffle", "true", False),
    ("max_batch_seconds", 0, False), ("max_batch_seconds", math.inf, False), ("max_batch_seconds", 86401, False),
    ("buckets", 0, False), ("buckets", 2.5, False), ("max_batch_size", 0, False),
    ("max_batch_size", MAX_BATCH_SIZE + 1, False), ("max_batch_size", MAX_BATCH_SIZE, True),
    ("quadratic_duration", -1.0, False), ("quadratic_duration", math.nan, False), ("sync_buckets", "yes", False),
    ("sync_buckets", 1, False), ("read_block", 0, False), ("read_block", "all", False), ("read_block", None, True),
    ("path_column", 3, False), ("duration_column", 1, False), ("start_column", ["a"], False),
    ("blas_threads", 0, False), ("blas_threads", "one", False), ("blas_threads", None, True),
    # one budget per bucket: a list, or a mapping from each bucket's upper edge to its budget
    ("max_batch_seconds", [30.0, 20.0], True), ("max_batch_seconds", {2.0: 30.0, 5.0: 20.0}, True),
    ("max_batch_seconds", [30.0, math.nan], False), ("max_batch_seconds", [30.0, 0.0], False),
    ("max_batch_seconds", [30.0, -1.0], False), ("max_batch_seconds", [], False),
    ("max_batch_seconds", {}, False),
    ("max_batch_seconds", [30.0, "20"], False), ("max_batch_seconds", [30.0, None], False),
    ("max_batch_seconds", {5.0: 30.0, 2.0: 20.0}, False),
    ("max_batch_seconds", {2.0: 30.0, 3.0: 0.0}, False),
    ("max_batch_seconds", {math.nan: 30.0}, False), ("max_batch_seconds", {0.0: 30.0}, False),
    ("max_batch_seconds", {2.0: math.nan}, False), ("max_batch_seconds", [30.0, math.inf], False),
]
#: Options that shape batches by duration: given with max_batch_seconds.
BY_DURATION = {"buckets", "max_batch_size", "quadratic_duration", "sync_buckets"}


def _keywords(name, value):
    keywords = {name: value}
    if name in BY_DURATION:
        keywords.update(max_batch_seconds=30.0, duration_column="seconds")
    elif name == "max_batch_seconds":
        keywords.update(duration_column="seconds")
    return keywords


def _yaml(keywords):
    """The config dict that sets ``keywords`` under their YAML keys."""
    data: dict = {"source": {"root": "."}}
    for name, value in keywords.items():
        *sections, key = OPTIONS[name].yaml.split(".")
        node = data
        for section in sections:
            node = node.setdefault(section, {})
        node[key] = value
    return data


def _verdict(build) -> bool:
    try:
        made = build()
    except (TypeError, ValueError):  # ConfigError is a ValueError
        return False
    close = getattr(made, "close", None)
    if close is not None:
        close()
    return True


@pytest.mark.subprocess
@pytest.mark.parametrize("name, value, taken", CASES, ids=[f"{n}={v!r}" for n, v, _ in CASES])
def test_every_loader_and_the_yaml_give_the_same_verdict(tmp_path, name, value, taken):
    keywords = _keywords(name, value)
    by_size = {} if "max_batch_seconds" in keywords else {"batch_size": 2}
    # batches by duration read each item's duration at construction: a manifest gives them
    items = duration_manifest(tmp_path, [1.0] * 4) if "max_batch_seconds" in keywords else fake_paths(4)
    verdicts = {
        "LoaderOptions": _verdict(lambda: LoaderOptions(**keywords)),
        "BufferedDataset": _verdict(lambda: BufferedDataset(items, IndexDecoder(), **keywords)),
        "IsolatedLoader": _verdict(lambda: IsolatedLoader(items, PlainIndexDecoder(), **by_size,
                                                          **keywords)),
        "YAML": _verdict(lambda: parse_config(_yaml(keywords), base_dir=tmp_path)),
    }
    # BatchSlotLoader takes no buffer_size, no ordered and no batches by duration
    if name not in ("buffer_size", "ordered") and "max_batch_seconds" not in keywords:
        verdicts["BatchSlotLoader"] = _verdict(lambda: BatchSlotLoader(items, IndexDecoder(),
                                                                       batch_size=2, **keywords))
    assert verdicts == dict.fromkeys(verdicts, taken)


#: Per-bucket budgets given with ``buckets``: as many budgets as buckets, or refused everywhere.
PER_BUCKET = [([30.0, 20.0], 2, True), ([30.0, 20.0], 3, False), ({2.0: 30.0, 5.0: 20.0}, 2, True),
              ({2.0: 30.0, 5.0: 20.0}, 1, False), ([30.0] * 10, None, True)]


@pytest.mark.parametrize("seconds, buckets, taken", PER_BUCKET,
                         ids=[f"{s!r}-{b}" for s, b, _ in PER_BUCKET])
@pytest.mark.subprocess
def test_budgets_per_bucket_agree_with_buckets_everywhere(tmp_path, seconds, buckets, taken):
    keywords = {"max_batch_seconds": seconds, "buckets": buckets, "duration_column": "seconds"}
    items = duration_manifest(tmp_path, [1.0] * 4)
    verdicts = {
        "LoaderOptions": _verdict(lambda: LoaderOptions(**keywords)),
        "BufferedDataset": _verdict(lambda: BufferedDataset(items, IndexDecoder(), **keywords)),
        "IsolatedLoader": _verdict(lambda: IsolatedLoader(items, PlainIndexDecoder(), **keywords)),
        "YAML": _verdict(lambda: parse_config(_yaml(keywords), base_dir=tmp_path)),
    }
    assert verdicts == dict.fromkeys(verdicts, taken)


def test_the_cases_cover_every_option_the_yaml_sets():
    assert {name for name, rule in OPTIONS.items() if rule.yaml and rule.kind != "other"} <= {c[0] for c in CASES}
    assert len([c for c in CASES if not c[2]]) >= 21


def test_every_option_has_one_rule_and_the_signature_follows_it():
    parameters = inspect.signature(BufferedDataset.__init__).parameters
    keywords = [p for p in parameters.values() if p.kind is p.KEYWORD_ONLY]
    assert [p.name for p in keywords] == list(OPTIONS)
    defaults = inspect.signature(LoaderOptions).parameters
    for p in keywords:
        assert p.default == defaults[p.name].default, p.name
        assert p.annotation == defaults[p.name].annotation, p.name
    for name, rule in OPTIONS.items():
        assert rule.doc.strip() and "\n" not in rule.doc, name


def test_every_option_is_documented_where_users_read_it():
    doc = inspect.getdoc(BufferedDataset)
    args = doc[doc.index("Args:"):]
    for name in OPTIONS:
        assert f"\n    {name}: " in args, f"BufferedDataset's docstring lacks {name}"
    # the other loaders point to BufferedDataset's list (naming a few, as examples or exceptions)
    # instead of keeping a copy that can drift
    for loader in (IsolatedLoader, BatchSlotLoader):
        listed = [name for name in OPTIONS if f"``{name}``" in inspect.getdoc(loader)]
        assert len(listed) <= len(OPTIONS) // 3, f"{loader.__name__} lists options again: {listed}"


def test_the_reference_config_gives_each_option_its_default():
    reference = yaml.safe_load(reference_config())
    for name, rule in OPTIONS.items():
        if rule.yaml is None:
            continue
        node = reference
        for part in rule.yaml.split("."):
            assert part in node, f"reference.yaml lacks {rule.yaml}"
            node = node[part]
        default = inspect.signature(LoaderOptions).parameters[name].default
        if name == "source.root":
            continue
        assert node == default, (rule.yaml, node, default)


def test_a_config_error_names_the_key():
    with pytest.raises(ConfigError, match=r"seed: must be >= 0 and <= 9223372036854775807, got 1180591620717411303424"):
        parse_config({"source": {"root": "."}, "seed": 2**70})
