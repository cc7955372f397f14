"""sv_kernels: the engine's memory-bound ops, each as a Triton kernel beside a plain-torch reference.

`ops` is what the model calls (CUDA tensors -> Triton, others -> reference); `reference` is the
spec; `rope_tables` builds the RoPE cos/sin tables. `triton_ops` is imported on demand only.
"""

from . import ops, reference, rope_tables
from .errors import KernelError
from .rope_tables import Llama3RopeScaling

__all__ = ["KernelError", "Llama3RopeScaling", "ops", "reference", "rope_tables"]
