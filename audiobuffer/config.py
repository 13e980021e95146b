"""YAML pipeline configuration: read with PyYAML, validated with pydantic.

A config file describes a whole pipeline::

    source:  {root: data/fsdd/recordings, labels: '^(\\d+)_'}
    decode:  {kind: audio, sample_rate: 8000, crop_seconds: 1.0}
    buffer:  {producers: auto, capacity: 64, on_error: warn}
    loader:  {batch_size: 32, pin_memory: true}
    device:  auto
    epochs:  3
    seed:    0

Relative paths in the file are resolved against the config file's folder; relative paths given by a
``--set key.path=value`` override are resolved against the current directory. Every problem (a file
that is not UTF-8 or not valid YAML, an unknown key, a wrong type or value, a number out of range, a
missing file, an empty corpus) is a :class:`~audiobuffer.ConfigError` whose one-line message starts
with the file's name and names the key path, the value (cut to a short prefix) and what is allowed.
``--set`` overrides (values parsed as YAML) are applied before validation, so they are checked the
same way. ``reference_config()`` returns the reference config shipped with the package: every key with
its default.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator, model_validator

from .collate import image_collate, pad_collate
from .errors import ConfigError, SourceError

if TYPE_CHECKING:  # for the build_* signatures; each build_* imports what it builds
    from torch.utils.data import DataLoader

    from .dataset import BufferedDataset
    from .decoders import AudioDecoder, ImageDecoder
    from .isolated import IsolatedLoader
    from .sources import Source

__all__ = [
    "PipelineConfig",
    "apply_overrides",
    "build_dataset",
    "build_decoder",
    "build_loader",
    "build_source",
    "load_config",
    "parse_config",
    "reference_config",
]

# Upper bounds of numbers that pass the type check but fail (or hang) later when too large.
#: Seconds: at most one day. Waits with a longer timeout raise OverflowError past
#: threading.TIMEOUT_MAX (about 49.7 days on Windows); no real stall or crop needs more than a day.
_MAX_SECONDS = 86400.0
#: The largest seed: numpy's SeedSequence takes any int >= 0 and torch's manual_seed up to 2**64 - 1;
#: 2**63 - 1 leaves room for ``seed + epoch`` in both and fits an int64.
_MAX_SEED = 2**63 - 1
#: The largest batch: a bigger one only allocates (or spins) until memory runs out.
_MAX_BATCH_SIZE = 1 << 20
#: The most producer threads: beyond this, starting threads fails on common systems.
_MAX_PRODUCERS = 1024
#: How many characters of a value an error message quotes, and how many problems it lists.
_QUOTE_CHARS = 80
_LISTED_ERRORS = 5


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader, reading ``1e9`` and ``1.0e-3`` as numbers (YAML 1.2) rather than strings."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."))


def _load_yaml(text: str) -> Any:
    return yaml.load(text, Loader=_Loader)  # a SafeLoader: builds plain data only


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class SourceConfig(_Section):
    """Where the files come from: exactly one of ``root``, ``manifest`` or ``files``."""

    root: str | None = None
    manifest: str | None = None
    files: list[str] | None = None
    patterns: list[str] | None = None
    labels: str | None = None
    path_column: str = "path"

    @model_validator(mode="after")
    def _one_kind(self) -> SourceConfig:
        given = [k for k in ("root", "manifest", "files") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"give exactly one of root, manifest or files (got {given or 'none'})")
        return self


class DecodeConfig(_Section):
    """How a file becomes a sample: ``kind: audio`` (AudioDecoder) or ``kind: image`` (ImageDecoder)."""

    kind: Literal["audio", "image"] = "audio"
    sample_rate: int | None = Field(default=None, gt=0)
    mono: bool = True
    crop_seconds: float | None = Field(default=None, gt=0, le=_MAX_SECONDS, allow_inf_nan=False,
                                          description="a number of seconds")
    crop: Literal["random", "start", "center"] = "random"
    pad: bool = True
    quality: Literal["QQ", "LQ", "MQ", "HQ", "VHQ"] = "HQ"
    fallback: Literal["librosa"] | None = "librosa"
    size: int | tuple[int, int] | None = None
    resample: Literal["nearest", "bilinear", "bicubic", "lanczos", "box", "hamming"] = "bilinear"

    @field_validator("size", mode="before")
    @classmethod
    def _size_list(cls, value: Any) -> Any:
        return tuple(value) if isinstance(value, list) else value

    @model_validator(mode="after")
    def _fields_of_kind(self) -> DecodeConfig:
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

    producers: Annotated[int, Field(ge=1, le=_MAX_PRODUCERS)] | Literal["auto"] = "auto"
    capacity: int = Field(default=64, ge=1)
    max_bytes: int | None = Field(default=None, ge=1)
    ordered: bool = False
    on_error: Literal["raise", "warn", "skip"] = "raise"
    warn_after: float | None = Field(default=5.0, gt=0, le=_MAX_SECONDS, allow_inf_nan=False,
                                        description="a number of seconds")
    timeout: float | None = Field(default=None, gt=0, le=_MAX_SECONDS, allow_inf_nan=False,
                                     description="a number of seconds")
    even_shards: Literal["pad", "drop"] | None = "pad"
    isolate: bool = Field(default=False, description="run the producers in a helper process (IsolatedLoader)")


class LoaderConfig(_Section):
    """The ``DataLoader`` that batches the samples."""

    batch_size: int = Field(default=32, ge=1, le=_MAX_BATCH_SIZE)
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
    seed: int = Field(default=0, ge=0, le=_MAX_SEED)
    train: TrainConfig = TrainConfig()
    _origin: str = PrivateAttr(default="config")

    @property
    def origin(self) -> str:
        """Where the config came from (its file name), the prefix of every error about it."""
        return self._origin

    @field_validator("device")
    @classmethod
    def _device(cls, value: str) -> str:
        if value in ("auto", "cpu", "cuda"):
            return value
        if value.startswith("cuda:") and value[5:].isdigit():
            return value
        raise ValueError(f"must be {_DEVICE_HELP}")


def _quote(value: Any, limit: int = _QUOTE_CHARS) -> str:
    """``repr(value)`` cut to ``limit`` characters, for error messages.

    The text is built piece by piece and the building stops at ``limit``, so a huge or recursive value
    (a YAML alias bomb: a few lines that expand to billions of strings) costs only its prefix.
    """
    pieces: list[str] = []
    size = 0
    for piece in _repr_pieces(value, limit):
        pieces.append(piece)
        size += len(piece)
        if size > limit:
            break
    text = "".join(pieces)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _repr_pieces(value: Any, limit: int) -> Iterator[str]:
    if isinstance(value, (list, tuple, set, frozenset)):
        brackets = "[]" if isinstance(value, list) else "()" if isinstance(value, tuple) else "{}"
        yield brackets[0]
        for i, item in enumerate(value):
            if i:
                yield ", "
            yield from _repr_pieces(item, limit)
        yield brackets[1]
    elif isinstance(value, dict):
        yield "{"
        for i, (key, item) in enumerate(value.items()):
            if i:
                yield ", "
            yield from _repr_pieces(key, limit)
            yield ": "
            yield from _repr_pieces(item, limit)
        yield "}"
    elif isinstance(value, (str, bytes)):
        yield repr(value[:limit + 1])  # longer than the limit either way when cut
    elif isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 4 * limit:
        yield f"<an integer of {value.bit_length()} bits>"  # its decimal form costs time to build
    else:
        yield repr(value)


def _cut(text: str, limit: int = _QUOTE_CHARS) -> str:
    return text if len(text) <= limit else text[:limit - 3] + "..."


#: What a union-typed key accepts, said for people (pydantic reports each branch of the union).
_UNION_HELP = {"decode.size": "must be an integer or a list [height, width] of two integers",
               "buffer.producers": f"must be an integer in [1, {_MAX_PRODUCERS}] or 'auto'"}


def _bounds(field: Any) -> list[str]:
    """The range a field's constraints allow, as ``['> 0', '<= 86400']``."""
    out = []
    for item in getattr(field, "metadata", ()):
        for attr, sign in (("gt", ">"), ("ge", ">="), ("lt", "<"), ("le", "<=")):
            bound = getattr(item, attr, None)
            if bound is not None:
                out.append(f"{sign} {bound:g}" if isinstance(bound, float) else f"{sign} {bound}")
    return out


