"""YAML pipelines: the schema a config file is checked against, and what a valid config builds."""

from __future__ import annotations

from .builders import (
    build_dataset,
    build_decoder,
    build_device_step,
    build_isolated,
    build_loader,
    build_source,
    source_error,
)
from .schema import PipelineConfig, apply_overrides, load_config, parse_config, reference_config

__all__ = [
    "PipelineConfig",
    "apply_overrides",
    "build_dataset",
    "build_decoder",
    "build_device_step",
    "build_isolated",
    "build_loader",
    "build_source",
    "load_config",
    "parse_config",
    "reference_config",
    "source_error",
]
