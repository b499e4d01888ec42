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


class ArtifactError(PipelineError, ValueError):
    """A file the pipeline reads (`.pte`, `.ptd`, stage intermediate) is truncated, corrupt, not
    the file it claims to be, or asks for something we refuse to do (unpickling)."""


class BlobFormatError(ArtifactError):
    """A TensorRT delegate blob is truncated, corrupt, or of an unknown version."""


class ExportError(PipelineError, ValueError):
    """Bad input to the staged export API (sources, method maps, constant methods)."""


class ConfigError(PipelineError, ValueError):
    """A composed pipeline config is invalid (order of partitioners, targets, methods)."""


class InputError(PipelineError, ValueError):
    """A method was called with inputs outside what its program was built for."""


class OutputError(PipelineError, OSError):
    """An output could not be written (disk full, permissions); the message names the path."""


class RunDirError(PipelineError):
    """A run directory holds another run's files, or another run is writing it."""


class RuntimeUnavailableError(PipelineError):
    """A program needs a device, library or backend this process does not have."""


def first_line(exc: BaseException, limit: int = 200) -> str:
    """What an exception from a library says, as one line of a refusal: its message's first line
    (its type's name where it says nothing), at most `limit` characters."""
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:limit]
