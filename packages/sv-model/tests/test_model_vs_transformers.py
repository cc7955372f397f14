"""The model runner against transformers' LlamaForCausalLM on the same weights (the oracle).

Teacher-forced logits: feed a token sequence, compare the logits at every position we ask for.
FP32 on the CPU must agree tightly (relative error <= 1e-4).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers
from sv_model import ModelRunner, ModelWeights, StepInputs, step_packing, warmup
from sv_weights import ModelConfig, load_checkpoint

PAGE = 16


def make_runner(model_dir: Path, num_pages: int = 256, **kwargs: object) -> ModelRunner:
    config = ModelConfig.from_model_dir(model_dir)
    weights = ModelWeights.from_state_dict(config, load_checkpoint(model_dir), "cpu", torch.float32)
    return ModelRunner(config, weights, num_pages=num_pages, **kwargs)  # type: ignore[arg-type]


def hf_logits(model_dir: Path, ids: list[int]) -> torch.Tensor:
    model = transformers.LlamaForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0]


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


class Pages:
    """Hands out distinct, deliberately shuffled pages (block tables need not be contiguous)."""

    def __init__(self, num_pages: int, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.free = torch.randperm(num_pages, generator=g).tolist()

    def take(self, tokens: int) -> list[int]:
        n = -(-tokens // PAGE)
        out, self.free = self.free[:n], self.free[n:]
        return out


def prefill(runner: ModelRunner, seqs: list[list[int]], table_rows: list[int]) -> torch.Tensor:
    """One packed prefill step of whole sequences; logits at each sequence's last token."""
    tokens = [t for s in seqs for t in s]
    positions = [p for s in seqs for p in range(len(s))]
    lens = [len(s) for s in seqs]
    step = StepInputs(tokens, positions, table_rows, lens, lens, list(range(len(seqs))))
    return runner.logits(step)


def test_packed_prefill_matches_transformers(tiny_dir: Path) -> None:
    runner = make_runner(tiny_dir)
    pages = Pages(runner.num_pages)
    g = torch.Generator().manual_seed(1)
    seqs = [torch.randint(0, 512, (n,), generator=g).tolist() for n in (1, 17, 40, 16)]
    runner.set_block_tables([(i, pages.take(len(s))) for i, s in enumerate(seqs)])
    ours = prefill(runner, seqs, [0, 1, 2, 3])
    for i, s in enumerate(seqs):
        assert rel(ours[i], hf_logits(tiny_dir, s)[-1]) < 1e-4


def test_every_position_teacher_forced(untied_dir: Path) -> None:
    """All positions' logits of one sequence (untied LM head, no RoPE scaling, head_dim 32)."""
    runner = make_runner(untied_dir)
    ids = torch.randint(0, 512, (50,), generator=torch.Generator().manual_seed(2)).tolist()
    runner.set_block_tables([(0, Pages(runner.num_pages).take(50))])
    step = StepInputs(ids, list(range(50)), [0], [50], [50], [0])
    assert rel(runner.logits(step, every_token=True), hf_logits(untied_dir, ids)) < 1e-4


def test_decode_steps_match_transformers(tiny_dir: Path) -> None:
    """Prefill two prompts, then decode several steps as one batch; each step's logits agree with
    the oracle run on the whole sequence so far."""
    runner = make_runner(tiny_dir)
    pages = Pages(runner.num_pages, seed=3)
    g = torch.Generator().manual_seed(4)
    seqs = [torch.randint(0, 512, (n,), generator=g).tolist() for n in (14, 31)]
    tables = [pages.take(len(s) + 8) for s in seqs]
    runner.set_block_tables(list(enumerate(tables)))
    logits = prefill(runner, seqs, [0, 1])
    for _ in range(6):
        nxt = logits.argmax(-1).tolist()
        for s, t in zip(seqs, nxt, strict=True):
            s.append(t)
        n = [len(s) for s in seqs]
        step = StepInputs(nxt, [x - 1 for x in n], [0, 1], [1, 1], n, [0, 1])
        logits = runner.logits(step)
        for i, s in enumerate(seqs):
            assert rel(logits[i], hf_logits(tiny_dir, s)[-1]) < 1e-4


