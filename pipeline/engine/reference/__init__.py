"""A reference executor for the TensorRT networks the converters build, on the CPU: it walks the real
`INetworkDefinition` (its layers, their attributes, inputs and outputs, as TensorRT holds them) and
evaluates each layer with PyTorch, so a converter that builds a wrong network computes a wrong number
on a machine without a GPU. A layer type or attribute it does not know is an error naming it, never a
silent pass. `run_network` is the entry point; `check` compares a network with eager PyTorch."""

from pipeline.engine.reference.run import ReferenceError, run_network

__all__ = ["ReferenceError", "run_network"]
