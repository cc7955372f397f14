"""Every Triton kernel compiles for sm_90 (H100/H200), checked in CI without a GPU.

The interpreter that runs the kernel tests in CI accepts some programs the compiler rejects
(a name bound to tiles of two shapes in the two arms of an `if` once reached a GPU session
that way). `tools/compile_check.py` runs each launch wrapper with Triton's driver replaced by
a compile-only stand-in and builds every kernel to a cubin with Triton's bundled ptxas. It
needs a process where TRITON_INTERPRET is unset, hence the subprocess.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

TOOL = Path(__file__).parents[1] / "tools" / "compile_check.py"


def test_every_kernel_compiles_for_hopper() -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run(
        [sys.executable, str(TOOL)], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert done.stdout.rstrip().endswith("0 failure(s)")
    assert "_rope_cache_kernel" in done.stdout and "_gemv_kernel" in done.stdout
    # Every kernel of a decode step waits for its predecessor under programmatic dependent
    # launch (the compile check compiles with PDL on, as on the H200); one that did not would
    # still be correct, but would stall the overlap for the whole chain behind it.
    decode_path = {
        "_decode_metadata_kernel",
        "_feed_tokens_kernel",
        "_embedding_kernel",
        "_rms_norm_kernel",
        "_gemv_kernel",
        "_few_rows_kernel",
        "_rope_cache_kernel",
        "_qkv_rope_cache_kernel",
        "_decode_attention_kernel",
        "_merge_splits_kernel",
        "_swiglu_kernel",
        # the quantized matmuls' own kernels, past one row
        "_quantize_rows_kernel",
        "_scale_product_kernel",
        "_w8a16_kernel",
        "_argmax_chunks_kernel",
        "_argmax_merge_kernel",
        # the sampler, a graph of its own after the decode graph
        "_chunk_max_kernel",
        "_radix_histogram_kernel",
        "_radix_select_kernel",
        "_draw_chunks_kernel",
        # the log-probabilities, a graph of their own after the sampler
        "_logprob_chunks_kernel",
        "_logprob_merge_kernel",
    }
    for line in done.stdout.splitlines():
        fields = line.split()
        if line.startswith("ok") and any(name in fields for name in decode_path):
            assert line.endswith(" pdl"), f"a decode-path kernel compiled without PDL: {line}"