@pytest.mark.slow
def test_chunked_prefill_past_8192_positions(tiny_dir: Path) -> None:
    """A 8,400-token sequence prefilled in 2,048-token chunks (each attending to the cached
    prefix), compared at each chunk's last position: covers positions beyond the 8,192-token
    original context where llama3 RoPE scaling matters."""
    runner = make_runner(tiny_dir, num_pages=600, max_model_len=9000)
    n = 8400
    ids = torch.randint(0, 512, (n,), generator=torch.Generator().manual_seed(5)).tolist()
    runner.set_block_tables([(0, Pages(runner.num_pages, seed=6).take(n))])
    oracle = hf_logits(tiny_dir, ids)
    for start in range(0, n, 2048):
        end = min(n, start + 2048)
        step = StepInputs(ids[start:end], list(range(start, end)), [0], [end - start], [end], [0])
        ours = runner.logits(step)
        assert rel(ours[0], oracle[end - 1]) < 1e-4, f"chunk ending at {end}"


def test_greedy_generation_matches_transformers(tiny_dir: Path) -> None:
    """Greedy tokens in FP32 equal transformers' generate()."""
    runner = make_runner(tiny_dir)
    prompt = torch.randint(0, 512, (23,), generator=torch.Generator().manual_seed(7)).tolist()
    runner.set_block_tables([(0, Pages(runner.num_pages).take(23 + 20))])
    seq = list(prompt)
    out = runner.execute(StepInputs(seq, list(range(23)), [0], [23], [23], [0]))
    seq.append(out[0])
    for _ in range(19):
        n = len(seq)
        seq.append(runner.execute(StepInputs([seq[-1]], [n - 1], [0], [1], [n], [0]))[0])
    model = transformers.LlamaForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32).eval()
    expected = model.generate(
        torch.tensor([prompt]),
        max_new_tokens=20,
        do_sample=False,
        eos_token_id=None,
        pad_token_id=0,
    )[0].tolist()
    assert seq == expected


def test_batch_composition_does_not_change_logits(tiny_dir: Path) -> None:
    """A sequence's logits alone and inside a batch agree within tolerance (not bitwise: the
    matmul reduction order may depend on the batch shape)."""
    runner = make_runner(tiny_dir)
    pages = Pages(runner.num_pages, seed=8)
    g = torch.Generator().manual_seed(9)
    seqs = [torch.randint(0, 512, (n,), generator=g).tolist() for n in (9, 33, 20)]
    runner.set_block_tables([(i, pages.take(len(s))) for i, s in enumerate(seqs)])
    together = prefill(runner, seqs, [0, 1, 2])
    for i, s in enumerate(seqs):
        alone = prefill(runner, [s], [i])
        assert rel(together[i], alone[0]) < 1e-5


def test_warmup_reports_its_phases_and_touches_only_the_scratch_page(tiny_dir: Path) -> None:
    """Warm-up (run on the CPU here: the same prefills, no graphs or tuning) tells its caller
    what it is doing, and writes the KV cache only through the scratch table row's page."""
    runner = make_runner(tiny_dir, num_pages=64)
    heard: list[str] = []
    runner.warmup(max_prefill_tokens=64, progress=heard.append)
    steps = len(warmup.warmup_steps(64, runner.scratch_table_row, runner.max_num_seqs))
    lengths = len(warmup.prompt_lengths(64))
    assert heard[0].startswith(
        f"warm-up on cpu: compiling kernels in {steps} prompt steps ({lengths} prompt lengths"
    ), heard
    assert heard[-1].startswith("warm-up done in ") and len(heard) == 2, heard
    assert runner.kv.k[:, runner.scratch_page].abs().sum() > 0  # the prefills did run
    assert not runner.kv.k[:, : runner.num_pages].any() and not runner.kv.v[:, :64].any()


