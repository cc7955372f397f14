"""The ops the model calls: CUDA tensors go to the Triton kernels, all others to the reference
(CPU tensors to `cpu_ops` for the decode step's ops it has: the reference's values in fewer
torch calls).

Each function has the signature of its twin in `sv_kernels.reference` (the spec: read it for
shapes and semantics). The inputs' shapes, dtypes and devices are checked here, on the host,
from metadata only, so a bad call raises `KernelError` naming the op and the argument instead
of failing deep inside a kernel. Nothing here reads device values: every op can be captured in
a CUDA graph. `sv_kernels.triton_ops` (and with it triton) is imported on the first CUDA call,
so CPU users never import triton.

The ops live in one module per family and are all re-exported here (call them as
`ops.<name>`): `linear_layers` (embedding, RMSNorm, linear, SwiGLU, their tuning), `attention`
(RoPE + cache write, the fused q/k/v projection, decode and prefill attention, a decode step's
metadata) and `sampling` (token feeding, logit processing, argmax, sampling, log-probabilities);
`checks` holds the input checks and device tests they share. An op that calls another
(`qkv_rope_cache` calls `linear`, `linear_swiglu` calls `swiglu`) looks it up in its own module,
so a test that swaps an op must patch that module as well as this one.
"""

from .attention import (
    DecodeTail,
    decode_metadata,
    paged_decode_attention,
    prefill_attention,
    qkv_rope_cache,
    rope_cache_write,
)
from .linear_layers import (
    embedding,
    linear,
    linear_swiglu,
    rms_norm,
    swiglu,
    takes_fp8_rows,
    tune_linear,
)
from .sampling import (
    MAX_LOGPROBS,
    apply_allowed_tokens,
    apply_logit_bias,
    apply_min_p,
    apply_penalties,
    apply_token_bitmask,
    argmax,
    feed_tokens,
    sample,
    token_logprobs,
)

__all__ = [
    "MAX_LOGPROBS",
    "DecodeTail",
    "apply_allowed_tokens",
    "apply_logit_bias",
    "apply_min_p",
    "apply_penalties",
    "apply_token_bitmask",
    "argmax",
    "decode_metadata",
    "embedding",
    "feed_tokens",
    "linear",
    "linear_swiglu",
    "paged_decode_attention",
    "prefill_attention",
    "qkv_rope_cache",
    "rms_norm",
    "rope_cache_write",
    "sample",
    "swiglu",
    "takes_fp8_rows",
    "token_logprobs",
    "tune_linear",
]
