"""An FP8 (e4m3) KV pool: twice the pages of BF16 in the same memory (four times FP32's), and
on the real default model logits that stay close to transformers' FP32 ones, through prefill
and decode, with every page back at the end. A checkpoint calibrated for an FP8 KV cache: its
scales in the pool, checked against transformers with attention reading an FP8 cache of them."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import safetensors.torch
import torch
import transformers
from sv_engine import Engine, EngineError, SamplingParams
from sv_kernels.quantized import QuantizedWeight, dequantize
from sv_model import StepInputs
from sv_weights import ModelConfig
from sv_weights.synthetic import fp8_quantization_config, kv_cache_only_quantization_config
from torch import Tensor

TEXT = (
    "The river runs past the old mill, where the wheel has not turned for forty years. "
    "Children still come on summer evenings to throw stones into the millpond and count "
    "the rings. def add(a, b):\n    return a + b\n\nprint(add(2, 3))\n"
)


def test_an_fp8_pool_holds_four_times_the_fp32_pages(tiny_llama_dir: Path) -> None:
    config = ModelConfig.from_model_dir(tiny_llama_dir)
    fp8 = Engine.from_model_dir(tiny_llama_dir, device="cpu", kv_cache_mib=8, kv_cache_dtype="fp8")
    fp32 = Engine.from_model_dir(tiny_llama_dir, device="cpu", kv_cache_mib=8)
    # K and V, every layer and KV head, 16 tokens, one byte each.
    page_bytes = 2 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim * 16
    assert fp8.stats.pool_pages == 8 * 2**20 // page_bytes
    assert fp32.stats.pool_pages == 8 * 2**20 // (4 * page_bytes)
    assert fp8.runner.kv.k.dtype == torch.float8_e4m3fn
    with pytest.raises(EngineError, match="kv_cache_dtype must be one of auto, fp8"):
        Engine.from_model_dir(tiny_llama_dir, device="cpu", kv_cache_dtype="int4")  # type: ignore[arg-type]


def test_fp8_kv_logits_stay_close_to_transformers(default_model: Path) -> None:
    engine = Engine.from_model_dir(
        default_model, device="cpu", kv_cache_mib=16, kv_cache_dtype="fp8"
    )
    ids = engine.tokenizer.encode(TEXT)
    n = len(ids)
    runner = engine.runner
    runner.set_block_tables([(0, list(range(-(-n // 16))))])
    # Teacher-forced: the first half as one prefill chunk, then the rest one decode step each,
    # so that both attention paths read FP8 pages written by earlier steps.
    half = n // 2
    ours = [runner.logits(StepInputs(ids[:half], list(range(half)), [0], [half], [half], [0]))]
    for p in range(half, n):
        ours.append(runner.logits(StepInputs([ids[p]], [p], [0], [1], [p + 1], [0])))
    logits = torch.cat(ours)  # positions half-1 .. n-1
    model = transformers.LlamaForCausalLM.from_pretrained(default_model, dtype=torch.float32)
    with torch.no_grad():
        want = model(torch.tensor([ids])).logits[0, half - 1 :]
    kl = torch.nn.functional.kl_div(
        logits.log_softmax(-1), want.log_softmax(-1), log_target=True, reduction="none"
    ).sum(-1)
    agree = (logits.argmax(-1) == want.argmax(-1)).float().mean()
    print(f"fp8 KV vs FP32 transformers: mean KL {kl.mean():.4f}, top-1 agreement {agree:.3f}")
    assert kl.mean() < 0.02
    assert agree >= 0.9


def test_fp8_greedy_generation_frees_every_page(default_model: Path) -> None:
    engine = Engine.from_model_dir(
        default_model, device="cpu", kv_cache_mib=16, kv_cache_dtype="fp8"
    )
    done = engine.generate(
        ["Name three rivers.", "Count to five."], SamplingParams(max_new_tokens=12)
    )
    assert all(c.output_ids for c in done)
    assert engine.stats.free_pages == engine.stats.pool_pages


# --- a checkpoint's calibrated KV-cache scales (llm-compressor's kv_cache_scheme) --------------

E4M3 = torch.float8_e4m3fn


def fp8_weights(source: Path) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """`source`'s weights as compressed-tensors FP8 (per-channel scales, the LM head left as it
    is) and, by hand, the plain FP32 matrices those stand for (values times scales)."""
    fp8, plain = {}, {}
    for name, w in safetensors.torch.load_file(str(source / "model.safetensors")).items():
        if name.endswith("_proj.weight"):
            scale = w.float().abs().amax(dim=1, keepdim=True) / 448.0
            fp8[name] = (w.float() / scale).to(E4M3)
            fp8[name + "_scale"] = scale
            plain[name] = fp8[name].float() * scale
        else:
            fp8[name] = plain[name] = w
    return fp8, plain


def write_model(
    source: Path, folder: Path, state: dict[str, torch.Tensor], kv_cache_scheme: bool | None
) -> Path:
    """`state` written by the `safetensors` package, with `source`'s config and tokenizer;
    kv_cache_scheme None: no quantization_config (plain weights), else an FP8 one, with the
    kv_cache_scheme of llm-compressor's calibrated FP8 KV cache when True."""
    quantization_config = None
    if kv_cache_scheme is not None:
        quantization_config = fp8_quantization_config()
        if kv_cache_scheme:
            quantization_config["kv_cache_scheme"] = kv_cache_only_quantization_config()[
                "kv_cache_scheme"
            ]
    return write_model_with(source, folder, state, quantization_config)


