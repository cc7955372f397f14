"""The decoder forward pass over a packed batch of tokens and a paged KV cache.

One forward serves every family of `sv_weights.architectures`: what a family adds (q/k/v
biases, per-head q/k norms, a sliding window) is present in its weights and config, and the
forward applies it where it is.

One step of the engine feeds T tokens from B sequences, one after another (a prompt chunk is
many tokens, a decoding sequence is one). Everything except attention treats those tokens as
one [T, H] matrix; attention uses the per-sequence metadata in `AttentionMetadata` to find
each sequence's pages. The same code runs on both backends: `sv_kernels.ops` sends CUDA
tensors to Triton kernels and CPU tensors to the plain-torch references.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from sv_kernels import ops
from sv_kernels.quantized import ScaledProduct
from sv_kernels.reference import FP8_KV_DTYPE, kv_pages
from sv_kernels.rope_tables import Llama3RopeScaling, rope_tables
from sv_weights import ModelConfig
from torch import Tensor

from sv_model.linear_plans import LinearPlans
from sv_model.parallel import TensorParallel
from sv_model.weights import ModelWeights


@dataclass
class KVCache:
    """The paged KV pool: k and v are [layers, pages, page_size, kv_heads, head_dim], on a GPU
    stored head by head within each page (`sv_kernels.reference.kv_pages`).

    A page id names the same 16 token slots in every layer, so one block table serves all layers.
    An FP8 (e4m3) pool has `scales` [layers, 2, kv_heads] (FP32): K and V are stored divided by
    their layer's and head's scale (see `sv_kernels.reference.quantize_kv`). A checkpoint with
    a calibrated FP8 KV cache brings one K and one V scale per layer (`ModelWeights.kv_scales`),
    which every KV head of the layer gets (as in vLLM). Without them the scales are 1: e4m3
    reaches +-448 with 3 mantissa bits at every magnitude down to 2^-6, which holds the K and V
    of Llama-family models (as vLLM's uncalibrated default). A BF16 or FP32 pool needs no
    scales and ignores a checkpoint's.
    """

    k: Tensor
    v: Tensor
    scales: Tensor | None = None

    @classmethod
    def allocate(
        cls,
        config: ModelConfig,
        num_pages: int,
        page_size: int,
        device: torch.device | str,
        dtype: torch.dtype,
        layer_scales: Tensor | None = None,
    ) -> KVCache:
        """A zeroed pool; an FP8 one with `layer_scales` [layers, 2] (each layer's K and V
        scale, for all its KV heads) or else scales of 1."""
        scales = None
        if dtype == FP8_KV_DTYPE:
            shape = (config.num_hidden_layers, 2, config.num_key_value_heads)
            if layer_scales is None:
                scales = torch.ones(shape, device=device, dtype=torch.float32)
            else:
                per_layer = layer_scales.to(device=device, dtype=torch.float32)
                scales = per_layer[:, :, None].expand(shape).contiguous()

        def pool() -> Tensor:
            return kv_pages(
                (config.num_hidden_layers,),
                num_pages,
                page_size,
                config.num_key_value_heads,
                config.head_dim,
                dtype,
                device,
            )

        return cls(pool(), pool(), scales)

    def layer_scales(self, layer: int) -> Tensor | None:
        return None if self.scales is None else self.scales[layer]

    @property
    def page_size(self) -> int:
        return int(self.k.shape[2])

    @property
    def num_pages(self) -> int:
        return int(self.k.shape[1])


@dataclass
class AttentionMetadata:
    """Where each token's K/V goes and what each sequence attends to, for one step.

    slot_mapping [T]: cache slot (page * page_size + offset) each token's K/V is written to.
    seq_lens [B]: context length of each sequence after this step (cached prefix + new tokens).
    block_tables [B, max_pages]: each sequence's pages.
    cu_seqlens_q [B+1] and max_seqlen_q: token ranges of each sequence in the packed batch;
      `None` in a decode-only step, where every sequence feeds exactly one token.
    decode_tail: in a packed step, the last sequences that feed one token each (a mixed
      step's decodes), which the attention may run as a decode step's (`ops.DecodeTail`).
    """

    slot_mapping: Tensor
    seq_lens: Tensor
    block_tables: Tensor
    cu_seqlens_q: Tensor | None = None
    max_seqlen_q: int = 1
    decode_tail: ops.DecodeTail | None = None


class DecoderModel:
    """A Llama-family decoder: RMSNorm, GQA attention with RoPE, SwiGLU MLP; with Qwen2's
    q/k/v biases, Qwen3's q/k norms or Mistral's sliding window where the config has them.

    `linear_plans` says how each matrix is multiplied (cuBLAS until its owner tunes them); a
    CUDA graph captured earlier keeps the kernels it was captured with.

    With `tensor_parallel`, `config` and `weights` are this rank's slice (sv_model.parallel:
    its heads and its part of the MLP), and the outputs of o and down, partial sums on each
    rank, are all-reduced: the one difference from a single device."""

    def __init__(
        self,
        config: ModelConfig,
        weights: ModelWeights,
        max_positions: int,
        tensor_parallel: TensorParallel | None = None,
    ) -> None:
        self.config = config
        self.weights = weights
        self.tensor_parallel = tensor_parallel
        self.linear_plans = LinearPlans.untuned(config.num_hidden_layers)
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.scale = config.head_dim**-0.5
        self.sliding_window = config.sliding_window
        scaling = None
        if config.rope_scaling is not None:
            s = config.rope_scaling
            scaling = Llama3RopeScaling(
                s.factor, s.low_freq_factor, s.high_freq_factor, s.original_max_position_embeddings
            )
        self.cos, self.sin = rope_tables(
            config.head_dim,
            max_positions,
            config.rope_theta,
            scaling,
            device=weights.embed.device,
        )

    @property
    def device(self) -> torch.device:
        return self.weights.embed.device

    @property
    def dtype(self) -> torch.dtype:
        return self.weights.embed.dtype

    def forward(
        self,
        input_ids: Tensor,
        positions: Tensor,
        kv: KVCache,
        attn: AttentionMetadata,
        logits_indices: Tensor | None = None,
    ) -> Tensor:
        """Run T tokens through the model; return FP32 logits [len(logits_indices), V].

        Only the rows named by `logits_indices` go through the LM head (for a prompt, just its
        last token); `None` means every token (used by teacher-forced tests).
        """
        w, plans, tp = self.weights, self.linear_plans, self.tensor_parallel
        num_tokens = input_ids.shape[0]
        q_size = self.num_heads * self.head_dim
        # Each torch call costs microseconds on the host (most of a CPU decode step): the
        # layers' cache views are taken in one call each.
        k_caches, v_caches = kv.k.unbind(0), kv.v.unbind(0)
        hidden: Tensor | ScaledProduct = ops.embedding(input_ids, w.embed)
        residual: Tensor | None = None
        for layer_idx, (layer, plan) in enumerate(zip(w.layers, plans.layers, strict=True)):
            # Where q/k/v, gate/up and down multiply on the FP8 tensor cores, the norm or the
            # SwiGLU before each writes their FP8 activations itself (one kernel fewer each).
            x, residual = ops.rms_norm(
                hidden,
                layer.input_norm,
                self.config.rms_norm_eps,
                residual,
                fp8_rows=ops.takes_fp8_rows(layer.qkv, plan.qkv, num_tokens, hidden.dtype),
            )
            k_cache, v_cache = k_caches[layer_idx], v_caches[layer_idx]
            kv_scales = kv.layer_scales(layer_idx)
            qk_norms = None
            if layer.q_norm is not None and layer.k_norm is not None:
                qk_norms = (layer.q_norm, layer.k_norm, self.config.rms_norm_eps)
            q = ops.qkv_rope_cache(
                x,
                layer.qkv,
                self.num_heads,
                positions,
                self.cos,
                self.sin,
                k_cache,
                v_cache,
                attn.slot_mapping,
                kv_scales,
                plan=plan.qkv,
                bias=layer.qkv_bias,
                qk_norms=qk_norms,
            )
            if attn.cu_seqlens_q is None:
                o = ops.paged_decode_attention(
                    q,
                    k_cache,
                    v_cache,
                    attn.block_tables,
                    attn.seq_lens,
                    self.scale,
                    kv_scales=kv_scales,
                    sliding_window=self.sliding_window,
                )
            else:
                o = ops.prefill_attention(
                    q,
                    k_cache,
                    v_cache,
                    attn.cu_seqlens_q,
                    attn.seq_lens,
                    attn.block_tables,
                    self.scale,
                    attn.max_seqlen_q,
                    kv_scales=kv_scales,
                    sliding_window=self.sliding_window,
                    decode_tail=attn.decode_tail,
                )
            # An FP8 product may come with its scales for the next norm to apply as it reads it
            # (`ScaledProduct`); a partial sum to all-reduce comes scaled.
            if tp is None:
                hidden = ops.linear(
                    o.view(num_tokens, q_size), layer.o, plan=plan.o, defer_scales=True
                )
            else:
                hidden = ops.linear(o.view(num_tokens, q_size), layer.o, plan=plan.o)
                tp.all_reduce(hidden)
            x, residual = ops.rms_norm(
                hidden,
                layer.post_attention_norm,
                self.config.rms_norm_eps,
                residual,
                fp8_rows=ops.takes_fp8_rows(layer.gate_up, plan.gate_up, num_tokens, hidden.dtype),
            )
            mlp = ops.linear_swiglu(
                x,
                layer.gate_up,
                plan=plan.gate_up,
                fp8_rows=ops.takes_fp8_rows(layer.down, plan.down, num_tokens, hidden.dtype),
            )
            if tp is None:
                hidden = ops.linear(mlp, layer.down, plan=plan.down, defer_scales=True)
            else:
                hidden = ops.linear(mlp, layer.down, plan=plan.down)
                tp.all_reduce(hidden)
        if logits_indices is not None:  # a prompt's rows: only those named reach the head
            x, _ = ops.rms_norm(hidden, w.final_norm, self.config.rms_norm_eps, residual)
            x = x.index_select(0, logits_indices)
            return ops.linear(x, w.lm_head, out_dtype=torch.float32, plan=plans.lm_head)
        # A decode step: every row; an FP8 head's activations come from the norm's kernel.
        head_rows = ops.takes_fp8_rows(w.lm_head, plans.lm_head, num_tokens, hidden.dtype)
        x_rows, _ = ops.rms_norm(
            hidden, w.final_norm, self.config.rms_norm_eps, residual, fp8_rows=head_rows
        )
        return ops.linear(x_rows, w.lm_head, out_dtype=torch.float32, plan=plans.lm_head)
