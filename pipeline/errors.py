"""Error hierarchy of the pipeline: every message says what was expected, what was found, and how to fix it."""

from __future__ import annotations


class PipelineError(Exception):
    """Base class of every error this library raises on purpose."""


class TensorRTUnavailableError(PipelineError):
    """Neither TensorRT nor TensorRT-RTX can be imported."""


class CompileSpecError(PipelineError, ValueError):
    """A TensorRT compile-spec field holds a value outside what it allows."""


class UnsupportedOperatorError(PipelineError):
    """A graph handed to the engine builder contains a node no converter accepts."""


class EngineBuildError(PipelineError):
    """TensorRT refused to build an engine from a network we made."""


class BlobFormatError(PipelineError, ValueError):
    """A TensorRT delegate blob is truncated, corrupt, or of an unknown version."""


class ExportError(PipelineError, ValueError):
    """Bad input to the staged export API (sources, method maps, constant methods)."""


class ConfigError(PipelineError, ValueError):
    """A composed pipeline config is invalid (order of partitioners, targets, methods)."""


class RuntimeUnavailableError(PipelineError):
    """A program needs a device, library or backend this process does not have."""