def write_model_with(
    source: Path, folder: Path, state: dict[str, torch.Tensor], quantization_config: Any
) -> Path:
    """`state` written by the `safetensors` package, with `source`'s config and tokenizer and
    `quantization_config` (None: none)."""
    folder.mkdir()
    safetensors.torch.save_file(state, str(folder / "model.safetensors"))
    raw = json.loads((source / "config.json").read_text())
    if quantization_config is not None:
        raw["quantization_config"] = quantization_config
    (folder / "config.json").write_text(json.dumps(raw))
    shutil.copy(source / "tokenizer.json", folder / "tokenizer.json")
    return folder


def fp8_kv_attention(
    module: Any, query: Tensor, key: Tensor, value: Tensor, *args: Any, **kwargs: Any
) -> Any:
    """transformers' eager attention over K and V as an FP8 cache holds them: divided by the
    layer's scales (`module.kv_scales`, set by `transformers_run`), e4m3, multiplied back."""
    from transformers.models.llama.modeling_llama import eager_attention_forward

    k_scale, v_scale = module.kv_scales
    key = (key / k_scale).to(E4M3).float() * k_scale
    value = (value / v_scale).to(E4M3).float() * v_scale
    return eager_attention_forward(module, query, key, value, *args, **kwargs)


def transformers_run(
    plain_dir: Path, ids: list[int], scales: Tensor | None = None
) -> tuple[Tensor, list[Tensor]]:
    """transformers' FP32 logits of `ids` and each layer's K (after RoPE) and V as its cache
    holds them, [2, T, Hkv, D]; with `scales` [layers, 2], attention reads K and V through an
    FP8 cache of those scales (`fp8_kv_attention`)."""
    # Imported here, not at the top: transformers' modeling code imports torch._dynamo, which
    # imports triton, and at collection that comes before sv-kernels' conftest can put triton
    # in interpreter mode (its CPU tests then fail in the same process).
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    AttentionInterface.register("fp8_kv_test", fp8_kv_attention)
    AttentionMaskInterface.register("fp8_kv_test", eager_mask)
    model = transformers.LlamaForCausalLM.from_pretrained(
        plain_dir,
        dtype=torch.float32,
        attn_implementation="eager" if scales is None else "fp8_kv_test",
    )
    if scales is not None:
        for layer, layer_scales in zip(model.model.layers, scales, strict=True):
            layer.self_attn.kv_scales = layer_scales.tolist()
    with torch.no_grad():
        out = model(torch.tensor([ids]), use_cache=True)
    layers = out.past_key_values.layers
    return out.logits[0], [torch.stack([c.keys[0], c.values[0]]).transpose(1, 2) for c in layers]


