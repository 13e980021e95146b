"""YAML pipeline configuration: read with PyYAML, validated with pydantic.

A config file describes a whole pipeline::

    source:  {root: data/fsdd/recordings, labels: '^(\\d+)_'}
    decode:  {kind: audio, sample_rate: 8000, crop_seconds: 1.0}
    buffer:  {producers: 2, capacity: 64, on_error: warn}
    loader:  {batch_size: 32, pin_memory: true}
    device:  auto
    epochs:  3
    seed:    0

Relative paths are resolved against the config file's folder. Every problem (unknown key, wrong type
or value, missing file, empty corpus) is a :class:`~audiobuffer.ConfigError` that names the key path,
the value and what is allowed. ``--set key.path=value`` overrides (values parsed as YAML) are applied
before validation, so they are checked the same way.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Dict, List, Literal, Mapping, Optional, Sequence, Tuple, Union

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from .collate import pad_collate
from .errors import ConfigError, SourceError

__all__ = [
    "PipelineConfig",
    "apply_overrides",
    "build_dataset",
    "build_decoder",
    "build_loader",
    "build_source",
    "load_config",
    "parse_config",
]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class SourceConfig(_Section):
    """Where the files come from: exactly one of ``root``, ``manifest`` or ``files``."""

    root: Optional[str] = None
    manifest: Optional[str] = None
    files: Optional[List[str]] = None
    patterns: Optional[List[str]] = None
    labels: Optional[str] = None
    path_column: str = "path"

    @model_validator(mode="after")
    def _one_kind(self) -> "SourceConfig":
        given = [k for k in ("root", "manifest", "files") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"give exactly one of root, manifest or files (got {given or 'none'})")
        return self


class DecodeConfig(_Section):
    """How a file becomes a sample: ``kind: audio`` (AudioDecoder) or ``kind: image`` (ImageDecoder)."""

    kind: Literal["audio", "image"] = "audio"
    sample_rate: Optional[int] = Field(default=None, gt=0)
    mono: bool = True
    crop_seconds: Optional[float] = Field(default=None, gt=0, le=86400, allow_inf_nan=False)  # MAX_CROP_SECONDS
    crop: Literal["random", "start", "center"] = "random"
    pad: bool = True
    quality: Literal["QQ", "LQ", "MQ", "HQ", "VHQ"] = "HQ"
    fallback: Optional[Literal["librosa"]] = "librosa"
    size: Optional[Union[int, Tuple[int, int]]] = None
    resample: Literal["nearest", "bilinear", "bicubic", "lanczos", "box", "hamming"] = "bilinear"

    @field_validator("size", mode="before")
    @classmethod
    def _size_list(cls, value: Any) -> Any:
        return tuple(value) if isinstance(value, list) else value

    @model_validator(mode="after")
    def _fields_of_kind(self) -> "DecodeConfig":
        audio_only = ("sample_rate", "crop_seconds")
        if self.kind == "image":
            wrong = [k for k in audio_only if getattr(self, k) is not None]
            if wrong:
                raise ValueError(f"{', '.join(wrong)} apply to kind: audio, not kind: image")
        elif self.size is not None:
            raise ValueError("size applies to kind: image, not kind: audio")
        return self


class BufferConfig(_Section):
    """The producer pool and its buffer."""

    producers: int = Field(default=2, ge=1)
    capacity: int = Field(default=64, ge=1)
    max_bytes: Optional[int] = Field(default=None, ge=1)
    ordered: bool = False
    on_error: Literal["raise", "warn", "skip"] = "raise"
    warn_after: Optional[float] = Field(default=5.0, gt=0, allow_inf_nan=False)
    timeout: Optional[float] = Field(default=None, gt=0, allow_inf_nan=False)
    even_shards: Optional[Literal["pad", "drop"]] = "pad"


class LoaderConfig(_Section):
    """The ``DataLoader`` that batches the samples."""

    batch_size: int = Field(default=32, ge=1)
    shuffle: bool = True
    pin_memory: bool = True
    drop_last: bool = False


class TrainConfig(_Section):
    """Options of ``scripts/train_audio.py`` (the pipeline itself ignores them)."""

    lr: float = Field(default=3e-3, gt=0)
    weight_decay: float = Field(default=1e-4, ge=0)
    n_mels: int = Field(default=40, ge=1)
    n_fft: int = Field(default=256, ge=16)
    hop_length: int = Field(default=80, ge=1)
    channels: int = Field(default=32, ge=1)
    test_files: Optional[str] = None
    checkpoint: Optional[str] = None


_DEVICE_HELP = "'auto', 'cpu', 'cuda' or 'cuda:N'"


class PipelineConfig(_Section):
    """A whole pipeline; see the module docstring."""

    source: SourceConfig
    decode: DecodeConfig = DecodeConfig()
    buffer: BufferConfig = BufferConfig()
    loader: LoaderConfig = LoaderConfig()
    device: str = "auto"
    epochs: int = Field(default=1, ge=1)
    seed: int = 0
    train: TrainConfig = TrainConfig()

    @field_validator("device")
    @classmethod
    def _device(cls, value: str) -> str:
        if value in ("auto", "cpu", "cuda"):
            return value
        if value.startswith("cuda:") and value[5:].isdigit():
            return value
        raise ValueError(f"must be {_DEVICE_HELP}")


def _format_error(error: Mapping[str, Any], model: type[BaseModel]) -> str:
    loc = [str(part) for part in error["loc"]]
    key = ".".join(loc) or "(top level)"
    if error["type"] == "extra_forbidden":
        parent: Any = model
        for part in loc[:-1]:
            annotation = parent.model_fields[part].annotation
            parent = annotation if isinstance(annotation, type) else parent
        allowed = ", ".join(parent.model_fields)
        return f"{key}: unknown key; allowed keys here: {allowed}"
    if error["type"] == "missing":
        return f"{key}: required key is missing"
    message = error["msg"].removeprefix("Value error, ")
    return f"{key}: {message}, got {error['input']!r}"


def parse_config(data: Any, *, base_dir: Union[str, os.PathLike[str], None] = None,
                 origin: str = "config") -> PipelineConfig:
    """Validate a config dict; resolve relative paths against ``base_dir``; check the source exists.

    Raises:
        ConfigError: naming the key path, the value and what is allowed.
    """
    if not isinstance(data, Mapping):
        raise ConfigError(f"{origin}: expected a mapping of sections (source, decode, ...), got {data!r}")
    try:
        config = PipelineConfig.model_validate(dict(data))
    except ValidationError as exc:
        lines = [_format_error(e, PipelineConfig) for e in exc.errors()]
        raise ConfigError(f"{origin}: " + "\n  ".join(lines)) from None
    base = Path(base_dir) if base_dir is not None else Path.cwd()
    src = config.source

    def resolve(value: str) -> str:
        path = Path(os.path.expanduser(value))
        return str(path if path.is_absolute() else base / path)

    update: Dict[str, Any] = {}
    if src.root is not None:
        update["root"] = resolve(src.root)
        if not Path(update["root"]).is_dir():
            raise ConfigError(f"{origin}: source.root: no such directory, got {src.root!r} "
                              f"(resolved to {update['root']!r})")
    if src.manifest is not None:
        update["manifest"] = resolve(src.manifest)
        if not Path(update["manifest"]).is_file():
            raise ConfigError(f"{origin}: source.manifest: no such file, got {src.manifest!r} "
                              f"(resolved to {update['manifest']!r})")
    if src.files is not None:
        update["files"] = [resolve(f) for f in src.files]
    train_update = {}
    if config.train.checkpoint is not None:
        train_update["checkpoint"] = resolve(config.train.checkpoint)
    return config.model_copy(update={"source": src.model_copy(update=update),
                                     "train": config.train.model_copy(update=train_update)})


def apply_overrides(data: Dict[str, Any], overrides: Sequence[str]) -> Dict[str, Any]:
    """Apply ``key.path=value`` overrides (values parsed as YAML) to a raw config dict, in place."""
    for override in overrides:
        key, sep, raw = override.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set {override!r}: expected key.path=value, e.g. buffer.producers=8")
        try:
            value = yaml.safe_load(raw) if raw.strip() else None
        except yaml.YAMLError as exc:
            raise ConfigError(f"--set {override!r}: the value is not valid YAML ({exc})") from None
        node = data
        parts = key.strip().split(".")
        for i, part in enumerate(parts[:-1]):
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"--set {override!r}: {'.'.join(parts[:i + 1])} is not a section")
            node = child
        node[parts[-1]] = value
    return data


def load_config(path: Union[str, os.PathLike[str]], overrides: Sequence[str] = ()) -> PipelineConfig:
    """Read, override and validate a YAML pipeline config.

    Raises:
        ConfigError: the file is missing or not valid YAML, or the config does not validate.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read config {str(path)!r}: {exc.strerror or exc}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of sections (source, decode, ...), got {data!r}")
    apply_overrides(data, overrides)
    return parse_config(data, base_dir=path.resolve().parent, origin=str(path))