def _locate(loc: Sequence[Any], model: type[BaseModel]) -> tuple[list[str], Any, type[BaseModel] | None, bool]:
    """Walk an error's location through the models: (key parts, the field, the section model, in a union).

    A location inside a union-typed field names the union member pydantic tried (``'tuple[int, int]'``);
    the walk stops there, so the key is the field's.
    """
    parent: type[BaseModel] | None = model
    field: Any = None
    parts: list[str] = []
    for part in loc:
        if parent is not None and isinstance(part, str) and part in parent.model_fields:
            field = parent.model_fields[part]
            annotation = field.annotation
            parent = annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None
            parts.append(part)
        elif parent is None and field is not None and isinstance(part, str):
            return parts, field, None, True
        else:
            parts.append(_cut(str(part), 40))
    return parts, field, parent, False


def _format_error(error: Mapping[str, Any], model: type[BaseModel]) -> tuple[str, str]:
    """One pydantic error as (key path, 'key.path: what is wrong, got VALUE')."""
    parts, field, parent, union = _locate(error["loc"], model)
    key = ".".join(parts) or "(top level)"
    kind = error["type"]
    got = f"got {_quote(error.get('input'))}"
    if kind == "missing":
        return key, f"{key}: required key is missing"
    if kind == "model_type" and parent is not None:
        return key, f"{key}: must be a section (a mapping of keys: {', '.join(parent.model_fields)}), {got}"
    if union:
        plain = ".".join(p for p in parts if not p.isdigit())
        return key, f"{key}: {_UNION_HELP.get(plain, 'does not fit any allowed form')}, {got}"
    bounds = _bounds(field)
    if bounds and kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal", "finite_number"):
        what = f"{field.description} " if field.description else ""
        return key, f"{key}: must be {what}{' and '.join(bounds)}, {got}"
    message = str(error["msg"]).removeprefix("Value error, ")
    return key, f"{key}: {message}, {got}"