def test_warmup_lengths_reach_every_compile_variant_of_a_single_prompt() -> None:
    """Every prompt of 1 to 8,192 tokens, alone in a step, compiles nothing the warm-up did
    not: some warm-up length has the same prefill query tile (the next power of two, 16 to
    128), the same kind of integer (1, a multiple of 16, neither) and the same RoPE tokens per
    program (Llama 3.2 1B's 3 program groups per token tile on 132 SMs)."""
    from sv_kernels.triton_ops.rope_cache import choose_tile_tokens

    def variant(n: int) -> tuple[int, str, int]:
        tile = min(128, max(16, 1 << (n - 1).bit_length()))
        kind = "one" if n == 1 else "multiple of 16" if n % 16 == 0 else "other"
        return tile, kind, choose_tile_tokens(n, 3, 132)

    for largest in (8192, 3000, 64):
        lengths = warmup.prompt_lengths(largest)
        assert max(lengths) == largest and min(lengths) >= 1
        covered = {variant(n) for n in lengths}
        missed = [n for n in range(1, largest + 1) if variant(n) not in covered]
        assert not missed, f"up to {largest}: lengths {missed[:5]}... compile after warm-up"


def test_warmup_sampling_counts_reach_every_row_band_in_both_kinds() -> None:
    """A prompt step's sampled rows (1 to max_num_seqs) run the final norm, the LM head and the
    sampler at that count: every count compiles nothing the warm-up did not, by the row bands
    the kernels switch at (a matmul plan's, the 8-bit matmul's tiles) and the kind of integer."""
    from sv_kernels.linear_plan import FEW_ROWS, MANY_ROWS
    from sv_kernels.triton_ops.w8a16 import TILES

    thresholds = sorted({FEW_ROWS, MANY_ROWS, *(most for most, _ in TILES)})

    def variant(n: int) -> tuple[int, str]:
        band = sum(n > t for t in thresholds)
        return band, "one" if n == 1 else "multiple of 16" if n % 16 == 0 else "other"

    for max_num_seqs in (256, 100, 512, 3):
        counts = warmup.sampling_counts(max_num_seqs)
        assert max(counts) == max_num_seqs
        covered = {variant(n) for n in [1, *counts]}  # one row: the single-prompt steps
        missed = [n for n in range(1, max_num_seqs + 1) if variant(n) not in covered]
        assert not missed, f"up to {max_num_seqs}: counts {missed[:5]}... compile after warm-up"


def test_a_step_of_short_chunks_runs_as_decode_rows_and_matches_transformers(
    tiny_dir: Path,
) -> None:
    """One step of a decoding sequence, a verify run (newest token + 4 drafts, a choice at
    each) and a prompt's 7-token tail runs as decode rows, its choices first in the step's
    order; each choice's logits agree with the oracle at that position."""
    runner = make_runner(tiny_dir)
    pages = Pages(runner.num_pages, seed=10)
    g = torch.Generator().manual_seed(11)
    seqs = [torch.randint(0, 512, (n,), generator=g).tolist() for n in (30, 41, 45)]
    runner.set_block_tables([(i, pages.take(len(s))) for i, s in enumerate(seqs)])
    heads = [s[:-1] if i < 2 else s[:-7] for i, s in enumerate(seqs)]
    heads[1] = seqs[1][:-5]
    prefill(runner, heads, [0, 1, 2])
    # Tokens: seq 2's tail (no choice until its last), seq 0's one token, seq 1's run of 5.
    tail, run = seqs[2][-7:], seqs[1][-5:]
    token_ids = [*tail, seqs[0][-1], *run]
    positions = [*range(38, 45), 29, *range(36, 41)]
    # Choices as the engine orders them: each sequence's own first, then the draft positions.
    logits_at = [6, 7, 8, 9, 10, 11, 12]
    step = StepInputs(
        token_ids, positions, [2, 0, 1], [7, 1, 5], [45, 30, 41], [0, 1, 2], logits_at=logits_at
    )
    rows = step_packing.decode_rows(step, runner.max_num_seqs)
    assert rows is not None and rows.num_choices == 7
    ours = runner.logits(step)
    expected = [hf_logits(tiny_dir, seqs[2])[-1], hf_logits(tiny_dir, seqs[0])[-1]]
    expected += list(hf_logits(tiny_dir, seqs[1])[36:41])
    assert ours.shape[0] == len(expected)
    for i, want in enumerate(expected):
        assert rel(ours[i], want) < 1e-4, f"choice {i}"


