"""The model runner: turns one scheduled step into device tensors, runs the model, samples.

It composes the pieces that live on the device across steps, each in its own module:
- the paged KV pool (plus one scratch page that padding rows of a CUDA graph write into);
- `block_tables`: the block table of every running sequence, one table row each, on the device;
- `step_packing`: a step's host lists as device tensors (one upload per step);
- `decode_graphs`: on CUDA, one captured graph per decode batch-size bucket;
- `prompt_graphs`: on CUDA, one per token-count bucket of a single sequence's prompt chunk;
- `logit_processing`: penalties, min_p and logit_bias, the one step between logits and sampler;
- `sampler`: argmax, a sampling graph or an eager `ops.sample`;
- `logprob_rows`: the log-probabilities of the sampled tokens (and of prompt tokens, for echo);
- `linear_plans` and `warmup`: the batch-1 GEMV plans and the kernel compiles done before the
  first request.

Nothing in a step waits for the GPU: `launch` queues the step and returns its sampled ids as
`PendingTokens`, still on their way to the host, so the engine can plan and launch the next
step while this one runs (see sv_engine). Every upload is an asynchronous copy from pinned
memory, and a pinned buffer is refilled only once the copy out of it has finished. The next
step may feed tokens the host has not seen yet: `StepInputs.feed` names them, and the model
reads them from `last_ids`, the device buffer where every launch leaves its sampled ids.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import torch
from sv_kernels import TuningCache, ops
from sv_weights import ModelConfig
from torch import Tensor

from sv_model import linear_plans, logprob_rows, prompt_graphs, sampler, step_packing, warmup
from sv_model.block_tables import DeviceBlockTables
from sv_model.decode_graphs import DecodeGraph, DecodeGraphs
from sv_model.decoder import AttentionMetadata, DecoderModel, KVCache
from sv_model.logit_processing import LogitProcessor
from sv_model.parallel import TensorParallel
from sv_model.pending_tokens import PendingTokens
from sv_model.prompt_graphs import PromptGraphs
from sv_model.step import StepInputs
from sv_model.weights import ModelWeights


class ModelRunner:
    """Runs steps of a `DecoderModel` over a paged KV pool of `num_pages` pages of `page_size`
    tokens, for up to `max_num_seqs` sequences (table rows). `tuning_cache`: where the batch-1 GEMV
    tuning of `warmup` keeps its results between processes (None: timed in each process).
    `kv_cache_dtype`: the pool's (None: the weights'; torch.float8_e4m3fn: FP8 pages, scaled by
    the checkpoint's calibrated `weights.kv_scales` where it has them).
    `tensor_parallel`: this rank's place among several (sv_model.parallel; `config` and
    `weights` are then the rank's slice, and every rank runs the same steps)."""

    def __init__(
        self,
        config: ModelConfig,
        weights: ModelWeights,
        *,
        num_pages: int,
        page_size: int = 16,
        max_num_seqs: int = 256,
        max_model_len: int | None = None,
        use_cuda_graphs: bool = True,
        tuning_cache: TuningCache | None = None,
        kv_cache_dtype: torch.dtype | None = None,
        tensor_parallel: TensorParallel | None = None,
    ) -> None:
        self.config = config
        self.tuning_cache = tuning_cache
        self.device = weights.embed.device
        self.dtype = weights.embed.dtype
        self.page_size = page_size
        self.max_num_seqs = max_num_seqs
        self.max_model_len = max_model_len or config.max_position_embeddings
        self.model = DecoderModel(config, weights, self.max_model_len, tensor_parallel)
        # The scratch page (id num_pages) and the scratch table row (max_num_seqs) absorb the
        # writes and reads of padding rows in a CUDA-graph batch.
        self.num_pages = num_pages
        self.scratch_page = num_pages
        self.kv_cache_dtype = kv_cache_dtype or self.dtype
        self.kv = KVCache.allocate(
            config, num_pages + 1, page_size, self.device, self.kv_cache_dtype, weights.kv_scales
        )
        self.block_tables = DeviceBlockTables(
            max_num_seqs, self.max_model_len, page_size, self.scratch_page, self.device
        )
        self.scratch_table_row = self.block_tables.scratch_table_row
        self.is_cuda = self.device.type == "cuda"
        self.use_cuda_graphs = use_cuda_graphs and self.is_cuda
        # The sampled ids of the latest launch, row by row: what `StepInputs.feed` reads.
        self.last_ids = torch.zeros(max_num_seqs, dtype=torch.int64, device=self.device)
        self.decode_graphs = (
            DecodeGraphs(self._decode_forward, self.last_ids, self.scratch_table_row, max_num_seqs)
            if self.use_cuda_graphs
            else None
        )
        # One sequence's prompt chunk replays a graph too (prompt_graphs.py); not across
        # tensor-parallel ranks, where it has not been measured.
        self.prompt_graphs = (
            PromptGraphs(
                self._prompt_forward,
                self.block_tables.tensor,
                page_size,
                self.scratch_table_row,
                self.max_model_len,
            )
            if self.use_cuda_graphs and tensor_parallel is None
            else None
        )
        self.linear_choices: dict[tuple[int, int], str] = {}  # filled by tune_linear
        # Penalties, min_p, logit_bias: the one step between the logits and the sampler.
        self.logit_processor = LogitProcessor(
            max_num_seqs + 1, config.vocab_size, self.device, self.last_ids
        )
        # Hears (logits, sampled ids) of every launch, rows in sampling order, while a step
        # trace is recorded (sv_trace); the logits may be a graph's buffer, valid until the
        # next launch.
        self.logits_observer: Callable[[Tensor, Tensor], None] | None = None

    # --- warm-up ----------------------------------------------------------------------------

    @torch.inference_mode()
    def warmup(
        self, max_prefill_tokens: int = 2048, progress: Callable[[str], None] | None = None
    ) -> None:
        """Tune the matmuls, compile every kernel variant (the sampler's too) and capture
        every decode graph now, not mid-request (see `warmup` for the prompt steps). Sampling
        graphs are captured on first need (cheap once compiled).

        `progress` hears a line as each phase starts and when all is done: on the H200 about
        25 s the first time on a machine (compiling), 2-2.5 s once Triton's cache and the GEMV
        tuning cache are warm (BENCHMARKS.md runs 54-58).
        """
        say = progress or (lambda message: None)
        started = time.perf_counter()
        steps = warmup.warmup_steps(max_prefill_tokens, self.scratch_table_row, self.max_num_seqs)
        lengths = len(warmup.prompt_lengths(max_prefill_tokens))
        device = str(self.device)
        if self.is_cuda:
            device += f" ({torch.cuda.get_device_name(self.device)})"
        say(
            f"warm-up on {device}: compiling kernels in {len(steps)} prompt steps ({lengths} "
            "prompt lengths, then many prompts at once; about half a minute in all the first "
            "time on a machine, a few seconds once Triton has them cached)"
        )
        # Tuned first: the plans decide which kernels the prompt steps run (an FP8 matmul's
        # norm writes FP8 rows), and a variant first met by a request compiles mid-run.
        self.tune_linear(progress)
        for step in steps:
            ops.argmax(self._prefill_eager(step))
        if self.is_cuda:
            sampler.compile_sampler(self.config.vocab_size, self.device)
        if self.decode_graphs is not None:
            batches = self.decode_graphs.buckets
            prompts = self.prompt_graphs.buckets if self.prompt_graphs is not None else []
            say(
                f"warm-up: capturing {len(batches)} decode graphs (batch sizes {batches[0]} to "
                f"{batches[-1]})"
                + (
                    f" and {len(prompts)} prompt graphs ({prompts[0]} to {prompts[-1]} tokens)"
                    if prompts
                    else ""
                )
            )
            self.decode_graphs.capture_all()
            if self.prompt_graphs is not None:
                self.prompt_graphs.capture_all()
        if self.is_cuda:
            torch.cuda.synchronize(self.device)
        say(f"warm-up done in {time.perf_counter() - started:.1f} s")

    def tune_linear(self, progress: Callable[[str], None] | None = None) -> None:
        """Choose cuBLAS or the Triton GEMV for each of the model's matrices at batch 1
        (`linear_plans.tune`; part of `warmup`; cuBLAS for all on the CPU) and give the plans
        to the model. Fills `linear_choices`. Shapes kept in `tuning_cache` are not timed.
        Graphs captured before keep the kernels they were captured with."""
        plans, self.linear_choices = linear_plans.tune(
            self.model.weights, self.tuning_cache, progress
        )
        self.model.linear_plans = plans

    # --- block tables -----------------------------------------------------------------------

    def set_block_tables(self, rows: Sequence[tuple[int, Sequence[int]]]) -> None:
        """Replace the given table rows, (table row, pages) each, in one upload."""
        self.block_tables.set_rows(rows)

    # --- one step -------------------------------------------------------------------------------

    def execute(self, step: StepInputs) -> list[int]:
        """Run one step; return the sampled token id of each row in `step.sample_rows`."""
        return self.launch(step).result()

    @torch.inference_mode()
    def launch(self, step: StepInputs) -> PendingTokens:
        """Queue one step on the device; its sampled ids (one per `step.sample_rows` entry)
        come back through the returned PendingTokens. They are also left in `last_ids`, for
        the next step's `feed`."""
        if len(step.sample_rows) > self.last_ids.shape[0]:
            raise ValueError(
                f"a step samples {len(step.sample_rows)} rows; at most max_num_seqs="
                f"{self.max_num_seqs}"
            )
        graph: DecodeGraph | None = None
        prompt_logprobs = None
        rows = step_packing.decode_rows(step, self.max_num_seqs)
        if rows is not None:
            logits, greedy_ids, graph = self._decode(rows)
        else:
            logits = self._prefill(step)
            greedy_ids = None
            if step.prompt_logprobs:  # their rows follow the sampled rows' (see pack_prefill)
                num_sampled = len(step.sample_rows)
                if step.logits_at is not None:  # a verify step: a choice at each draft position
                    num_sampled = len(step.logits_at)
                prompt_logprobs = logprob_rows.of_prompts(step, logits[num_sampled:])
                logits = logits[:num_sampled]
        # One row per choice: the step's sequences' own first; a verify step's draft positions
        # follow, each processed, masked and sampled as plain decoding would at that token.
        processed = self.logit_processor.process(step, logits)
        # The forward is queued: the host now computes the grammar masks while it runs.
        bitmask = step.token_bitmask() if step.token_bitmask is not None else None
        if (
            bitmask is not None
            and (step.logprobs or self.logits_observer is not None)
            and processed is logits
        ):
            # The mask goes in place; logprobs, and a trace's (the observer's), are of the raw
            # logits: masked, a trace's would change with whether any row asked for logprobs.
            processed = logits.clone()
        if processed is not logits:  # the graph's argmax and buffers are of the raw logits
            ids = sampler.next_token_ids(processed, None, step.sampling, None, bitmask)
        else:
            ids = sampler.next_token_ids(logits, greedy_ids, step.sampling, graph, bitmask)
        self.logit_processor.count(ids)
        kept = len(step.sample_rows)
        if self.logits_observer is not None:  # the raw logits of every choice's row
            self.logits_observer(logits, ids)
        self.last_ids[:kept].copy_(ids[:kept])  # ids past these (draft positions) are never fed
        logprobs = logprob_rows.of_sampled(logits, ids, graph) if step.logprobs else None
        return PendingTokens(ids, logprobs, prompt_logprobs)

    def logits(self, step: StepInputs, *, every_token: bool = False) -> Tensor:
        """FP32 logits of a step, for tests and debugging: [len(sample_rows), V], or with
        `every_token` one row per fed token (teacher forcing; runs the packed path)."""
        with torch.inference_mode():
            rows = None if every_token else step_packing.decode_rows(step, self.max_num_seqs)
            if rows is not None:
                return self._decode(rows)[0].clone()
            return self._prefill(step, every_token=every_token).clone()

    def _prefill(self, step: StepInputs, every_token: bool = False) -> Tensor:
        """A step with a long chunk: one sequence's chunk replays a prompt graph where one
        holds it (the logits are then its buffer, valid until its next replay); any other
        runs eagerly."""
        if self.prompt_graphs is not None and not every_token:
            tokens = prompt_graphs.graph_tokens(step)
            graph = None if tokens is None else self.prompt_graphs.for_size(tokens)
            if graph is not None:
                return graph.replay(step)
        return self._prefill_eager(step, every_token)

    def _prefill_eager(self, step: StepInputs, every_token: bool = False) -> Tensor:
        """A step with a long chunk as a packed varlen batch, run eagerly."""
        packed = step_packing.pack_prefill(
            step, self.block_tables, self.page_size, self.last_ids, every_token
        )
        return self._prompt_forward(
            packed.token_ids, packed.positions, packed.attn, packed.logits_indices
        )

    def _prompt_forward(
        self,
        token_ids: Tensor,
        positions: Tensor,
        attn: AttentionMetadata,
        logits_rows: Tensor | None,
    ) -> Tensor:
        """The forward pass of a packed step on device tensors: what an eager prompt step runs
        and a prompt graph captures (logits_rows None: every row's logits)."""
        return self.model.forward(token_ids, positions, self.kv, attn, logits_rows)

    def _decode_forward(self, token_ids: Tensor, positions: Tensor, table_rows: Tensor) -> Tensor:
        """The decode forward pass on device tensors only (what a CUDA graph captures)."""
        attn = step_packing.decode_attention(
            self.block_tables, table_rows, positions, self.page_size
        )
        return self.model.forward(token_ids, positions, self.kv, attn)

    def _decode(self, rows: step_packing.DecodeRows) -> tuple[Tensor, Tensor, DecodeGraph | None]:
        """A step run as decode rows: returns the logits and greedy ids of its choices, and the
        graph whose buffers hold them in their first rows (None without CUDA graphs)."""
        choices = rows.num_choices
        if self.decode_graphs is None:
            token_ids, positions, table_rows = step_packing.upload_decode(
                rows, self.device, self.last_ids
            )
            logits = self._decode_forward(token_ids, positions, table_rows)[:choices]
            return logits, ops.argmax(logits), None
        graph = self.decode_graphs.for_batch(rows.num_rows)
        step_packing.fill_decode_rows(graph.inputs_to_fill(rows.num_rows), rows)
        logits, ids = graph.replay(rows.num_rows)
        return logits[:choices], ids[:choices], graph
