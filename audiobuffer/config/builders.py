"""What a validated :class:`~audiobuffer.config.schema.PipelineConfig` builds: decoder, source, dataset, loaders.

Each ``build_*`` imports what it builds (so reading a config imports no torch), and turns what the
built object refuses into a :class:`~audiobuffer.ConfigError` that names the config file and the key.
They are public as ``audiobuffer.config.build_*``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

from ..collate import image_collate, pad_collate
from ..errors import ConfigError, SourceError, StorageError
from ..options import OPTIONS

if TYPE_CHECKING:
    from torch.utils.data import DataLoader

    from ..decoders import AudioDecoder, ImageDecoder
    from ..loaders.dataset import BufferedDataset
    from ..loaders.isolated.loader import IsolatedLoader
    from ..sources.source import Source
    from ..sources.stream import ShardStream
    from .schema import PipelineConfig

__all__ = ["build_augmentation", "build_dataset", "build_decoder", "build_device_step",
           "build_isolated", "build_loader", "build_source", "source_error"]


def _source_key(config: PipelineConfig) -> str:
    """The key that names the source: ``source.root``, ``source.manifest`` or ``source.files``."""
    src = config.source
    if src.mix is not None:
        return "source.mix"
    return "source.root" if src.root is not None else "source.manifest" if src.manifest is not None else "source.files"


def source_error(config: PipelineConfig, exc: SourceError | StorageError) -> ConfigError:
    """A :class:`ConfigError` naming the source key for a source that lists no usable file or cannot be read."""
    return ConfigError(f"{config.origin}: {_source_key(config)}: {exc}")


def build_decoder(config: PipelineConfig) -> AudioDecoder | ImageDecoder:
    """The decoder the ``decode`` section describes.

    Raises:
        ConfigError: the decoder refuses the section's values, or ``kind: image`` lacks Pillow.
    """
    from ..decoders import AudioDecoder, ImageDecoder

    d = config.decode
    augment = [build_augmentation(config, n) for n in range(len(d.augment or ()))]  # named by entry
    try:
        if d.kind == "image":
            return ImageDecoder(size=d.size, crop=cast(Any, d.crop), scale=d.scale, ratio=d.ratio,
                                crop_fraction=d.crop_fraction, flip=d.flip, layout=d.layout,
                                draft=d.draft, resample=d.resample, jpeg=d.jpeg,
                                backend=d.backend)
        return AudioDecoder(d.sample_rate, mono=d.mono, crop_seconds=d.crop_seconds,
                            crop=cast(Any, d.crop), pad=d.pad, quality=d.quality,
                            fallback=d.fallback, augment=augment or None)
    except ImportError as exc:
        raise ConfigError(f"{config.origin}: decode.kind: 'image' needs Pillow ({exc})") from None
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{config.origin}: decode: {exc}") from None


def build_device_step(config: PipelineConfig, device: Any) -> Any:
    """What runs on each batch once it is on ``device`` (``DevicePrefetcher(transform=)``):
    :class:`~audiobuffer.DecodeJpeg` with ``decode.jpeg: device``, else ``None``.

    Raises:
        ConfigError: ``decode.jpeg: device`` where torchvision does not load, or on a device
            without CUDA.
    """
    if config.decode.kind != "image" or config.decode.jpeg != "device":
        return None
    from ..jpeg import DecodeJpeg

    try:
        return DecodeJpeg(device)
    except (ImportError, ValueError) as exc:
        raise ConfigError(f"{config.origin}: decode.jpeg: device: {exc}") from None


def build_augmentation(config: PipelineConfig, n: int) -> Any:
    """The augmentation ``decode.augment[n]`` describes.

    Raises:
        ConfigError: the augmentation refuses the entry's values (the message names the entry).
    """
    from .. import augment

    entry = (config.decode.augment or [])[n]
    make = {"speed_perturb": augment.SpeedPerturb, "gain": augment.Gain, "add_noise": augment.AddNoise,
            "reverb": augment.Reverb}[entry.kind]
    try:
        return make(**entry.keywords())
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{config.origin}: decode.augment.{n}: {exc}") from None


def build_source(config: PipelineConfig) -> Source | ShardStream:
    """The :class:`~audiobuffer.Source` the ``source`` section describes (tar shards: a ``ShardStream``).

    Raises:
        ConfigError: the source lists no usable file, a brace pattern of shards is malformed, or a
            label expression does not fit.
    """
    from ..sources.names import expand_braces
    from ..sources.source import AUDIO_PATTERNS, IMAGE_PATTERNS, names_shards
    from ..sources.stream import as_source

    src = config.source
    patterns = src.patterns if src.patterns is not None else (
        AUDIO_PATTERNS if config.decode.kind == "audio" else IMAGE_PATTERNS)
    if src.mix is not None:
        return _build_mixture(config, patterns)
    spec: Any = src.root if src.root is not None else src.manifest if src.manifest is not None else src.files
    if names_shards(spec):  # a bad brace pattern is the source key's fault: checked before the labels are read
        for name in [spec] if isinstance(spec, str) else spec:
            try:
                expand_braces(name)
            except ValueError as exc:
                raise ConfigError(f"{config.origin}: {_source_key(config)}: {exc}") from None
    try:
        return as_source(spec, patterns=patterns, labels=src.labels, path_column=src.path_column,
                         storage_options=src.storage_options, start_column=src.start_column,
                         duration_column=src.duration_column if src.start_column else None)
    except (SourceError, StorageError) as exc:
        raise source_error(config, exc) from None
    except (TypeError, ValueError) as exc:  # the listing's own were checked above: what is left is the labels'
        key = "source.labels" if src.labels is not None else _source_key(config)
        raise ConfigError(f"{config.origin}: {key}: {exc}") from None


def _build_mixture(config: PipelineConfig, patterns: Sequence[str]) -> Source:
    """The :func:`~audiobuffer.mix` of ``source.mix``, each entry listed as a :class:`~audiobuffer.Source`."""
    from ..sources.mixture import mix
    from ..sources.source import Source

    src = config.source
    sources = []
    for n, entry in enumerate(cast(list, src.mix)):
        spec: Any = entry.root if entry.root is not None else entry.manifest if entry.manifest is not None \
            else entry.files
        try:
            sources.append(Source(spec, patterns=entry.patterns if entry.patterns is not None else patterns,
                                  labels=entry.labels if entry.labels is not None else src.labels,
                                  path_column=entry.path_column, storage_options=src.storage_options))
        except (SourceError, StorageError, TypeError, ValueError) as exc:
            raise ConfigError(f"{config.origin}: source.mix[{n}]: {exc}") from None
    try:
        return mix(*sources, weights=src.weights, size=src.size)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{config.origin}: source.mix: {exc}") from None


def build_dataset(config: PipelineConfig, *, source: Any = None, shuffle: bool | None = None,
                  ordered: bool | None = None, rank: int | None = None,
                  world_size: int | None = None) -> BufferedDataset:
    """The :class:`~audiobuffer.BufferedDataset` a config describes.

    Args:
        source: use this :class:`~audiobuffer.Source` (a train or test subset, say) instead of
            the config's own.
        shuffle: override ``loader.shuffle`` (for evaluation).
        ordered: override ``buffer.ordered`` (for evaluation).
        rank: with ``world_size``, an explicit shard (default: ``torch.distributed``'s, if initialised).
        world_size: the number of ranks of an explicit shard.

    Raises:
        ConfigError: the source lists no usable file, a label expression does not fit, or the
            dataset refuses a value.
    """
    from ..loaders.dataset import BufferedDataset

    source = source if source is not None else build_source(config)
    decoder = build_decoder(config)
    try:
        return BufferedDataset(source, decoder, **_loader_options(config, shuffle, ordered, rank, world_size))
    except SourceError as exc:
        raise source_error(config, exc) from None
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{config.origin}: {exc}") from None


#: The options that describe how to list the source: given to it by :func:`build_source`.
_LISTING = ("labels", "patterns", "path_column", "storage_options", "start_column")


def _loader_options(config: PipelineConfig, shuffle: bool | None, ordered: bool | None, rank: int | None,
                    world_size: int | None) -> dict[str, Any]:
    """The keywords every loader takes (``LoaderOptions``' fields), each from the config key its rule
    names (:data:`~audiobuffer.options.OPTIONS`), less those that went into the source (``_LISTING``)."""
    options: dict[str, Any] = {}
    for name, rule in OPTIONS.items():
        if rule.yaml is None or name in _LISTING:
            continue
        node: Any = config
        for part in rule.yaml.split("."):
            node = getattr(node, part)
        options[name] = node
    options.update(rank=rank, world_size=world_size)
    if shuffle is not None:
        options["shuffle"] = shuffle
    if ordered is not None:
        options["ordered"] = ordered
    if config.loader.max_batch_seconds is None:
        # without batches by duration the column only bounds start_column's segments, in the source
        options["duration_column"] = None
    return options


def build_isolated(config: PipelineConfig, *, source: Any = None, shuffle: bool | None = None,
                   ordered: bool | None = None, rank: int | None = None,
                   world_size: int | None = None) -> IsolatedLoader:
    """The :class:`~audiobuffer.IsolatedLoader` a config with ``buffer.isolate: true`` describes.

    It yields batches itself (``loader.batch_size``, ``loader.drop_last``, ``loader.pin_memory``, or
    batches by duration with ``loader.max_batch_seconds``); the arguments are those of :func:`build_dataset`.

    Raises:
        ConfigError: as :func:`build_dataset`, or the decoder cannot be sent to the helper process.
    """
    from ..loaders.isolated.loader import IsolatedLoader

    load = config.loader
    source = source if source is not None else build_source(config)
    decoder = build_decoder(config)
    try:
        by_size = load.max_batch_seconds is None
        return IsolatedLoader(source, decoder, batch_size=load.batch_size if by_size else None,
                              drop_last=load.drop_last, pin_memory=_pin_memory(config),
                              key="audio" if config.decode.kind == "audio" else "image",
                              **_loader_options(config, shuffle, ordered, rank, world_size))
    except SourceError as exc:
        raise source_error(config, exc) from None
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{config.origin}: {exc}") from None


def _pin_memory(config: PipelineConfig) -> bool:
    """``loader.pin_memory``: ``auto`` and ``true`` pin when CUDA is available (pinning serves copies to a
    GPU; ``true`` on a machine without one runs as it would with one, as ``DataLoader`` does, unpinned)."""
    import torch

    return config.loader.pin_memory is not False and torch.cuda.is_available()


def build_loader(config: PipelineConfig, dataset: BufferedDataset) -> DataLoader[Any]:
    """The ``DataLoader`` (``num_workers=0``) that batches ``dataset`` with :func:`~audiobuffer.pad_collate`
    (with ``loader.max_batch_seconds`` the dataset yields whole batches: ``batch_size=None``)."""
    from torch.utils.data import DataLoader

    collate = pad_collate if config.decode.kind == "audio" else image_collate
    by_size = config.loader.max_batch_seconds is None
    return DataLoader(dataset, batch_size=config.loader.batch_size if by_size else None, collate_fn=collate,
                      pin_memory=_pin_memory(config), drop_last=config.loader.drop_last, num_workers=0)
