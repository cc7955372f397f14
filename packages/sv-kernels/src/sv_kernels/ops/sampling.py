"""The ops on a step's token ids and logits: the previous step's sampled ids fed into this
step's inputs (`feed_tokens`), logit processing (grammar bitmasks, logit bias, allowed tokens,
penalties, min-p), and the choice of tokens (`argmax`, `sample`) with their log-probabilities.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .. import reference
from .checks import (
    check_device,
    check_dims,
    check_float,
    check_int,
    check_len,
    fail,
    on_cuda,
    shape_str,
)


def feed_tokens(token_ids: Tensor, source_rows: Tensor, sampled: Tensor) -> Tensor:
    """`reference.feed_tokens`: token ids with the pending entries read from `sampled` (the
    previous step's ids, still on the device). Rows of `sampled` are not range-checked here
    (that would need a sync); the caller's source rows must index it."""
    op = "feed_tokens"
    check_dims(op, "token_ids", token_ids, 1, "[T]")
    check_int(op, "token_ids", token_ids)
    check_dims(op, "source_rows", source_rows, 1, "[T]")
    check_int(op, "source_rows", source_rows)
    check_len(op, "source_rows", source_rows, 0, token_ids.shape[0], "one per token")
    check_dims(op, "sampled", sampled, 1, "[N]")
    check_int(op, "sampled", sampled)
    check_device(op, token_ids=token_ids, source_rows=source_rows, sampled=sampled)
    if on_cuda(token_ids):
        from .. import triton_ops

        return triton_ops.feed_tokens(token_ids, source_rows, sampled)
    return reference.feed_tokens(token_ids, source_rows, sampled)


def apply_token_bitmask(logits: Tensor, bitmask: Tensor, rows: Tensor) -> None:
    """`reference.apply_token_bitmask`: in place, the rows of logits named by `rows` keep only
    the tokens their bitmask row allows. Row indices are not range-checked (that would need a
    sync); the caller's rows must index logits."""
    op = "apply_token_bitmask"
    check_dims(op, "logits", logits, 2, "[B, V]")
    check_float(op, "logits", logits)
    check_dims(op, "bitmask", bitmask, 2, "[N, ceil(V / 32)]")
    if bitmask.dtype != torch.int32:
        fail(op, f"bitmask must be int32, got {bitmask.dtype}")
    check_len(op, "bitmask", bitmask, 1, (logits.shape[1] + 31) // 32, "32 tokens a word")
    check_dims(op, "rows", rows, 1, "[N]")
    check_int(op, "rows", rows)
    check_len(op, "rows", rows, 0, bitmask.shape[0], "one per bitmask row")
    if logits.stride(1) != 1:
        fail(op, "logits must be contiguous along its last dim (V)")
    check_device(op, logits=logits, bitmask=bitmask, rows=rows)
    if on_cuda(logits):
        from .. import triton_ops

        triton_ops.apply_token_bitmask(logits, bitmask, rows)
        return
    reference.apply_token_bitmask(logits, bitmask, rows)


def argmax(logits: Tensor) -> Tensor:
    op = "argmax"
    check_dims(op, "logits", logits, 2, "[B, V]")
    check_float(op, "logits", logits)
    if logits.shape[1] == 0:
        fail(op, "logits has an empty vocabulary")
    if on_cuda(logits):
        from .. import triton_ops

        return triton_ops.argmax(logits)
    return reference.argmax(logits)


def sample(
    logits: Tensor,
    temperature: Tensor,
    top_k: Tensor,
    top_p: Tensor,
    seeds: Tensor,
    steps: Tensor,
    *,
    any_top_k: bool = True,
    any_top_p: bool = True,
) -> Tensor:
    """`reference.sample`. any_top_k / any_top_p = False promise that no row uses that filter
    (the caller knows from its host-side request list); the CUDA path then skips its passes."""
    op = "sample"
    check_dims(op, "logits", logits, 2, "[B, V]")
    check_float(op, "logits", logits)
    if logits.shape[1] == 0:
        fail(op, "logits has an empty vocabulary")
    batch = logits.shape[0]
    per_row = {
        "temperature": temperature,
        "top_k": top_k,
        "top_p": top_p,
        "seeds": seeds,
        "steps": steps,
    }
    for name, t in per_row.items():
        check_dims(op, name, t, 1, "[B]")
        check_len(op, name, t, 0, batch, "one per row of logits")
    for name in ("temperature", "top_p"):
        check_float(op, name, per_row[name])
    for name in ("top_k", "seeds", "steps"):
        check_int(op, name, per_row[name])
    check_device(op, logits=logits, **per_row)
    if on_cuda(logits):
        from .. import triton_ops

        return triton_ops.sample(
            logits,
            temperature,
            top_k,
            top_p,
            seeds,
            steps,
            any_top_k=any_top_k,
            any_top_p=any_top_p,
        )
    return reference.sample(logits, temperature, top_k, top_p, seeds, steps)


MAX_LOGPROBS = 20  # top alternatives per token, as OpenAI's top_logprobs


def token_logprobs(logits: Tensor, ids: Tensor, k: int) -> tuple[Tensor, Tensor, Tensor]:
    """`reference.token_logprobs`; on CUDA one Triton kernel reads the logits once, without
    materializing the log-softmax (triton_ops/token_logprobs.py)."""
    op = "token_logprobs"
    check_dims(op, "logits", logits, 2, "[B, V]")
    check_float(op, "logits", logits)
    check_dims(op, "ids", ids, 1, "[B]")
    check_int(op, "ids", ids)
    check_len(op, "ids", ids, 0, logits.shape[0], "one per row of logits")
    check_device(op, logits=logits, ids=ids)
    if not 0 <= k <= min(MAX_LOGPROBS, logits.shape[1]):
        fail(op, f"k must be in [0, {min(MAX_LOGPROBS, logits.shape[1])}], got {k}")
    if on_cuda(logits):
        from .. import triton_ops

        return triton_ops.token_logprobs(logits, ids, k)
    return reference.token_logprobs(logits, ids, k)


def _check_rows(op: str, batch: int, **rows: Tensor) -> None:
    for name, t in rows.items():
        check_dims(op, name, t, 1, "[B]")
        check_len(op, name, t, 0, batch, "one per row of logits")


def apply_logit_bias(logits: Tensor, rows: Tensor, tokens: Tensor, values: Tensor) -> Tensor:
    """`reference.apply_logit_bias` (torch's index_put on every backend)."""
    op = "apply_logit_bias"
    check_dims(op, "logits", logits, 2, "[B, V]")
    check_float(op, "logits", logits)
    for name, t in (("rows", rows), ("tokens", tokens), ("values", values)):
        check_dims(op, name, t, 1, "[N]")
        check_len(op, name, t, 0, rows.shape[0], "one per bias entry")
    check_int(op, "rows", rows)
    check_int(op, "tokens", tokens)
    check_float(op, "values", values)
    check_device(op, logits=logits, rows=rows, tokens=tokens, values=values)
    return reference.apply_logit_bias(logits, rows, tokens, values)


def apply_allowed_tokens(
    logits: Tensor, rows: Tensor, tokens: Tensor, restricted: Tensor
) -> Tensor:
    """`reference.apply_allowed_tokens` (torch's index_put and masked_fill on every backend)."""
    op = "apply_allowed_tokens"
    check_dims(op, "logits", logits, 2, "[B, V]")
    check_float(op, "logits", logits)
    for name, t in (("rows", rows), ("tokens", tokens), ("restricted", restricted)):
        check_dims(op, name, t, 1, "[N]")
        check_int(op, name, t)
    check_len(op, "tokens", tokens, 0, rows.shape[0], "one per allowed entry")
    check_device(op, logits=logits, rows=rows, tokens=tokens, restricted=restricted)
    return reference.apply_allowed_tokens(logits, rows, tokens, restricted)


def apply_penalties(
    logits: Tensor,
    output_counts: Tensor,
    prompt_mask: Tensor,
    presence: Tensor,
    frequency: Tensor,
    repetition: Tensor,
) -> Tensor:
    """`reference.apply_penalties`: a few elementwise passes over [B, V], as torch ops on every
    backend (memory-bound and capturable; the sampler's own kernels dominate)."""
    op = "apply_penalties"
    check_dims(op, "logits", logits, 2, "[B, V]")
    check_float(op, "logits", logits)
    for name, t in (("output_counts", output_counts), ("prompt_mask", prompt_mask)):
        if t.shape != logits.shape:
            fail(op, f"{name} must be shaped like logits {shape_str(logits)}, got {shape_str(t)}")
    check_int(op, "output_counts", output_counts)
    if prompt_mask.dtype != torch.bool:
        fail(op, f"prompt_mask must be a bool tensor, got {prompt_mask.dtype}")
    _check_rows(op, logits.shape[0], presence=presence, frequency=frequency, repetition=repetition)
    for name, t in (("presence", presence), ("frequency", frequency), ("repetition", repetition)):
        check_float(op, name, t)
    check_device(
        op,
        logits=logits,
        output_counts=output_counts,
        prompt_mask=prompt_mask,
        presence=presence,
        frequency=frequency,
        repetition=repetition,
    )
    return reference.apply_penalties(
        logits, output_counts, prompt_mask, presence, frequency, repetition
    )


def apply_min_p(logits: Tensor, temperature: Tensor, min_p: Tensor) -> Tensor:
    """`reference.apply_min_p` (torch ops on every backend)."""
    op = "apply_min_p"
    check_dims(op, "logits", logits, 2, "[B, V]")
    check_float(op, "logits", logits)
    _check_rows(op, logits.shape[0], temperature=temperature, min_p=min_p)
    check_float(op, "temperature", temperature)
    check_float(op, "min_p", min_p)
    check_device(op, logits=logits, temperature=temperature, min_p=min_p)
    return reference.apply_min_p(logits, temperature, min_p)
