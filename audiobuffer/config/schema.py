"""YAML pipeline configuration: read with PyYAML, validated with pydantic.

A config file describes a whole pipeline::

    source:  {root: data/fsdd/recordings, labels: '^(\\d+)_'}
    decode:  {kind: audio, sample_rate: 8000, crop_seconds: 1.0}
    buffer:  {num_producers: auto, buffer_size: 64, on_error: warn}
    loader:  {batch_size: 32, shuffle: true, pin_memory: auto}
    device:  auto
    epochs:  3
    seed:    0

One vocabulary: a key is named as the Python keyword it feeds (``buffer.num_producers`` is
``BufferedDataset(num_producers=...)``, ``decode.crop_seconds`` is ``AudioDecoder(crop_seconds=...)``)
and its default is that keyword's, read from the Python side. The keys renamed to this end
(``buffer.producers``, ``buffer.capacity``) still load, with a :class:`DeprecationWarning` naming the
new key; a config that gives one option under both names is refused.

Relative paths in the file are resolved against the config file's folder; relative paths given by a
``--set key.path=value`` override are resolved against the current directory. Every problem (a file
that is not UTF-8 or not valid YAML, an unknown key, a wrong type or value, a number out of range, a
missing file, an empty corpus) is a :class:`~audiobuffer.ConfigError` whose one-line message starts
with the file's name and names the key path (as written), the value (cut to a short prefix) and what
is allowed. ``--set`` overrides (values parsed as YAML) are applied before validation, so they are
checked the same way. ``reference_config()`` returns the reference config shipped with the package:
every key with its default.
"""

from __future__ import annotations

import inspect
import os
import re
import warnings
from collections.abc import Callable, Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

from .._checks import choices, short_repr
from ..decoders.audio import MAX_CROP_SECONDS, AudioDecoder, CropMode, Quality
from ..decoders.image import Backend, ImageCrop, ImageDecoder, JpegDecode, Layout, Resample
from ..errors import ConfigError
from ..options import MAX_BATCH_SIZE, MAX_PRODUCERS, OPTIONS, LoaderOptions
from ..sources.storage import is_url as _is_url
from .messages import QUOTE_CHARS, format_errors, quote, yaml_problem

__all__ = ["PipelineConfig", "apply_overrides", "load_config", "parse_config", "reference_config"]

#: ``source.root`` in the reference config: a placeholder that says what to fill in, so that the file
#: fails the same way wherever it is saved instead of pointing at a folder beside this repository.
_REFERENCE_ROOT = "<your audio folder>"
#: Keys renamed to the Python keyword they feed, as (section, old name) -> new name: the old name still
#: loads, with a DeprecationWarning.
_RENAMED = {("buffer", "producers"): "num_producers", ("buffer", "capacity"): "buffer_size"}


def _python_default(owner: Callable[..., Any], name: str) -> Any:
    """The default of ``owner``'s keyword ``name``: a key's default is defined once, on the Python side."""
    return inspect.signature(owner).parameters[name].default


def option_field(name: str) -> Any:
    """The pydantic field of the loader option ``name``: its default, bounds and description read from
    its rule (:data:`~audiobuffer.options.OPTIONS`), so the YAML takes what the loaders take."""
    rule = OPTIONS[name]
    bounds: dict[str, Any] = {}
    if rule.kind == "int":
        bounds = dict(ge=rule.minimum, le=rule.maximum)
    elif rule.kind == "seconds":  # > 0; without a maximum, .inf means never, as float("inf") does
        bounds = dict(gt=0, le=rule.maximum, allow_inf_nan=rule.maximum is None, description="a number of seconds")
    elif rule.kind == "budgets":  # checked by the rule itself: see check_option
        bounds = dict(description="seconds, a list of seconds per bucket, or a mapping of edges "
                                  "to seconds")
    bounds = {key: value for key, value in bounds.items() if value is not None}
    return Field(default=_python_default(LoaderOptions, name), **bounds)