def _format_errors(exc: ValidationError, model: type[BaseModel]) -> str:
    """Every problem on one line: unknown keys grouped by section, at most ``_LISTED_ERRORS`` problems."""
    lines: dict[str, Any] = {}  # key -> its line, or a section's list of unknown keys
    allowed: dict[str, str] = {}
    for error in exc.errors(include_url=False):
        if error["type"] == "extra_forbidden":
            parts, _, parent, _ = _locate(error["loc"], model)
            section = ".".join(parts[:-1])
            allowed[section] = ", ".join(parent.model_fields) if parent is not None else "none"
            lines.setdefault("\0" + section, []).append(parts[-1])
        else:
            key, line = _format_error(error, model)
            lines.setdefault(key, line)  # a union reports one error per member: keep the first
    listed = []
    for key, line in lines.items():
        if isinstance(line, list):  # unknown keys of one section
            section = key[1:]
            if len(line) == 1:
                where, what = ".".join(filter(None, (section, line[0]))), "unknown key"
            else:
                names = ", ".join(line[:8]) + (f" and {len(line) - 8} more" if len(line) > 8 else "")
                where, what = section or "(top level)", f"unknown keys {names}"
            line = f"{where}: {what}; allowed keys here: {allowed[section]}"
        listed.append(line)
    more = len(listed) - _LISTED_ERRORS
    return "; ".join(listed[:_LISTED_ERRORS]) + (f"; and {more} more" if more > 0 else "")


#: Keys whose values are paths, as (section, key).
_PATH_KEYS = (("source", "root"), ("source", "manifest"), ("source", "files"), ("train", "checkpoint"))


def _resolve_path(value: str, base: Path) -> str:
    path = Path(os.path.expanduser(value))
    return str(path if path.is_absolute() else base / path)


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


def parse_config(data: Any, *, base_dir: str | os.PathLike[str] | None = None,
                 origin: str = "config") -> PipelineConfig:
    """Validate a config dict; resolve relative paths against ``base_dir``; check the source exists.

    Args:
        data: the config as read from YAML.
        base_dir: the folder relative paths resolve against (default: the current directory).
        origin: where the config came from (its file name), the prefix of every error message.

    Raises:
        ConfigError: naming the key path, the value and what is allowed.
    """
    if not isinstance(data, Mapping):
        raise ConfigError(f"{origin}: expected a mapping of sections (source, decode, ...), got {_quote(data)}")
    try:
        config = PipelineConfig.model_validate(dict(data))
    except ValidationError as exc:
        raise ConfigError(f"{origin}: {_format_errors(exc, PipelineConfig)}") from None
    base = Path(base_dir) if base_dir is not None else Path.cwd()
    src = config.source

    def missing(key: str, given: str, resolved: str, what: str) -> ConfigError:
        where = f" (resolved to {_quote(resolved, 2 * _QUOTE_CHARS)})" if resolved != given else ""
        return ConfigError(f"{origin}: source.{key}: no such {what}, got {_quote(given, 2 * _QUOTE_CHARS)}{where}")

    update: dict[str, Any] = {}
    if src.root is not None:
        update["root"] = _resolve_path(src.root, base)
        if not Path(update["root"]).is_dir():
            raise missing("root", src.root, update["root"], "directory")
    if src.manifest is not None:
        update["manifest"] = _resolve_path(src.manifest, base)
        if not Path(update["manifest"]).is_file():
            raise missing("manifest", src.manifest, update["manifest"], "file")
    if src.files is not None:
        update["files"] = [_resolve_path(f, base) for f in src.files]
    train_update = {}
    if config.train.checkpoint is not None:
        train_update["checkpoint"] = _resolve_path(config.train.checkpoint, base)
    config = config.model_copy(update={"source": src.model_copy(update=update),
                                       "train": config.train.model_copy(update=train_update)})
    config._origin = origin
    return config