@dataclass
class ScaledCheckpoint:
    scaled_dir: Path  # FP8 weights, a kv_cache_scheme and each layer's k_scale / v_scale
    unscaled_dir: Path  # the same weights, no KV-cache scales
    ids: list[int]
    scales: Tensor  # the file's scales, [layers, 2]
    logits: Tensor  # transformers' FP32 logits of ids on the plain weights
    fp8_logits: Tensor  # and through an FP8 cache of the file's scales
    fp8_kv: list[Tensor]  # and its K and V of each layer then, [2, T, Hkv, D]
    plain_dir: Path  # the values the FP8 weights stand for, as plain FP32 weights
    kv_only_dir: Path  # those plain weights, a KV-cache-only quantization_config, the scales


@pytest.fixture(scope="module")
def scaled_checkpoint(
    tiny_llama_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> ScaledCheckpoint:
    """The tiny Llama as an FP8 checkpoint with a calibrated KV cache: each layer's scales are
    its K's and V's absmax on the test prompt over 400 (well away from 1, which would hide
    them; below e4m3's 448, so nothing saturates)."""
    tmp = tmp_path_factory.mktemp("kv-scales")
    fp8, plain = fp8_weights(tiny_llama_dir)
    plain_dir = write_model(tiny_llama_dir, tmp / "plain", plain, None)
    ids = torch.randint(0, 128000, (40,), generator=torch.Generator().manual_seed(3)).tolist()
    logits, kv = transformers_run(plain_dir, ids)
    tensors = {}
    for layer, k_v in enumerate(kv):
        k_scale, v_scale = (k_v.abs().amax(dim=(1, 2, 3)) / 400).tolist()
        tensors[f"model.layers.{layer}.self_attn.k_scale"] = torch.tensor([k_scale])
        tensors[f"model.layers.{layer}.self_attn.v_scale"] = torch.tensor([v_scale])
    scales = torch.cat(list(tensors.values())).view(len(kv), 2)
    fp8_logits, fp8_kv = transformers_run(plain_dir, ids, scales)
    return ScaledCheckpoint(
        write_model(tiny_llama_dir, tmp / "fp8-kv", fp8 | tensors, True),
        write_model(tiny_llama_dir, tmp / "fp8", fp8, False),
        ids,
        scales,
        logits,
        fp8_logits,
        fp8_kv,
        plain_dir,
        write_model_with(
            tiny_llama_dir, tmp / "kv-only", plain | tensors, kv_cache_only_quantization_config()
        ),
    )


def teacher_forced(engine: Engine, ids: list[int], cut: int | None = None) -> Tensor:
    """Every position's logits of `ids` on pages 0, 1, 2, ...: one prefill of the first `cut`
    tokens (all by default), then the rest one decode step each, so that both attention paths
    read pages written by earlier steps."""
    n = len(ids)
    cut = n if cut is None else cut
    runner = engine.runner
    runner.set_block_tables([(0, list(range(-(-n // 16))))])
    chunk = StepInputs(ids[:cut], list(range(cut)), [0], [cut], [cut], [0])
    logits = [runner.logits(chunk, every_token=True)]
    for p in range(cut, n):
        logits.append(runner.logits(StepInputs([ids[p]], [p], [0], [1], [p + 1], [0])))
    return torch.cat(logits)


@pytest.mark.parametrize("weights", ["fp8", "kv-cache-only"])
def test_an_fp8_pool_uses_the_checkpoint_kv_scales(
    scaled_checkpoint: ScaledCheckpoint, weights: str
) -> None:
    """With an FP8 cache the pool's scales are the file's, every KV head of a layer its
    layer's, whether the weights are FP8 too or plain (a KV-cache-only calibration). The
    pages then hold K (after RoPE) and V divided by them, in e4m3: those of transformers on
    the plain weights with attention reading such an FP8 cache, by hand; the logits are that
    run's, and close to transformers' FP32 ones."""
    c = scaled_checkpoint
    folder = c.scaled_dir if weights == "fp8" else c.kv_only_dir
    engine = Engine.from_model_dir(folder, device="cpu", kv_cache_mib=4, kv_cache_dtype="fp8")
    kv = engine.runner.kv
    assert kv.scales is not None
    heads = kv.scales.shape[2]
    assert torch.equal(kv.scales, c.scales[:, :, None].expand(-1, -1, heads))
    n = len(c.ids)
    logits = teacher_forced(engine, c.ids, cut=n // 2)
    for layer, want in enumerate(c.fp8_kv):
        pages = torch.stack([kv.k[layer], kv.v[layer]]).flatten(1, 2)[:, :n]  # [2, T, Hkv, D]
        by_hand = (want / c.scales[layer][:, None, None, None]).to(E4M3)  # quantize_kv's rule
        same = pages.view(torch.uint8) == by_hand.view(torch.uint8)
        # FP32 rounding may move a value across an e4m3 rounding boundary (here none did):
        # by one e4m3 step (an eighth of the value) at most.
        assert same.float().mean() > 0.99, (layer, float(same.float().mean()))
        assert torch.allclose(pages.float(), by_hand.float(), rtol=0.13, atol=2**-9)
    assert float((logits - c.fp8_logits).norm() / c.fp8_logits.norm()) < 1e-4
    err = float((logits - c.logits).norm() / c.logits.norm())
    print(f"fp8 KV with the checkpoint's scales vs FP32 transformers: relative error {err:.4f}")
    assert err < 0.03
    assert (logits.argmax(-1) == c.logits.argmax(-1)).float().mean() >= 0.9


@pytest.mark.parametrize("weights", ["fp8", "kv-cache-only"])
def test_a_plain_cache_ignores_the_kv_scales(
    scaled_checkpoint: ScaledCheckpoint, weights: str
) -> None:
    """With the default (FP32) cache the scales are not needed: the checkpoint loads, and its
    logits are those of the same weights without scales, exactly."""
    c = scaled_checkpoint
    folder, unscaled = (
        (c.scaled_dir, c.unscaled_dir) if weights == "fp8" else (c.kv_only_dir, c.plain_dir)
    )
    scaled = Engine.from_model_dir(folder, device="cpu", kv_cache_mib=4)
    assert scaled.runner.kv.scales is None and scaled.runner.kv.k.dtype == torch.float32
    plain = Engine.from_model_dir(unscaled, device="cpu", kv_cache_mib=4)
    assert torch.equal(teacher_forced(scaled, c.ids), teacher_forced(plain, c.ids))


def test_two_tensor_parallel_ranks_use_the_kv_scales(scaled_checkpoint: ScaledCheckpoint) -> None:
    """TP=2 (gloo, this process rank 0): each rank's pool holds half the KV heads, each with
    its layer's scale from the file; the logits are still those of transformers through an
    FP8 cache of those scales (rank 1 with scales of 1 would miss them: its heads' K and V
    would round differently)."""
    from sv_engine.rank_steps import LeaderRunner

    c = scaled_checkpoint
    tp2 = Engine.from_model_dir(
        c.scaled_dir, device="cpu", kv_cache_mib=2, kv_cache_dtype="fp8", tensor_parallel_size=2
    )
    runner = tp2.runner
    assert isinstance(runner, LeaderRunner)
    try:
        kv = runner.kv
        assert kv.scales is not None and kv.scales.shape[2] == 1  # of the model's 2 KV heads
        assert torch.equal(kv.scales, c.scales[:, :, None])
        logits = teacher_forced(tp2, c.ids, cut=len(c.ids) // 2)
        assert float((logits - c.fp8_logits).norm() / c.fp8_logits.norm()) < 1e-4
    finally:
        runner.close()


def _matrices(engine: Engine) -> list[Any]:
    weights = engine.runner.model.weights
    return [weights.lm_head] + [m for layer in weights.layers for m in vars(layer).values()]


def test_a_kv_cache_only_checkpoint_loads_its_weights_plain(
    scaled_checkpoint: ScaledCheckpoint,
) -> None:
    """A KV-cache-only calibration quantizes no weight: `--quantization auto` treats it as a
    plain checkpoint (int8 on the CPU), and unquantized the model's matrices are the file's
    FP32 values, as the same weights without a quantization_config load them."""
    from sv_engine.options import resolve_quantization

    c = scaled_checkpoint
    assert resolve_quantization("auto", "cpu", c.kv_only_dir) == "int8"
    assert resolve_quantization("auto", "cpu", c.plain_dir) == "int8"  # a plain checkpoint's
    kv_only = Engine.from_model_dir(
        c.kv_only_dir, device="cpu", kv_cache_mib=4, kv_cache_dtype="fp8"
    )
    plain = Engine.from_model_dir(c.plain_dir, device="cpu", kv_cache_mib=4)
    for ours, theirs in zip(_matrices(kv_only), _matrices(plain), strict=True):
        assert (ours is None) == (theirs is None)
        if ours is not None:
            assert isinstance(ours, torch.Tensor) and ours.dtype == torch.float32
            assert torch.equal(ours, theirs)


@pytest.mark.parametrize("kind", ["fp8", "int8"])
def test_fp8_or_int8_asked_for_quantizes_a_kv_cache_only_checkpoint(
    scaled_checkpoint: ScaledCheckpoint, tiny_llama_dir: Path, tmp_path: Path, kind: str
) -> None:
    """`--quantization fp8|int8` quantizes a KV-cache-only checkpoint's plain weights at load,
    as it does those of the same weights without a quantization_config (the oracle: equal
    matrices, int8's quantized, fp8's dequantized once on the CPU), and the FP8 pool keeps
    the file's scales. The weights are the tiny Llama's own FP32 ones, which no FP8 or int8
    matrix holds exactly, so a load that did not quantize them would show."""
    c = scaled_checkpoint
    plain_state = safetensors.torch.load_file(str(tiny_llama_dir / "model.safetensors"))
    scales = {
        f"model.layers.{layer}.self_attn.{which}": c.scales[layer, i].reshape(1).clone()
        for layer in range(c.scales.shape[0])
        for i, which in enumerate(("k_scale", "v_scale"))
    }
    folder = write_model_with(
        tiny_llama_dir,
        tmp_path / "kv-only",
        plain_state | scales,
        kv_cache_only_quantization_config(),
    )
    kv_only = Engine.from_model_dir(
        folder, device="cpu", kv_cache_mib=4, kv_cache_dtype="fp8", quantization=kind
    )
    plain = Engine.from_model_dir(tiny_llama_dir, device="cpu", kv_cache_mib=4, quantization=kind)
    ours, theirs = _matrices(kv_only), _matrices(plain)
    assert any(isinstance(m, QuantizedWeight) for m in ours) == (kind == "int8")
    for a, b in zip(ours, theirs, strict=True):
        if isinstance(a, QuantizedWeight):
            assert isinstance(b, QuantizedWeight) and a.kind == b.kind == "int8"
            assert torch.equal(a.data, b.data) and torch.equal(a.scale, b.scale)
        elif a is not None:
            assert torch.equal(a, b)
    qkv = torch.cat([plain_state[f"model.layers.0.self_attn.{n}_proj.weight"] for n in "qkv"])
    packed = kv_only.runner.model.weights.layers[0].qkv
    assert not torch.equal(
        dequantize(packed) if isinstance(packed, QuantizedWeight) else packed, qkv
    )
    kv = kv_only.runner.kv
    assert kv.scales is not None
    assert torch.equal(kv.scales, c.scales[:, :, None].expand(-1, -1, kv.scales.shape[2]))


def test_a_kv_cache_only_checkpoint_generates_on_the_cpu(
    scaled_checkpoint: ScaledCheckpoint,
) -> None:
    """Greedy generation with an FP8 pool of the file's scales: the tokens of the FP8-weight
    checkpoint whose matrices stand for the same values with the same scales (dequantized at
    load on the CPU), and every page back at the end."""
    c = scaled_checkpoint
    params = SamplingParams(max_new_tokens=12, ignore_eos=True)
    prompts = ["Name three rivers.", "Count to five."]
    kv_only = Engine.from_model_dir(
        c.kv_only_dir, device="cpu", kv_cache_mib=4, kv_cache_dtype="fp8"
    )
    fp8 = Engine.from_model_dir(c.scaled_dir, device="cpu", kv_cache_mib=4, kv_cache_dtype="fp8")
    got = [done.output_ids for done in kv_only.generate(prompts, params)]
    assert all(len(ids) == 12 for ids in got)
    assert got == [done.output_ids for done in fp8.generate(prompts, params)]
    assert kv_only.stats.free_pages == kv_only.stats.pool_pages