def check_option(name: str, value: Any) -> Any:
    """``value`` if the option ``name``'s rule takes it (a field validator: the rule's message,
    in the shape of the YAML's, ``key: what is wrong, got VALUE``, as the ``ValueError`` pydantic
    reports)."""
    try:
        OPTIONS[name].check(name, value)
    except (TypeError, ValueError) as exc:
        message = str(exc).removeprefix(f"{name} ").replace("must be None or ", "must be ")
        raise ValueError(message.removesuffix(f", got {short_repr(value)}")) from None
    return value


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader, reading as YAML 1.2 does: ``1e9`` and ``1.0e-3`` are numbers, and only
    ``true`` and ``false`` are booleans (``yes``, ``no``, ``on``, ``off`` are strings, refused by a
    boolean key with a hint)."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."))
_BOOL_TAG = "tag:yaml.org,2002:bool"
# add_implicit_resolver above gave _Loader its own copy of the resolvers: drop YAML 1.1's booleans from it.
_Loader.yaml_implicit_resolvers = {first: [(tag, rx) for tag, rx in resolvers if tag != _BOOL_TAG]
                                   for first, resolvers in _Loader.yaml_implicit_resolvers.items()}
_Loader.add_implicit_resolver(_BOOL_TAG, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF"))


def _load_yaml(text: str) -> Any:
    return yaml.load(text, Loader=_Loader)  # a SafeLoader: builds plain data only


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class MixEntry(_Section):
    """One source of a mixture (``source.mix``): exactly one of ``root``, ``manifest`` or ``files``, and how
    to list it (``Source``'s keywords of the same names; ``labels`` defaults to ``source.labels``)."""

    root: str | None = None
    manifest: str | None = None
    files: list[str] | None = None
    patterns: list[Annotated[str, Field(min_length=1)]] | None = None
    labels: str | None = None
    path_column: str = option_field("path_column")

    @model_validator(mode="after")
    def _one_kind(self) -> MixEntry:
        given = [k for k in ("root", "manifest", "files") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"give exactly one of root, manifest or files (got {given or 'none'})")
        return self


class SourceConfig(_Section):
    """Where the files come from: exactly one of ``root``, ``manifest`` or ``files`` (the forms of
    ``BufferedDataset``'s ``source``), or ``mix`` (``audiobuffer.mix`` of several, with ``weights`` and
    ``size``); the other keys are its keywords of the same names."""

    root: str | None = None
    manifest: str | None = None
    files: list[str] | None = None
    mix: list[MixEntry] | None = Field(default=None, min_length=2)
    weights: list[Annotated[float, Field(gt=0, allow_inf_nan=False)]] | None = None
    size: int | None = Field(default=None, ge=1)
    patterns: list[Annotated[str, Field(min_length=1)]] | None = option_field("patterns")
    labels: str | None = option_field("labels")
    path_column: str = option_field("path_column")
    duration_column: str | None = option_field("duration_column")
    start_column: str | None = option_field("start_column")
    storage_options: dict[str, Any] | None = option_field("storage_options")

    @model_validator(mode="after")
    def _one_kind(self) -> SourceConfig:
        given = [k for k in ("root", "manifest", "files", "mix") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"give exactly one of root, manifest, files or mix (got {given or 'none'})")
        if self.mix is None and (self.weights is not None or self.size is not None):
            raise ValueError("weights and size shape a mixture: give mix (a list of sources) too")
        if self.mix is not None and self.weights is not None and len(self.weights) != len(self.mix):
            raise ValueError(f"weights must give one number per source of mix: {len(self.mix)} sources, "
                             f"{len(self.weights)} weights")
        return self


#: The keys only ``kind: image`` takes (``size`` aside: its message is its own).
_IMAGE_ONLY = ("scale", "ratio", "crop_fraction", "flip", "layout", "draft", "jpeg", "backend")

#: ``decode.augment[].kind``: each augmentation of :mod:`audiobuffer.augment`, its class's name in
#: snake case.
AugmentKind = Literal["speed_perturb", "gain", "add_noise", "reverb"]
#: The keys each kind takes besides ``kind`` and ``p`` (its keywords of the same names).
AUGMENT_KEYS: dict[str, tuple[str, ...]] = {
    "speed_perturb": ("factors", "quality"), "gain": ("db",),
    "add_noise": ("source", "snr_db", "storage_options"), "reverb": ("source", "normalize", "storage_options"),
}
_Number = Annotated[float, Field(allow_inf_nan=False)]


class AugmentConfig(_Section):
    """One augmentation of ``decode.augment``: ``kind`` names the class of :mod:`audiobuffer.augment`
    (``speed_perturb`` is ``SpeedPerturb``, ``add_noise`` ``AddNoise``); the other keys are its keywords
    of the same names, defaults as in Python."""

    kind: AugmentKind
    p: float = Field(default=1.0, ge=0.0, le=1.0)
    factors: list[Annotated[float, Field(ge=0.25, le=4.0)]] | None = Field(default=None, min_length=1)
    quality: Quality | None = None
    db: _Number | tuple[_Number, _Number] | None = None
    snr_db: _Number | tuple[_Number, _Number] | None = None
    source: str | list[str] | None = None
    normalize: bool | None = None
    storage_options: dict[str, Any] | None = None

    @field_validator("db", "snr_db", mode="before")
    @classmethod
    def _pair_list(cls, value: Any) -> Any:
        return tuple(value) if isinstance(value, list) else value

    @model_validator(mode="after")
    def _keys_of_kind(self) -> AugmentConfig:
        allowed = AUGMENT_KEYS[self.kind]
        wrong = [k for k in ("factors", "quality", "db", "snr_db", "source", "normalize", "storage_options")
                 if getattr(self, k) is not None and k not in allowed]
        if wrong:
            raise ValueError(f"kind: {self.kind} takes {', '.join(('p',) + allowed)}, not {', '.join(wrong)}")
        if "source" in allowed and self.source is None:
            raise ValueError(f"kind: {self.kind} needs source: the folder, file list or manifest of its "
                             f"recordings")
        return self

    def keywords(self) -> dict[str, Any]:
        """The class's keywords this entry gives (the others keep their Python defaults)."""
        return {k: getattr(self, k) for k in ("p",) + AUGMENT_KEYS[self.kind] if getattr(self, k) is not None}


class DecodeConfig(_Section):
    """How a file becomes a sample: ``kind: audio`` (AudioDecoder) or ``kind: image`` (ImageDecoder); the
    other keys are that decoder's keywords of the same names. ``crop`` is either decoder's: where an
    audio crop is cut (default ``random``), or what part of an image is scaled to ``size`` (default
    null: the whole image)."""

    kind: Literal["audio", "image"] = "audio"
    sample_rate: int | None = Field(default=_python_default(AudioDecoder, "sample_rate"), gt=0)
    mono: bool = _python_default(AudioDecoder, "mono")
    crop_seconds: float | None = Field(default=_python_default(AudioDecoder, "crop_seconds"), gt=0,
                                       le=MAX_CROP_SECONDS, allow_inf_nan=False, description="a number of seconds")
    crop: CropMode | ImageCrop | None = _python_default(AudioDecoder, "crop")
    pad: bool = _python_default(AudioDecoder, "pad")
    quality: Quality = _python_default(AudioDecoder, "quality")
    fallback: Literal["librosa"] | None = _python_default(AudioDecoder, "fallback")
    size: int | tuple[int, int] | None = _python_default(ImageDecoder, "size")
    scale: tuple[float, float] = _python_default(ImageDecoder, "scale")
    ratio: tuple[float, float] = _python_default(ImageDecoder, "ratio")
    crop_fraction: float = Field(default=_python_default(ImageDecoder, "crop_fraction"), gt=0, le=1)
    flip: bool = _python_default(ImageDecoder, "flip")
    layout: Layout = _python_default(ImageDecoder, "layout")
    draft: bool = _python_default(ImageDecoder, "draft")
    resample: Resample = _python_default(ImageDecoder, "resample")
    jpeg: JpegDecode = _python_default(ImageDecoder, "jpeg")
    backend: Backend = _python_default(ImageDecoder, "backend")
    #: ``null`` (Python's default, no augmentation) is read as an empty list
    augment: list[AugmentConfig] = Field(default=_python_default(AudioDecoder, "augment"))

    @field_validator("augment", mode="before")
    @classmethod
    def _null_is_none(cls, value: Any) -> Any:
        return [] if value is None else value

    @field_validator("size", "scale", "ratio", mode="before")
    @classmethod
    def _size_list(cls, value: Any) -> Any:
        return tuple(value) if isinstance(value, list) else value

    @model_validator(mode="before")
    @classmethod
    def _image_crop_default(cls, data: Any) -> Any:
        # ImageDecoder's crop default (null) where an image section does not give crop
        if isinstance(data, Mapping) and data.get("kind") == "image" and "crop" not in data:
            data = {**data, "crop": _python_default(ImageDecoder, "crop")}
        return data

    @model_validator(mode="after")
    def _fields_of_kind(self) -> DecodeConfig:
        audio_only = ("sample_rate", "crop_seconds")
        if self.kind == "image":
            wrong = [k for k in audio_only if getattr(self, k) is not None]
            if wrong:
                raise ValueError(f"{', '.join(wrong)} apply to kind: audio, not kind: image")
            if self.augment:
                raise ValueError("augment applies to kind: audio, not kind: image")
            if self.crop not in (None, *choices(ImageCrop)):
                raise ValueError(f"crop with kind: image must be null, 'random_resized' or "
                                 f"'center', got {self.crop!r} (an audio crop)")
        else:
            if self.size is not None:
                raise ValueError("size applies to kind: image, not kind: audio")
            wrong = [k for k in _IMAGE_ONLY if k in self.model_fields_set]
            if wrong:
                verb = "applies" if len(wrong) == 1 else "apply"
                raise ValueError(f"{', '.join(wrong)} {verb} to kind: image, not kind: audio")
            if self.crop not in choices(CropMode):
                raise ValueError(f"crop with kind: audio must be 'random', 'start' or 'center', "
                                 f"got {self.crop!r} (an image crop: give kind: image)")
        return self


class BufferConfig(_Section):
    """The producer pool and its buffer: ``BufferedDataset``'s keywords of the same names (``isolate``
    picks ``IsolatedLoader`` instead)."""

    #: null is "auto" too, as None is in Python
    num_producers: Annotated[int, Field(ge=1, le=MAX_PRODUCERS)] | Literal["auto"] | None = _python_default(
        LoaderOptions, "num_producers")
    buffer_size: int = option_field("buffer_size")
    max_bytes: int | None = option_field("max_bytes")
    ordered: bool = option_field("ordered")
    on_error: Literal["raise", "warn", "skip"] = option_field("on_error")
    warn_after: float | None = option_field("warn_after")
    timeout: float | None = option_field("timeout")
    even_shards: Literal["pad", "drop"] | None = option_field("even_shards")
    blas_threads: int | None = option_field("blas_threads")
    isolate: bool = Field(default=False, description="run the producers in a helper process (IsolatedLoader)")

    @field_validator("num_producers")
    @classmethod
    def _none_is_auto(cls, value: int | Literal["auto"] | None) -> int | Literal["auto"]:
        return "auto" if value is None else value  # one spelling, as LoaderOptions stores it

    @property
    def producers(self) -> int | Literal["auto"] | None:
        """Deprecated name of :attr:`num_producers`."""
        warnings.warn("BufferConfig.producers is deprecated: use num_producers", DeprecationWarning, stacklevel=2)
        return self.num_producers

    @property
    def capacity(self) -> int:
        """Deprecated name of :attr:`buffer_size`."""
        warnings.warn("BufferConfig.capacity is deprecated: use buffer_size", DeprecationWarning, stacklevel=2)
        return self.buffer_size


class LoaderConfig(_Section):
    """How samples become batches: the keywords of the same names of ``BufferedDataset`` (``shuffle``
    and batches by duration), of ``IsolatedLoader`` and ``BatchSlotLoader``, and of the ``DataLoader``
    that batches a dataset's samples."""

    #: No Python default to share: the loaders that batch need it (or ``max_batch_seconds``).
    batch_size: int = Field(default=32, ge=1, le=MAX_BATCH_SIZE)
    shuffle: bool = option_field("shuffle")
    #: ``"auto"``: pin when CUDA is available, as ``IsolatedLoader`` and ``BatchSlotLoader`` do by default.
    pin_memory: bool | Literal["auto"] = "auto"
    drop_last: bool = False
    max_batch_seconds: float | list[float] | dict[float, float] | None = option_field(
        "max_batch_seconds")
    buckets: int | None = option_field("buckets")
    max_batch_size: int | None = option_field("max_batch_size")
    quadratic_duration: float | None = option_field("quadratic_duration")
    sync_buckets: bool | None = option_field("sync_buckets")
    read_block: Annotated[int, Field(ge=1)] | Literal["auto"] | None = _python_default(LoaderOptions, "read_block")

    @field_validator("max_batch_seconds")
    @classmethod
    def _budgets(cls, value: Any) -> Any:
        return check_option("max_batch_seconds", value)

    @model_validator(mode="after")
    def _batches_by_duration(self) -> LoaderConfig:
        per_bucket = None if isinstance(self.max_batch_seconds, (int, float, type(None))) \
            else len(self.max_batch_seconds)
        if per_bucket is not None and self.buckets is not None and self.buckets != per_bucket:
            raise ValueError(f"max_batch_seconds gives {per_bucket} budgets (one per bucket) but "
                             f"buckets is {self.buckets}: give as many budgets as buckets, or leave "
                             f"buckets out")
        if self.max_batch_seconds is None:
            given = [k for k in ("buckets", "max_batch_size", "quadratic_duration", "sync_buckets")
                     if getattr(self, k) is not None]
            if given:
                raise ValueError(f"{', '.join(given)} shape batches by duration: set max_batch_seconds too")
        elif self.drop_last:
            raise ValueError("drop_last applies to batch_size batches, not to max_batch_seconds: leave it false")
        return self


class TrainConfig(_Section):
    """Options of ``scripts/train_audio.py`` (the pipeline itself ignores them)."""

    lr: float = Field(default=3e-3, gt=0)
    weight_decay: float = Field(default=1e-4, ge=0)
    n_mels: int = Field(default=40, ge=1)
    n_fft: int = Field(default=256, ge=16)
    hop_length: int = Field(default=80, ge=1)
    channels: int = Field(default=32, ge=1)
    test_files: str | None = None
    checkpoint: str | None = None


_DEVICE_HELP = "'auto', 'cpu', 'cuda' or 'cuda:N'"


class PipelineConfig(_Section):
    """A whole pipeline; see the module docstring."""

    source: SourceConfig
    decode: DecodeConfig = DecodeConfig()
    buffer: BufferConfig = BufferConfig()
    loader: LoaderConfig = LoaderConfig()
    device: str = "auto"
    epochs: int = Field(default=1, ge=1)
    seed: int = option_field("seed")
    train: TrainConfig = TrainConfig()
    _origin: str = PrivateAttr(default="config")

    @property
    def origin(self) -> str:
        """Where the config came from (its file name), the prefix of every error about it."""
        return self._origin

    @model_validator(mode="after")
    def _jpeg_in_process(self) -> PipelineConfig:
        if self.decode.jpeg == "device" and self.buffer.isolate:
            raise ValueError("decode.jpeg: device hands JPEG bytes over for the trainer's device "
                             "to decode, which the helper process's batches cannot carry: give "
                             "buffer.isolate: false, or decode.jpeg: host")
        return self

    @field_validator("device")
    @classmethod
    def _device(cls, value: str) -> str:
        if value in ("auto", "cpu", "cuda"):
            return value
        if value.startswith("cuda:") and value[5:].isdigit():
            return value
        raise ValueError(f"must be {_DEVICE_HELP}")



#: Keys whose values are paths, as (section, key).
_PATH_KEYS = (("source", "root"), ("source", "manifest"), ("source", "files"), ("train", "checkpoint"))


def _resolve_path(value: str, base: Path) -> str:
    if _is_url(value):  # s3://, gs://, https://...: read through fsspec, not resolved
        return value
    path = Path(os.path.expanduser(value))
    return str(path if path.is_absolute() else base / path)


def _resolve_augment(entry: AugmentConfig, base: Path) -> AugmentConfig:
    """``entry`` with its ``source`` resolved against ``base`` (listed when the augmentation first runs)."""
    if entry.source is None:
        return entry
    if isinstance(entry.source, str):
        return entry.model_copy(update={"source": _resolve_path(entry.source, base)})
    return entry.model_copy(update={"source": [_resolve_path(v, base) for v in entry.source]})


def _resolve_raw_paths(data: Any, base: Path) -> None:
    """Resolve the relative paths of a raw (not yet validated) config dict against ``base``, in place."""
    if not isinstance(data, dict):
        return
    for section, key in _PATH_KEYS:
        node = data.get(section)
        if not isinstance(node, dict) or key not in node:
            continue
        value = node[key]
        if isinstance(value, str):
            node[key] = _resolve_path(value, base)
        elif isinstance(value, list):
            node[key] = [_resolve_path(v, base) if isinstance(v, str) else v for v in value]


def _other_name(section: str, key: str) -> str | None:
    """The other name of a renamed key (the new name of an old one, or the old name of a new one)."""
    for (where, old), new in _RENAMED.items():
        if where == section and key in (old, new):
            return new if key == old else old
    return None


def _rename_old_keys(data: Mapping[str, Any], origin: str) -> tuple[dict[str, Any], dict[str, str]]:
    """``data`` with each old key name replaced by the new one (a DeprecationWarning each, attributed to
    the caller of ``parse_config`` or ``load_config``), and {new key path: old key path} for the error
    messages, which name a key as it was written. ``data`` itself is left as it is.

    Raises:
        ConfigError: a section gives one option under both its names.
    """
    data = dict(data)
    written: dict[str, str] = {}
    for (section, old), new in _RENAMED.items():
        node = data.get(section)
        if not isinstance(node, Mapping) or old not in node:
            continue
        if new in node:
            raise ConfigError(f"{origin}: {section}.{old}: the old name of {section}.{new}, which is given too: "
                              f"keep only {section}.{new}, got {section}.{old}: {quote(node[old])} and "
                              f"{section}.{new}: {quote(node[new])}")
        data[section] = {new if key == old else key: value for key, value in node.items()}
        written[f"{section}.{new}"] = f"{section}.{old}"
        warnings.warn(f"{origin}: {section}.{old} is deprecated: write {section}.{new}", DeprecationWarning,
                      stacklevel=4)
    return data, written


def parse_config(data: Any, *, base_dir: str | os.PathLike[str] | None = None,
                 origin: str = "config") -> PipelineConfig:
    """Validate a config dict; resolve relative paths against ``base_dir``; check the source exists.

    Args:
        data: the config as read from YAML.
        base_dir: the folder relative paths resolve against (default: the current directory).
        origin: where the config came from (its file name), the prefix of every error message.

    Warns:
        DeprecationWarning: a key is given under its old name (``buffer.producers``), naming the new one.

    Raises:
        ConfigError: naming the key path, the value and what is allowed.
    """
    return _parse(data, base_dir, origin)


def _parse(data: Any, base_dir: str | os.PathLike[str] | None, origin: str) -> PipelineConfig:
    """:func:`parse_config`, called straight from each public function (the warnings' stack level)."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{origin}: expected a mapping of sections (source, decode, ...), got {quote(data)}")
    data, written = _rename_old_keys(data, origin)
    try:
        config = PipelineConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"{origin}: {format_errors(exc, PipelineConfig, written)}") from None
    base = Path(base_dir) if base_dir is not None else Path.cwd()
    src = config.source
    if src.duration_column is not None and config.loader.max_batch_seconds is None and src.start_column is None:
        raise ConfigError(f"{origin}: source.duration_column: read for batches by duration, set "
                          f"loader.max_batch_seconds too, got {quote(src.duration_column)}")

    def missing(key: str, given: str, resolved: str, what: str) -> ConfigError:
        where = f" (resolved to {quote(resolved, 2 * QUOTE_CHARS)})" if resolved != given else ""
        return ConfigError(f"{origin}: source.{key}: no such {what}, got {quote(given, 2 * QUOTE_CHARS)}{where}")

    update: dict[str, Any] = {}
    if src.root == _REFERENCE_ROOT:
        raise ConfigError(f"{origin}: source.root: fill in the folder of your audio files (or their shards' "
                          f"index.json) in place of the reference config's {quote(_REFERENCE_ROOT)}, or give it "
                          f"on the command line: --set source.root=PATH")
    if src.root is not None:
        update["root"] = root = _resolve_path(src.root, base)
        # a folder, an index of shards (.json), shards (.tar, maybe a brace pattern or a glob), Parquet
        # files, a Lhotse manifest (.jsonl, .jsonl.gz) or a URL
        kind = "file" if root.lower().endswith((".json", ".tar", ".parquet", ".jsonl", ".jsonl.gz")) else "directory"
        if not (_is_url(root) or re.search(r"[{*?\[]", root) or (Path(root).is_file() if kind == "file"
                                                                 else Path(root).is_dir())):
            raise missing("root", src.root, root, kind)
    if src.manifest is not None:
        update["manifest"] = _resolve_path(src.manifest, base)
        if not _is_url(update["manifest"]) and not Path(update["manifest"]).is_file():
            raise missing("manifest", src.manifest, update["manifest"], "file")
    if src.files is not None:
        update["files"] = [_resolve_path(f, base) for f in src.files]
    if src.mix is not None:
        entries = []
        for n, entry in enumerate(src.mix):
            moved: dict[str, Any] = {}
            for key in ("root", "manifest"):
                given = getattr(entry, key)
                if given is not None:
                    moved[key] = _resolve_path(given, base)
                    if not _is_url(moved[key]) and not Path(moved[key]).exists():
                        raise missing(f"mix[{n}].{key}", given, moved[key], "file or directory")
            if entry.files is not None:
                moved["files"] = [_resolve_path(f, base) for f in entry.files]
            entries.append(entry.model_copy(update=moved))
        update["mix"] = entries
    augment = [_resolve_augment(entry, base) for entry in config.decode.augment or ()]
    train_update = {}
    if config.train.checkpoint is not None:
        train_update["checkpoint"] = _resolve_path(config.train.checkpoint, base)
    config = config.model_copy(update={"source": src.model_copy(update=update),
                                       "decode": config.decode.model_copy(update={"augment": augment}),
                                       "train": config.train.model_copy(update=train_update)})
    config._origin = origin
    return config


def apply_overrides(data: dict[str, Any], overrides: Sequence[str], *,
                    base_dir: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """Apply ``key.path=value`` overrides (values parsed as YAML) to a raw config dict, in place.

    A relative path in an override (``source.root``, ``source.manifest``, ``source.files``,
    ``train.checkpoint``) is resolved here against ``base_dir`` (default: the current directory), as a
    path typed on a command line is; the file's own paths stay relative to the file. An override of a
    renamed key replaces the option under either name (``buffer.num_producers=8`` replaces the file's
    ``buffer.producers``).

    Raises:
        ConfigError: an override is not ``key.path=value``, its value is not YAML, or it sets a key
            inside a value that is not a section.
    """
    base = Path(base_dir) if base_dir is not None else Path.cwd()
    for override in overrides:
        key, sep, raw = override.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set {quote(override)}: expected key.path=value, e.g. buffer.num_producers=8")
        try:
            value = _load_yaml(raw) if raw.strip() else None
        except (yaml.YAMLError, ValueError, RecursionError) as exc:
            problem = " ".join(yaml_problem(exc).split())
            raise ConfigError(f"--set {quote(override)}: the value is {problem}") from None
        parts = key.strip().split(".")
        wrapped: Any = value
        for part in reversed(parts):
            wrapped = {part: wrapped}
        _resolve_raw_paths(wrapped, base)
        for part in parts:
            wrapped = wrapped[part]
        node = data
        for i, part in enumerate(parts[:-1]):
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"--set {quote(override)}: {'.'.join(parts[:i + 1])} is not a section")
            node = child
        other = _other_name(parts[0], parts[1]) if len(parts) == 2 else None
        if other is not None:
            node.pop(other, None)
        node[parts[-1]] = wrapped
    return data


def load_config(path: str | os.PathLike[str], overrides: Sequence[str] = ()) -> PipelineConfig:
    """Read, override and validate a YAML pipeline config.

    Relative paths in the file resolve against the file's folder; relative paths in ``overrides``
    against the current directory (see :func:`apply_overrides`).

    Warns:
        DeprecationWarning: a key is given under its old name (``buffer.producers``), naming the new one.

    Raises:
        ConfigError: the file is missing, not UTF-8 or not valid YAML, or the config does not validate.
            The message is one line and starts with the file's name.
    """
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read config file: {exc.strerror or exc}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        column = exc.start - raw.rfind(b"\n", 0, exc.start)
        raise ConfigError(f"{path}: not UTF-8 text: byte 0x{raw[exc.start]:02x} at line {line}, column {column} "
                          f"cannot be decoded; save the file as UTF-8") from None
    try:
        data = _load_yaml(text)
    except (yaml.YAMLError, ValueError, RecursionError) as exc:
        raise ConfigError(f"{path}: {yaml_problem(exc)}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of sections (source, decode, ...), got {quote(data)}")
    try:
        apply_overrides(data, overrides)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    return _parse(data, path.resolve().parent, str(path))


def reference_config() -> str:
    """The reference config shipped with the package: every key with its default and a comment.

    ``audiobuffer config --reference`` prints it; it is the same text as ``configs/reference.yaml``.
    """
    return (resources.files("audiobuffer") / "reference.yaml").read_text(encoding="utf-8")
