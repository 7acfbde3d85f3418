"""parity_bridge: golden sets of parity (github: this repository) for a PyTorch /
Megatron team — read a golden set into numpy or torch, map names between parity
and the Hugging Face checkpoint of the DeepSeek-V4 release, read parity's HF and
batch exports, write dumps `parity compare` reads, and record activations and
gradients of a torch model under golden names.  numpy only; torch optional.
docs/gpu-rollout.md is the walk-through."""
__version__ = "0.1.0"

from . import batch, compare, dump, golden, hf, names, recorder, safetensors  # noqa: F401
from .batch import BatchSet  # noqa: F401
from .dump import GoldenWriter  # noqa: F401
from .golden import GoldenSet, to_torch  # noqa: F401
from .recorder import Recorder  # noqa: F401