def apply_overrides(data: dict[str, Any], overrides: Sequence[str], *,
                    base_dir: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """Apply ``key.path=value`` overrides (values parsed as YAML) to a raw config dict, in place.

    A relative path in an override (``source.root``, ``source.manifest``, ``source.files``,
    ``train.checkpoint``) is resolved here against ``base_dir`` (default: the current directory), as a
    path typed on a command line is; the file's own paths stay relative to the file.

    Raises:
        ConfigError: an override is not ``key.path=value``, its value is not YAML, or it sets a key
            inside a value that is not a section.
    """
    base = Path(base_dir) if base_dir is not None else Path.cwd()
    for override in overrides:
        key, sep, raw = override.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set {_quote(override)}: expected key.path=value, e.g. buffer.producers=8")
        try:
            value = _load_yaml(raw) if raw.strip() else None
        except (yaml.YAMLError, ValueError, RecursionError) as exc:
            problem = " ".join(_yaml_problem(exc).split())
            raise ConfigError(f"--set {_quote(override)}: the value is {problem}") from None
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
                raise ConfigError(f"--set {_quote(override)}: {'.'.join(parts[:i + 1])} is not a section")
            node = child
        node[parts[-1]] = wrapped
    return data


def _yaml_problem(exc: BaseException) -> str:
    """What is wrong with a YAML text, on one line: 'not valid YAML at line 2, column 4: ...'."""
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
        mark = exc.problem_mark
        text = f"not valid YAML at line {mark.line + 1}, column {mark.column + 1}: {_cut(str(exc.problem), 200)}"
        if exc.context:
            text += f" ({exc.context}"
            if exc.context_mark is not None:
                text += f" at line {exc.context_mark.line + 1}, column {exc.context_mark.column + 1}"
            text += ")"
    elif isinstance(exc, RecursionError):
        text = "not valid YAML: nested too deeply"
    elif isinstance(exc, yaml.YAMLError):
        text = f"not valid YAML: {_cut(str(exc), 200)}"
    else:  # a scalar that PyYAML recognised but cannot convert: a 5000-digit integer, 2020-13-45
        text = f"not valid YAML: a value cannot be converted: {_cut(str(exc).split(';')[0], 200)}"
    return " ".join(text.split())


def load_config(path: str | os.PathLike[str], overrides: Sequence[str] = ()) -> PipelineConfig:
    """Read, override and validate a YAML pipeline config.

    Relative paths in the file resolve against the file's folder; relative paths in ``overrides``
    against the current directory (see :func:`apply_overrides`).

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
        raise ConfigError(f"{path}: {_yaml_problem(exc)}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of sections (source, decode, ...), got {_quote(data)}")
    try:
        apply_overrides(data, overrides)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    return parse_config(data, base_dir=path.resolve().parent, origin=str(path))


def reference_config() -> str:
    """The reference config shipped with the package: every key with its default and a comment.

    ``audiobuffer config --reference`` prints it; it is the same text as ``configs/reference.yaml``.
    """
    return (resources.files("audiobuffer") / "reference.yaml").read_text(encoding="utf-8")


def source_error(config: PipelineConfig, exc: SourceError) -> ConfigError:
    """A :class:`ConfigError` naming the source key for a source that lists no usable file."""
    src = config.source
    key = "source.root" if src.root is not None else "source.manifest" if src.manifest is not None else "source.files"
    return ConfigError(f"{config.origin}: {key}: {exc}")


def build_decoder(config: PipelineConfig) -> AudioDecoder | ImageDecoder:
    """The decoder the ``decode`` section describes.

    Raises:
        ConfigError: the decoder refuses the section's values, or ``kind: image`` lacks Pillow.
    """
    from .decoders import AudioDecoder, ImageDecoder

    d = config.decode
    try:
        if d.kind == "image":
            return ImageDecoder(size=d.size, resample=d.resample)
        return AudioDecoder(d.sample_rate, mono=d.mono, crop_seconds=d.crop_seconds, crop=d.crop, pad=d.pad,
                            quality=d.quality, fallback=d.fallback)
    except ImportError as exc:
        raise ConfigError(f"{config.origin}: decode.kind: 'image' needs Pillow ({exc})") from None
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{config.origin}: decode: {exc}") from None


def build_source(config: PipelineConfig) -> Source:
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
        raise ConfigError(f"{config.origin}: source.labels: {exc}") from None


def build_dataset(config: PipelineConfig, *, source: Any = None, shuffle: bool | None = None,
                  ordered: bool | None = None, rank: int | None = None,
                  world_size: int | None = None) -> BufferedDataset:
    """The :class:`~audiobuffer.BufferedDataset` a config describes.

    Args:
        source: use this :class:`~audiobuffer.Source` (a train or test subset, say) instead of
            the config's own.
        shuffle, ordered: override ``loader.shuffle`` and ``buffer.ordered`` (for evaluation).
        rank, world_size: an explicit shard (default: ``torch.distributed``'s, if initialised).

    Raises:
        ConfigError: the source lists no usable file, a label expression does not fit, or the
            dataset refuses a value.
    """
    from .dataset import BufferedDataset

    source = source if source is not None else build_source(config)
    decoder = build_decoder(config)
    try:
        return BufferedDataset(source, decoder, **_loader_options(config, shuffle, ordered, rank, world_size))
    except SourceError as exc:
        raise source_error(config, exc) from None
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{config.origin}: {exc}") from None


def _loader_options(config: PipelineConfig, shuffle: bool | None, ordered: bool | None, rank: int | None,
                    world_size: int | None) -> dict[str, Any]:
    """The keywords every loader takes (``LoaderOptions``' fields), from the config's sections."""
    buf = config.buffer
    return dict(num_producers=buf.producers, buffer_size=buf.capacity, max_bytes=buf.max_bytes,
                shuffle=config.loader.shuffle if shuffle is None else shuffle, seed=config.seed,
                ordered=buf.ordered if ordered is None else ordered, on_error=buf.on_error,
                warn_after=buf.warn_after, timeout=buf.timeout, even_shards=buf.even_shards, rank=rank,
                world_size=world_size)


def build_isolated(config: PipelineConfig, *, source: Any = None, shuffle: bool | None = None,
                   ordered: bool | None = None, rank: int | None = None,
                   world_size: int | None = None) -> IsolatedLoader:
    """The :class:`~audiobuffer.IsolatedLoader` a config with ``buffer.isolate: true`` describes.

    It yields batches itself (``loader.batch_size``, ``loader.drop_last``, ``loader.pin_memory``); the
    arguments are those of :func:`build_dataset`.

    Raises:
        ConfigError: as :func:`build_dataset`, or the decoder cannot be sent to the helper process.
    """
    import torch

    from .isolated import IsolatedLoader

    load = config.loader
    source = source if source is not None else build_source(config)
    decoder = build_decoder(config)
    try:
        return IsolatedLoader(source, decoder, batch_size=load.batch_size, drop_last=load.drop_last,
                              pin_memory=load.pin_memory and torch.cuda.is_available(),
                              key="audio" if config.decode.kind == "audio" else "image",
                              **_loader_options(config, shuffle, ordered, rank, world_size))
    except SourceError as exc:
        raise source_error(config, exc) from None
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{config.origin}: {exc}") from None


def build_loader(config: PipelineConfig, dataset: BufferedDataset) -> DataLoader[Any]:
    """The ``DataLoader`` (``num_workers=0``) that batches ``dataset`` with :func:`~audiobuffer.pad_collate`."""
    import torch
    from torch.utils.data import DataLoader

    collate = pad_collate if config.decode.kind == "audio" else image_collate
    # Pinned memory only speeds up copies to a GPU; without one, DataLoader would only warn.
    pin = config.loader.pin_memory and torch.cuda.is_available()
    return DataLoader(dataset, batch_size=config.loader.batch_size, collate_fn=collate, pin_memory=pin,
                      drop_last=config.loader.drop_last, num_workers=0)
