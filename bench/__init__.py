"""Benchmarks, run from the project root as modules: `python -m bench.<name> --help` (`docs/performance.md`
lists them). GPU benchmarks need a CUDA GPU and TensorRT. `bench/experiments/` keeps the scripts that
answered one question of the project's past (each says which), for rerunning it."""
