"""The model runner: turns one scheduled step into device tensors, runs the model, samples.

It owns everything that lives on the device across steps:
- the paged KV pool (plus one scratch page that padding rows of a CUDA graph write into);
- the block table of every scheduler slot, kept on the device and updated only when a
  sequence gets a new page, so a decode step never re-uploads block tables;
- on CUDA, one captured graph per decode batch-size bucket (and, once a step samples, one
  sampling graph per bucket and mix of filters). A decode step is ~10 kernel
  launches per layer; for a 1B model at small batch the launch gaps would cost more than the
  kernels themselves, so decode replays graphs and only prefill (long, few launches per FLOP)
  runs eagerly.

Host-side inputs of a step are packed into one int32 array and uploaded with a single copy (a
decode graph has its own pinned input buffer); slot mappings are computed on the device from
the block tables.

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
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from sv_kernels import TuningCache, graphs, ops
from sv_weights import LlamaConfig
from torch import Tensor

from sv_model import linear_plans
from sv_model.llama import AttentionMetadata, KVCache, LlamaModel
from sv_model.weights import LlamaWeights


@dataclass
class SamplingRows:
    """Sampling parameters of the rows that get a token this step (one entry per row)."""

    temperature: Sequence[float]
    top_k: Sequence[int]
    top_p: Sequence[float]
    seeds: Sequence[int]
    steps: Sequence[int]

    def all_greedy(self) -> bool:
        return all(t <= 0 for t in self.temperature)

    def any_top_k(self) -> bool:
        """Whether any sampled (non-greedy) row may use top-k (a superset of the kernel's test)."""
        return any(t > 0 and k > 0 for t, k in zip(self.temperature, self.top_k, strict=True))

    def any_top_p(self) -> bool:
        """Whether any sampled row may use top-p (top_p < 1)."""
        return any(t > 0 and p < 1.0 for t, p in zip(self.temperature, self.top_p, strict=True))


@dataclass
class StepInputs:
    """One step, as the engine describes it (host-side lists).

    Sequence b feeds `query_lens[b]` tokens (its slice of `token_ids` / `positions`, in order)
    and ends the step with `seq_lens[b]` tokens of context. `seq_slots[b]` is its scheduler slot
    (the row of its block table). `sample_rows` lists the b that need a next token, in the order
    the sampled ids are returned; a prompt chunk that does not finish its prompt gets none.
    """

    token_ids: Sequence[int]
    positions: Sequence[int]
    seq_slots: Sequence[int]
    query_lens: Sequence[int]
    seq_lens: Sequence[int]
    sample_rows: Sequence[int]
    sampling: SamplingRows | None = None  # None: greedy for every row
    # (index into token_ids, row of the previous launch's sampled ids): tokens whose value is
    # still on the device; their token_ids entries are placeholders.
    feed: Sequence[tuple[int, int]] = ()

    @property
    def is_decode(self) -> bool:
        return len(self.token_ids) == len(self.seq_slots)


def _decode_buckets(max_batch: int) -> list[int]:
    buckets = [1, 2, 4, 8]
    while buckets[-1] < max_batch:
        buckets.append(buckets[-1] + (8 if buckets[-1] < 32 else 16 if buckets[-1] < 128 else 32))
    return [b for b in buckets if b < max_batch] + [max_batch]


class ModelRunner:
    def __init__(
        self,
        config: LlamaConfig,
        weights: LlamaWeights,
        *,
        num_pages: int,
        page_size: int = 16,
        max_num_seqs: int = 256,
        max_model_len: int | None = None,
        use_cuda_graphs: bool = True,
        tuning_cache: TuningCache | None = None,
    ) -> None:
        self.config = config
        self.tuning_cache = tuning_cache
        self.device = weights.embed.device
        self.dtype = weights.embed.dtype
        self.page_size = page_size
        self.max_num_seqs = max_num_seqs
        self.max_model_len = max_model_len or config.max_position_embeddings
        self.max_pages_per_seq = -(-self.max_model_len // page_size)
        self.model = LlamaModel(config, weights, max_positions=self.max_model_len)
        # The scratch page (id num_pages) and the scratch slot (row max_num_seqs) absorb the
        # writes and reads of padding rows in a CUDA-graph batch.
        self.num_pages = num_pages
        self.scratch_page = num_pages
        self.scratch_slot = max_num_seqs
        self.kv = KVCache.allocate(config, num_pages + 1, page_size, self.device, self.dtype)
        self.block_tables = torch.full(
            (max_num_seqs + 1, self.max_pages_per_seq),
            self.scratch_page,
            dtype=torch.int32,
            device=self.device,
        )
        self.is_cuda = self.device.type == "cuda"
        self.use_cuda_graphs = use_cuda_graphs and self.is_cuda
        self._graphs: dict[int, _DecodeGraph] = {}
        self._buckets = _decode_buckets(max_num_seqs)
        self._graph_pool: Any = None  # one memory pool shared by every captured graph
        self.linear_choices: dict[tuple[int, int], str] = {}  # filled by warmup (CUDA)
        # The sampled ids of the latest launch, row by row: what `StepInputs.feed` reads.
        self.last_ids = torch.zeros(max_num_seqs, dtype=torch.int64, device=self.device)

    # --- sizes (for benchmarks and stats) -----------------------------------------------------

    def num_parameters(self, include_embedding: bool = True) -> int:
        """Parameters in the weights (a tied LM head counted once)."""
        w = self.model.weights
        tensors = [w.final_norm, w.lm_head]
        tensors += [t for layer in w.layers for t in vars(layer).values()]
        count = sum(t.numel() for t in tensors)
        if include_embedding and w.embed is not w.lm_head:
            count += w.embed.numel()
        return count

    def weight_bytes_per_decode_step(self) -> int:
        """Bytes of weights a decode step must read: every matrix once (the one embedding row
        per token is negligible and not counted)."""
        w = self.model.weights
        return self.num_parameters(include_embedding=False) * w.lm_head.element_size()

    def kv_pool_bytes(self) -> int:
        return 2 * self.kv.k.numel() * self.kv.k.element_size()

    # --- warm-up ----------------------------------------------------------------------------

    @torch.inference_mode()
    def warmup(
        self, max_prefill_tokens: int = 2048, progress: Callable[[str], None] | None = None
    ) -> None:
        """Compile every kernel variant (the sampler's too) and capture every decode graph now,
        not mid-request. Sampling graphs are captured on first need (cheap once compiled).

        Triton specializes a kernel on its block sizes (chosen from the prompt length) and on
        integer arguments that are 1 or multiples of 16; a first request of each kind would
        otherwise pay the compile (~0.5 s) in its time to first token. The prefills run on the
        scratch slot, whose block table points every position at the scratch page.

        `progress` hears a line as each phase starts and when all is done: on the H200 about
        25 s the first time on a machine (compiling), 2-2.5 s once Triton's cache and the GEMV
        tuning cache are warm (BENCHMARKS.md runs 54-58).
        """
        say = progress or (lambda message: None)
        started = time.perf_counter()
        # Past 2,048 tokens only the token count matters (RoPE's tokens per program grow with
        # it), each in both kinds: a multiple of 16 and not.
        large = (4095, 4096, 8191, 8192, max_prefill_tokens - 1, max_prefill_tokens)
        lengths = sorted(
            {
                n
                for n in (1, 7, 16, 17, 40, 64, 100, 128, 300, 2048, *large)
                if 0 < n <= max_prefill_tokens
            }
        )
        say(
            f"warm-up on {self._device_name()}: compiling kernels for {len(lengths)} prompt "
            "lengths (about half a minute in all the first time on a machine, a few seconds "
            "once Triton has them cached)"
        )
        for n in lengths:
            for seqs in (1, 2) if n <= 2048 else (1,):
                step = StepInputs(
                    token_ids=[0] * (n * seqs),
                    positions=list(range(n)) * seqs,
                    seq_slots=[self.scratch_slot] * seqs,
                    query_lens=[n] * seqs,
                    seq_lens=[n] * seqs,
                    sample_rows=list(range(seqs)),
                    feed=[(0, 0)],  # and `ops.feed_tokens` (a step after an overlapped one)
                )
                ops.argmax(self._prefill(step))
        self.tune_linear(progress)
        if self.is_cuda:  # the sampler's kernels (one compile per vocabulary, any batch size)
            rows = torch.ones(1, device=self.device)
            index = torch.zeros(1, dtype=torch.int64, device=self.device)
            logits = torch.zeros((1, self.config.vocab_size), device=self.device)
            top_k = torch.full((1,), 50, dtype=torch.int32, device=self.device)
            ops.sample(logits, rows, top_k, rows * 0.9, index, index)
        if self.use_cuda_graphs:
            say(
                f"warm-up: capturing {len(self._buckets)} decode graphs (batch sizes "
                f"{self._buckets[0]} to {self._buckets[-1]})"
            )
            for bucket in self._buckets:
                if bucket not in self._graphs:
                    self._graphs[bucket] = _DecodeGraph(self, bucket)
        if self.is_cuda:
            torch.cuda.synchronize(self.device)
        say(f"warm-up done in {time.perf_counter() - started:.1f} s")

    def _device_name(self) -> str:
        if self.is_cuda:
            return f"{self.device} ({torch.cuda.get_device_name(self.device)})"
        return str(self.device)

    def tune_linear(self, progress: Callable[[str], None] | None = None) -> None:
        """Choose cuBLAS or the Triton GEMV for each of the model's matrices at batch 1
        (`linear_plans.tune`; part of `warmup`; cuBLAS for all on the CPU) and give the plans
        to the model. Fills `linear_choices`. Shapes kept in `tuning_cache` are not timed."""
        plans, self.linear_choices = linear_plans.tune(
            self.model.weights, self.tuning_cache, progress
        )
        self.model.linear_plans = plans

    # --- block tables -----------------------------------------------------------------------

    def set_block_tables(self, rows: Sequence[tuple[int, Sequence[int]]]) -> None:
        """Replace the block tables of the given slots (slot, pages) in one upload."""
        if not rows:
            return
        width = max(len(pages) for _, pages in rows)
        if width > self.max_pages_per_seq:
            raise ValueError(
                f"a block table of {width} pages exceeds the {self.max_pages_per_seq} pages of "
                f"max_model_len={self.max_model_len}"
            )
        host = np.full((len(rows), width + 1), self.scratch_page, dtype=np.int32)
        for i, (slot, pages) in enumerate(rows):
            host[i, 0] = slot
            host[i, 1 : len(pages) + 1] = pages
        dev = self._upload(host)
        self.block_tables[dev[:, 0].long(), :width] = dev[:, 1:]

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
        graph: _DecodeGraph | None = None
        if step.is_decode:
            logits, greedy_ids, graph = self._decode(step)
        else:
            logits = self._prefill(step)
            greedy_ids = None
        if step.sampling is None or step.sampling.all_greedy():
            ids = greedy_ids if greedy_ids is not None else ops.argmax(logits)
        elif graph is not None:  # the logits are the graph's own buffer: sample in a graph too
            ids = graph.sample(len(step.seq_slots), step.sampling)
        else:
            ids = self._sample(logits, step.sampling)
        self.last_ids[: ids.shape[0]].copy_(ids)
        return PendingTokens(ids)

    def logits(self, step: StepInputs, *, every_token: bool = False) -> Tensor:
        """FP32 logits of a step, for tests and debugging: [len(sample_rows), V], or with
        `every_token` one row per fed token (teacher forcing; runs the packed path)."""
        with torch.inference_mode():
            if step.is_decode and not every_token:
                return self._decode(step)[0].clone()
            return self._prefill(step, every_token=every_token)

    def decode_replay(self, step: StepInputs) -> Callable[[], None]:
        """Load a decode step's inputs into its CUDA graph and return the bare replay: no input
        copy, no host work, the graph alone (what benchmarks time as a step's GPU cost; every
        call recomputes the same step). Needs CUDA graphs and a step of one token per sequence."""
        if not self.use_cuda_graphs or not step.is_decode:
            raise ValueError("decode_replay needs CUDA graphs and a decode step")
        with torch.inference_mode():
            graph = self._decode(step)[2]
        if graph is None:
            raise ValueError("decode_replay needs a step whose sample_rows are all its rows")
        return graph.graph.replay

    def _upload(self, host: np.ndarray) -> Tensor:
        """One asynchronous host-to-device copy of a small array (block-table rows, a prefill
        step's inputs: kilobytes). A copy from pageable memory would wait for the stream to
        drain, i.e. for the step still running; so the array is first copied into pinned memory
        from torch's caching host allocator, which keeps that block until the copy is done."""
        tensor = torch.from_numpy(host)
        if not self.is_cuda:
            return tensor
        return tensor.pin_memory().to(self.device, non_blocking=True)

    def _pack(self, parts: list[np.ndarray]) -> list[Tensor]:
        """Upload int32 arrays in one copy; returns a device view of each. Every view starts on
        a 16-byte boundary: Triton specializes a kernel on whether each pointer argument is
        16-byte aligned, and offsets that moved with the step's sizes would compile new
        variants mid-run (seen on the H200: ~2 s in the first large batch after warm-up)."""
        starts = [0]
        for part in parts:
            starts.append(starts[-1] + -(-len(part) // 4) * 4)
        host = np.zeros(starts[-1], dtype=np.int32)
        for part, start in zip(parts, starts[:-1], strict=True):
            host[start : start + len(part)] = part
        dev = self._upload(host)
        return [
            dev[start : start + len(part)] for part, start in zip(parts, starts[:-1], strict=True)
        ]

    def _source_rows(self, step: StepInputs, length: int) -> np.ndarray:
        """Per fed token: the row of `last_ids` holding its value, or -1 (see StepInputs.feed)."""
        rows = np.full(length, -1, dtype=np.int32)
        if step.feed:
            index, source = zip(*step.feed, strict=True)
            rows[list(index)] = source
        return rows

    def _slot_mapping(self, block_tables: Tensor, token_seq: Tensor, positions: Tensor) -> Tensor:
        pages = block_tables[token_seq, positions // self.page_size]
        return pages * self.page_size + positions % self.page_size

    def _prefill(self, step: StepInputs, every_token: bool = False) -> Tensor:
        """A step with at least one multi-token chunk: packed varlen batch, run eagerly."""
        num_seqs = len(step.seq_slots)
        num_tokens = len(step.token_ids)
        query_lens = np.asarray(step.query_lens, dtype=np.int32)
        cu = np.zeros(num_seqs + 1, dtype=np.int32)
        np.cumsum(query_lens, out=cu[1:])
        sample_rows = np.asarray(step.sample_rows, dtype=np.int32)
        logits_rows = (
            np.arange(num_tokens, dtype=np.int32) if every_token else cu[1:][sample_rows] - 1
        )
        token_ids, positions, token_seq, cu_q, seq_lens, slots, logits_idx, sources = self._pack(
            [
                np.asarray(step.token_ids, dtype=np.int32),
                np.asarray(step.positions, dtype=np.int32),
                np.repeat(np.arange(num_seqs, dtype=np.int32), query_lens),
                cu,
                np.asarray(step.seq_lens, dtype=np.int32),
                np.asarray(step.seq_slots, dtype=np.int32),
                logits_rows,
                self._source_rows(step, num_tokens if step.feed else 0),
            ]
        )
        if step.feed:
            token_ids = ops.feed_tokens(token_ids, sources, self.last_ids)
        block_tables = self.block_tables.index_select(0, slots)
        attn = AttentionMetadata(
            slot_mapping=self._slot_mapping(block_tables, token_seq, positions),
            seq_lens=seq_lens,
            block_tables=block_tables,
            cu_seqlens_q=cu_q,
            max_seqlen_q=int(query_lens.max()),
        )
        return self.model.forward(token_ids, positions, self.kv, attn, logits_idx)

    def _decode(self, step: StepInputs) -> tuple[Tensor, Tensor, _DecodeGraph | None]:
        """A step where every sequence feeds one token: returns (logits, greedy ids, and the
        graph that made them when its logits buffer holds exactly this step's rows)."""
        batch = len(step.seq_slots)
        if not self.use_cuda_graphs:
            dev = self._upload(
                np.stack(
                    [
                        np.asarray(step.token_ids, dtype=np.int32),
                        np.asarray(step.positions, dtype=np.int32),
                        np.asarray(step.seq_slots, dtype=np.int32),
                        self._source_rows(step, batch),
                    ]
                )
            )
            token_ids = ops.feed_tokens(dev[0], dev[3], self.last_ids) if step.feed else dev[0]
            logits = _decode_forward(self, token_ids, dev[1], dev[2])
            logits = logits.index_select(0, self._rows(step, batch))
            return logits, ops.argmax(logits), None
        bucket = next(b for b in self._buckets if b >= batch)
        graph = self._graphs.get(bucket)
        if graph is None:
            graph = self._graphs[bucket] = _DecodeGraph(self, bucket)
        host = graph.inputs_to_fill(batch)
        host[0, :batch] = step.token_ids
        host[1, :batch] = step.positions
        host[2, :batch] = step.seq_slots
        host[3, :batch] = self._source_rows(step, batch)
        logits, ids = graph.replay(batch)
        if len(step.sample_rows) != batch:
            rows = self._rows(step, batch)
            return logits.index_select(0, rows), ids.index_select(0, rows), None
        return logits, ids, graph

    def _rows(self, step: StepInputs, batch: int) -> Tensor:
        if len(step.sample_rows) == batch:
            return torch.arange(batch, device=self.device)
        return self._upload(np.asarray(step.sample_rows, dtype=np.int64))

    def _sample(self, logits: Tensor, sampling: SamplingRows) -> Tensor:
        floats = self._upload(np.asarray([sampling.temperature, sampling.top_p], dtype=np.float32))
        ints = self._upload(
            np.asarray([sampling.top_k, sampling.seeds, sampling.steps], dtype=np.int64)
        )
        return ops.sample(
            logits,
            floats[0],
            ints[0].int(),
            floats[1],
            ints[1],
            ints[2],
            any_top_k=sampling.any_top_k(),
            any_top_p=sampling.any_top_p(),
        )


def _decode_forward(
    runner: ModelRunner, token_ids: Tensor, positions: Tensor, slots: Tensor
) -> Tensor:
    """The decode forward pass on device tensors only (what a CUDA graph captures)."""
    block_tables, slot_mapping, seq_lens = ops.decode_metadata(
        runner.block_tables, slots, positions, runner.page_size
    )
    attn = AttentionMetadata(
        slot_mapping=slot_mapping, seq_lens=seq_lens, block_tables=block_tables
    )
    return runner.model.forward(token_ids, positions, runner.kv, attn)


class PendingTokens:
    """The sampled ids of a launched step, on their way to the host: `result()` waits for them.

    On CUDA the ids are copied into pinned memory behind the step, and an event marks the copy's
    end; on the CPU the step has already run."""

    def __init__(self, ids: Tensor) -> None:
        self._ready: torch.cuda.Event | None = None
        if ids.is_cuda:
            self._host = torch.empty(ids.shape, dtype=ids.dtype, pin_memory=True)
            self._host.copy_(ids, non_blocking=True)
            self._ready = torch.cuda.Event()  # type: ignore[no-untyped-call]
            self._ready.record()
        else:
            self._host = ids

    def result(self) -> list[int]:
        if self._ready is not None:
            self._ready.synchronize()
        ids: list[int] = self._host.tolist()
        return ids


class _GraphInputs:
    """The inputs of a captured graph: pinned host buffers, and their device twins that the
    graph reads, refreshed by one asynchronous copy each before every replay. With a step in
    flight that copy may still be queued behind it, so `to_fill` waits for it to finish before
    handing the host buffers out to be written again."""

    def __init__(self, hosts: Sequence[Tensor], device: torch.device) -> None:
        self.host = [host.pin_memory() for host in hosts]
        self.dev = [host.to(device) for host in self.host]
        self._copied = torch.cuda.Event()  # type: ignore[no-untyped-call]

    def to_fill(self) -> list[np.ndarray]:
        """The host buffers (as numpy views of the same pinned memory), safe to write."""
        self._copied.synchronize()
        return [host.numpy() for host in self.host]

    def upload(self) -> None:
        for dev, host in zip(self.dev, self.host, strict=True):
            dev.copy_(host, non_blocking=True)
        self._copied.record()


class _DecodeGraph:
    """A decode step at a fixed batch size, captured once and replayed.

    Inputs, one row each: token ids, positions, scheduler slots, and the `last_ids` row of each
    token still on the device (-1: the token id row holds it); see `StepInputs.feed`."""

    def __init__(self, runner: ModelRunner, batch: int) -> None:
        self.batch = batch
        self.runner = runner
        self.inputs = _GraphInputs([torch.zeros((4, batch), dtype=torch.int32)], runner.device)
        self.inputs_to_fill(0)  # every row padding
        self.inputs.upload()
        # Decode graphs share one memory pool: they never run at the same time.
        self.graph, (self.logits, self.ids) = graphs.capture(
            self._run, warmups=2, pool=runner._graph_pool
        )
        runner._graph_pool = self.graph.pool()
        self._samplers: dict[tuple[bool, bool], _SampleGraph] = {}

    def _run(self) -> tuple[Tensor, Tensor]:
        d = self.inputs.dev[0]
        token_ids = ops.feed_tokens(d[0], d[3], self.runner.last_ids)
        logits = _decode_forward(self.runner, token_ids, d[1], d[2])
        return logits, ops.argmax(logits)

    def inputs_to_fill(self, batch: int) -> np.ndarray:
        """The pinned input rows for a replay of `batch` sequences: columns from `batch` on are
        set to padding (token 0 at position 0 of the scratch slot, which writes only the scratch
        page); the caller fills the first `batch`."""
        host = self.inputs.to_fill()[0]
        host[0, batch:] = 0
        host[1, batch:] = 0
        host[2, batch:] = self.runner.scratch_slot
        host[3, batch:] = -1
        return host

    def sample(self, batch: int, sampling: SamplingRows) -> Tensor:
        """Sample the rows of the last replay's logits, through a captured sampling graph (one
        per combination of filters in use, captured on first need)."""
        key = (sampling.any_top_k(), sampling.any_top_p())
        sampler = self._samplers.get(key)
        if sampler is None:
            sampler = self._samplers[key] = _SampleGraph(self.logits, *key)
        return sampler.replay(batch, sampling)

    def replay(self, batch: int) -> tuple[Tensor, Tensor]:
        """Run the graph on the inputs filled since `inputs_to_fill(batch)`."""
        self.inputs.upload()
        self.graph.replay()
        return self.logits[:batch], self.ids[:batch]


class _SampleGraph:
    """`ops.sample` over a decode graph's logits buffer, captured once and replayed.

    With top-k / top-p the sampler is 19 small kernels (2 without); launched from Python they
    cost more host time than GPU time (0.7 ms a step at batch 1 on the H200 host, 2026-11-30).
    The per-row parameters live in pinned host buffers copied in before each replay; padding
    rows of the bucket sample greedily. `any_top_k` / `any_top_p` are fixed per graph, since
    they decide which kernels exist in it. Its own memory pool: its scratch must not alias the
    decode graphs' buffers, whose logits it reads.
    """

    def __init__(self, logits: Tensor, any_top_k: bool, any_top_p: bool) -> None:
        bucket = logits.shape[0]
        self.inputs = _GraphInputs(
            [
                torch.zeros((2, bucket), dtype=torch.float32),  # temperature, top_p
                torch.zeros((bucket,), dtype=torch.int32),  # top_k
                torch.zeros((2, bucket), dtype=torch.int64),  # seeds, steps
            ],
            logits.device,
        )
        self._fill(0, None)  # every row padding
        self.inputs.upload()
        floats, top_k, ints = self.inputs.dev

        def draw() -> Tensor:
            return ops.sample(
                logits,
                floats[0],
                top_k,
                floats[1],
                ints[0],
                ints[1],
                any_top_k=any_top_k,
                any_top_p=any_top_p,
            )

        self.graph, self.ids = graphs.capture(draw)

    def _fill(self, batch: int, sampling: SamplingRows | None) -> None:
        """The first `batch` rows from `sampling`; the rest greedy (temperature 0, no filters)."""
        floats, top_k, ints = self.inputs.to_fill()
        if sampling is not None:
            floats[0, :batch] = sampling.temperature
            floats[1, :batch] = sampling.top_p
            top_k[:batch] = sampling.top_k
            ints[0, :batch] = sampling.seeds
            ints[1, :batch] = sampling.steps
        floats[0, batch:] = 0.0
        floats[1, batch:] = 1.0
        top_k[batch:] = 0
        ints[:, batch:] = 0

    def replay(self, batch: int, sampling: SamplingRows) -> Tensor:
        self._fill(batch, sampling)
        self.inputs.upload()
        self.graph.replay()
        return self.ids[:batch]
