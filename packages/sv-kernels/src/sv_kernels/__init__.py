"""sv_kernels: the engine's memory-bound ops, each as a Triton kernel beside a plain-torch reference.

`ops` is what the model calls (CUDA tensors -> Triton, others -> reference); `reference` is the
spec; `rope_tables` builds the RoPE cos/sin tables; `linear_plan` is how `ops.linear` runs one
weight (what `ops.tune_linear` returns), `tuning_cache` where tuning results are kept.
`triton_ops` is imported on demand only.
"""

from . import linear_plan, ops, reference, rope_tables, tuning_cache
from .errors import KernelError
from .linear_plan import LinearPlan, TunedLinear
from .rope_tables import Llama3RopeScaling
from .tuning_cache import TuningCache

__all__ = [
    "KernelError",
    "LinearPlan",
    "Llama3RopeScaling",
    "TunedLinear",
    "TuningCache",
    "linear_plan",
    "ops",
    "reference",
    "rope_tables",
    "tuning_cache",
]