def test_a_chunk_longer_than_the_decode_rows_limit_runs_packed() -> None:
    def step(chunk: int) -> StepInputs:
        return StepInputs(
            list(range(chunk + 1)), [*range(chunk), 5], [0, 1], [chunk, 1], [chunk, 6], [0, 1]
        )

    assert step_packing.decode_rows(step(step_packing.DECODE_ROWS_MAX_CHUNK), 256) is not None
    assert step_packing.decode_rows(step(step_packing.DECODE_ROWS_MAX_CHUNK + 1), 256) is None
    assert step_packing.decode_rows(step(8), 8) is None  # 9 tokens: more than the largest graph


def test_decode_tail_length_counts_the_last_one_token_sequences() -> None:
    import numpy as np

    for query_lens, expected in [
        ([40, 1, 1], 2),
        ([1, 40, 1], 1),
        ([40, 17], 0),
        ([1, 1, 1], 3),
        ([1, 1, 40], 0),
    ]:
        assert step_packing.decode_tail_length(np.array(query_lens)) == expected, query_lens


def test_a_mixed_step_s_decodes_are_its_decode_tail_and_match_transformers(
    tiny_dir: Path,
) -> None:
    """A step of a prompt chunk followed by two decodes runs packed, names the decodes as its
    tail (the CPU ops check the tail against the batch: one token each, their own lengths and
    pages) and gives every sequence the oracle's logits."""
    runner = make_runner(tiny_dir)
    pages = Pages(runner.num_pages, seed=12)
    g = torch.Generator().manual_seed(13)
    seqs = [torch.randint(0, 512, (n,), generator=g).tolist() for n in (37, 21, 30)]
    runner.set_block_tables([(i, pages.take(len(s))) for i, s in enumerate(seqs)])
    prefill(runner, [seqs[0][:-20], seqs[1][:-1], seqs[2][:-1]], [0, 1, 2])
    step = StepInputs(
        [*seqs[0][-20:], seqs[1][-1], seqs[2][-1]],
        [*range(17, 37), 20, 29],
        [0, 1, 2],
        [20, 1, 1],
        [37, 21, 30],
        [0, 1, 2],
    )
    assert step_packing.decode_rows(step, runner.max_num_seqs) is None  # a 20-token chunk
    packed = step_packing.pack_prefill(step, runner.block_tables, PAGE, runner.last_ids)
    tail = packed.attn.decode_tail
    assert tail is not None and tail.seq_lens.tolist() == [21, 30]
    assert torch.equal(tail.block_tables, packed.attn.block_tables[1:])
    ours = runner.logits(step)
    for i, s in enumerate(seqs):
        assert rel(ours[i], hf_logits(tiny_dir, s)[-1]) < 1e-4, f"sequence {i}"


def test_prompt_graphs_take_one_sequence_s_chunk_and_nothing_else() -> None:
    """Which steps a prompt graph runs (on CUDA): one sequence's chunk longer than a decode-row
    chunk and within the largest bucket, with no prompt log-probabilities, no token still on
    the device and at most its own choice."""
    from sv_model import prompt_graphs

    def step(n: int, **kwargs: object) -> StepInputs:
        return StepInputs(list(range(n)), list(range(n)), [0], [n], [n], [0], **kwargs)  # type: ignore[arg-type]

    largest = prompt_graphs.BUCKETS[-1]
    assert prompt_graphs.graph_tokens(step(step_packing.DECODE_ROWS_MAX_CHUNK + 1)) == 17
    assert prompt_graphs.graph_tokens(step(largest)) == largest
    assert (
        prompt_graphs.graph_tokens(StepInputs([1] * 40, list(range(40)), [0], [40], [90], [])) == 40
    )
    for refused in (
        step(step_packing.DECODE_ROWS_MAX_CHUNK),  # decode rows
        step(largest + 1),
        StepInputs([1] * 40, [*range(20), *range(20)], [0, 1], [20, 20], [20, 20], [0, 1]),
        step(100, feed=[(99, 0)]),
        step(100, prompt_logprobs=[(0, 0, [1])]),
        step(100, logits_at=[99]),
    ):
        assert prompt_graphs.graph_tokens(refused) is None, refused
