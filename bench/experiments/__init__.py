"""One-question experiments (`python -m bench.experiments.<name> --help`); their findings are in `results/gpu-log.md`."""