def source_error(config: PipelineConfig, exc: SourceError) -> ConfigError:
    """A :class:`ConfigError` naming the source key for a source that lists no usable file."""
    src = config.source
    key = "source.root" if src.root is not None else "source.manifest" if src.manifest is not None else "source.files"
    return ConfigError(f"{key}: {exc}")


def build_decoder(config: PipelineConfig) -> Any:
    """The decoder the ``decode`` section describes."""
    from .decoders import AudioDecoder, ImageDecoder

    d = config.decode
    if d.kind == "image":
        try:
            return ImageDecoder(size=d.size, resample=d.resample)
        except ImportError as exc:
            raise ConfigError(f"decode.kind: 'image' needs Pillow ({exc})") from None
    return AudioDecoder(d.sample_rate, mono=d.mono, crop_seconds=d.crop_seconds, crop=d.crop, pad=d.pad,
                        quality=d.quality, fallback=d.fallback)


def build_source(config: PipelineConfig) -> Any:
    """The :class:`~audiobuffer.Source` the ``source`` section describes.

    Raises:
        ConfigError: the source lists no usable file or a label expression does not fit.
    """
    from .sources import AUDIO_PATTERNS, IMAGE_PATTERNS, Source

    src = config.source
    spec: Any = src.root if src.root is not None else src.manifest if src.manifest is not None else src.files
    patterns = src.patterns if src.patterns is not None else (
        AUDIO_PATTERNS if config.decode.kind == "audio" else IMAGE_PATTERNS)
    try:
        return Source(spec, patterns=patterns, labels=src.labels, path_column=src.path_column)
    except SourceError as exc:
        raise source_error(config, exc) from None
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"source.labels: {exc}") from None


