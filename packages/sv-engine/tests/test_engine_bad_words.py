"""vLLM's bad_words through the engine on the CPU: greedy output with a one-token and a
two-token word taken from the unconstrained greedy output never holds them, and equals
transformers' greedy `generate(bad_words_ids=...)` given the same token ids (its
NoBadWordsLogitsProcessor is the oracle). transformers matches a word against the prompt
too, vLLM only against the output: the words here never start with the prompt's last token,
so the two agree. The overlapped loop (the default) decides a two-token word's ban on the
device, the token before it still pending there; the test checks that it did."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import transformers
from speculation_testing import completions, engine_like, pattern
from sv_engine import Engine, SamplingParams
from sv_engine import engine as engine_module
from sv_engine import step_inputs as step_inputs_module
from sv_engine.bad_words import word_ids
from sv_scheduler import SpeculationConfig

PROMPT = "Write a haiku about the sea."
N = 12


@pytest.fixture(scope="module")
def engine(tiny_llama_dir: Path) -> Engine:
    return Engine.from_model_dir(tiny_llama_dir, device="cpu", kv_cache_mib=64)


@pytest.fixture(scope="module")
def vocab16(tiny_vocab_dir: Path) -> Engine:
    return Engine.from_model_dir(tiny_vocab_dir, device="cpu", kv_cache_mib=1, max_num_seqs=4)


@pytest.fixture(scope="module")
def oracle(tiny_llama_dir: Path) -> transformers.LlamaForCausalLM:
    return transformers.LlamaForCausalLM.from_pretrained(tiny_llama_dir, dtype=torch.float32).eval()


def hf_greedy(
    model: transformers.LlamaForCausalLM, prompt_ids: list[int], bad: list[list[int]]
) -> list[int]:
    out = model.generate(
        torch.tensor([prompt_ids]),
        max_new_tokens=N,
        min_new_tokens=N,
        do_sample=False,
        pad_token_id=0,
        eos_token_id=None,
        bad_words_ids=bad,
    )
    return out[0, len(prompt_ids) :].tolist()  # type: ignore[no-any-return]


def _word(engine: Engine, ids: list[int], not_first: int) -> tuple[str, list[list[int]]] | None:
    """The text of `ids` as a bad word, and its token ids as the engine makes them, if those
    include `ids` themselves and none starts with `not_first` (the prompt's last token)."""
    text = engine.tokenizer.decode(ids)
    if not text.strip():
        return None
    found = [list(w) for w in word_ids(engine.tokenizer.encode, [text])]
    if ids not in found or any(w[0] == not_first for w in found):
        return None
    return text, found


def _words(
    engine: Engine, prompt_ids: list[int], plain: list[int], size: int
) -> tuple[str, list[list[int]]]:
    """A `size`-token run of the greedy output usable as a bad word (the earliest)."""
    for at in range(len(plain) - size + 1):
        found = _word(engine, plain[at : at + size], prompt_ids[-1])
        if found is not None:
            return found
    pytest.fail(f"no {size}-token run of {plain} makes a bad word")


def _contains(ids: list[int], word: list[int]) -> bool:
    return any(ids[i : i + len(word)] == word for i in range(len(ids) - len(word) + 1))


@pytest.mark.parametrize("size", [1, 2])
@pytest.mark.parametrize("overlap", [True, False])
def test_greedy_avoids_the_word_as_transformers_does(
    engine: Engine,
    oracle: transformers.LlamaForCausalLM,
    monkeypatch: pytest.MonkeyPatch,
    size: int,
    overlap: bool,
) -> None:
    plain = engine.generate([PROMPT], SamplingParams(max_new_tokens=N, ignore_eos=True))[0]
    text, ids = _words(engine, plain.prompt_ids, plain.output_ids, size)
    assert _contains(plain.output_ids, ids[0]) or _contains(plain.output_ids, ids[-1])

    pending_bans: list[Any] = []
    step_controls = step_inputs_module.step_controls

    def spy(*args: Any) -> Any:
        controls = step_controls(*args)
        if controls is not None:
            pending_bans.extend(controls.pending_bans)
        return controls

    monkeypatch.setattr(step_inputs_module, "step_controls", spy)
    engine.overlap = overlap
    try:
        params = SamplingParams(max_new_tokens=N, ignore_eos=True, bad_words=[text])
        got = engine.generate([PROMPT], params)[0].output_ids
    finally:
        engine.overlap = True
    assert len(got) == N
    assert not any(_contains(got, w) for w in ids)
    assert got != plain.output_ids
    assert got == hf_greedy(oracle, plain.prompt_ids, ids)
    # A two-token word's ban waits on the token still on the device only when overlapped.
    assert bool(pending_bans) == (size == 2 and overlap)


def test_other_rows_of_a_batch_are_untouched(engine: Engine) -> None:
    """A batch with rows without controls: theirs are the plain tokens, the word's row its
    tokens alone."""
    plain = SamplingParams(max_new_tokens=N, ignore_eos=True)
    others = ["What is 2 + 2?", "Name three colours, please."]
    want = [c.output_ids for c in engine.generate(others, plain)]
    alone = engine.generate([PROMPT], plain)[0]
    text, _ = _words(engine, alone.prompt_ids, alone.output_ids, 2)
    banned = SamplingParams(max_new_tokens=N, ignore_eos=True, bad_words=[text])
    want.append(engine.generate([PROMPT], banned)[0].output_ids)
    assert want[-1] != alone.output_ids
    ids = [engine.add_request(p, plain) for p in others] + [engine.add_request(PROMPT, banned)]
    done: dict[int, list[int]] = {}
    while engine.has_unfinished():
        for e in engine.step():
            if e.completion is not None:
                done[e.request_id] = e.completion.output_ids
    assert [done[i] for i in ids] == want


@pytest.mark.parametrize("overlap", [True, False])
def test_speculation_gives_the_plain_output(
    vocab16: Engine, monkeypatch: pytest.MonkeyPatch, overlap: bool
) -> None:
    """A verify step's draft positions ban from the drafts before them: the tokens are those
    of the engine that never speculates, and drafts are still accepted. This model's 16
    tokens are no words, so the words are given as token ids (the string layer is tested
    above)."""
    base = vocab16
    prompt = pattern(5, 40)
    free = SamplingParams(max_new_tokens=40, ignore_eos=True)
    plain_out = completions(engine_like(base, None), [prompt], [free])[0].output_ids
    a, b = plain_out[10:12]  # a pair the repeating output makes, and prompt lookup drafts
    words = ((a, b),)
    monkeypatch.setattr(engine_module.bad_words, "word_ids", lambda encode, w: words)
    params = SamplingParams(max_new_tokens=40, ignore_eos=True, bad_words=["ab"])
    want = completions(engine_like(base, None, overlap=False), [prompt], [params])[0].output_ids
    assert want != plain_out
    assert not any(_contains(want, list(w)) for w in words)
    spec = engine_like(base, SpeculationConfig(), overlap=overlap)
    assert completions(spec, [prompt], [params])[0].output_ids == want
    assert spec.stats.accepted_tokens >= 3
