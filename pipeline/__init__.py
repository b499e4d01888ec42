"""Declarative builds of ExecuTorch programs whose heavy parts run as TensorRT engines."""

import logging
import warnings

# Importing ExecuTorch registers an Enum as a pytree constant, which PyTorch warns about on every
# start; the warning is meant for ExecuTorch's developers, not for users of the pipeline.
logging.getLogger("torch.utils._pytree").setLevel(logging.ERROR)
# ExecuTorch's program loader calls PyTorch shape-environment APIs that PyTorch has deprecated.
warnings.filterwarnings("ignore", category=FutureWarning, module=r"executorch\.exir\.serde")