def build_dataset(config: PipelineConfig, *, source: Any = None, shuffle: Optional[bool] = None,
                  ordered: Optional[bool] = None, rank: Optional[int] = None,
                  world_size: Optional[int] = None) -> Any:
    """The :class:`~audiobuffer.BufferedDataset` a config describes.

    Args:
        source: use this :class:`~audiobuffer.Source` (a train or test subset, say) instead of
            the config's own.
        shuffle, ordered: override ``loader.shuffle`` and ``buffer.ordered`` (for evaluation).
        rank, world_size: an explicit shard (default: ``torch.distributed``'s, if initialised).

    Raises:
        ConfigError: the source lists no usable file or a label expression does not fit.
    """
    from .dataset import BufferedDataset

    buf = config.buffer
    return BufferedDataset(source if source is not None else build_source(config), build_decoder(config),
                           num_producers=buf.producers, buffer_size=buf.capacity, max_bytes=buf.max_bytes,
                           shuffle=config.loader.shuffle if shuffle is None else shuffle, seed=config.seed,
                           ordered=buf.ordered if ordered is None else ordered, on_error=buf.on_error,
                           warn_after=buf.warn_after, timeout=buf.timeout, even_shards=buf.even_shards,
                           rank=rank, world_size=world_size)


def build_loader(config: PipelineConfig, dataset: Any) -> Any:
    """The ``DataLoader`` (``num_workers=0``) that batches ``dataset`` with :func:`~audiobuffer.pad_collate`."""
    import torch
    from torch.utils.data import DataLoader

    collate = pad_collate if config.decode.kind == "audio" else _ImageCollate()
    # Pinned memory only speeds up copies to a GPU; without one, DataLoader would only warn.
    pin = config.loader.pin_memory and torch.cuda.is_available()
    return DataLoader(dataset, batch_size=config.loader.batch_size, collate_fn=collate, pin_memory=pin,
                      drop_last=config.loader.drop_last, num_workers=0)


class _ImageCollate:
    """Stack fixed-size images (the padding path of pad_collate is for audio)."""

    def __call__(self, samples: List[Dict[str, Any]]) -> Dict[str, Any]:
        batch = pad_collate(samples, key="image")
        batch.pop("lengths")
        return batch
