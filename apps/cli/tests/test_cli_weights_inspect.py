"""`sv weights inspect PATH` (sv_cli.weights_inspect.inspect_main)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import safetensors
import safetensors.torch
import torch
from sv_cli.weights_inspect import inspect_main
from sv_weights import tiny_llama_config, write_random_checkpoint
from sv_weights.synthetic import kv_cache_only_quantization_config


def run(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = inspect_main(argv, stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


def test_file_table_and_totals(tmp_path: Path) -> None:
    path = tmp_path / "w.safetensors"
    tensors = {
        "layers.10.w": torch.zeros(3, 4, dtype=torch.bfloat16),
        "layers.2.w": torch.zeros(5, dtype=torch.float32),
        "ids": torch.zeros(2, 2, dtype=torch.int64),
    }
    safetensors.torch.save_file(tensors, str(path))  # the oracle writes it
    code, out, err = run([str(path)])
    assert code == 0 and err == ""
    lines = out.splitlines()
    assert lines[0].split() == ["tensor", "dtype", "shape", "bytes"]
    rows = [line.split() for line in lines[1:4]]
    assert [r[0] for r in rows] == ["ids", "layers.2.w", "layers.10.w"]  # layer 2 before 10
    assert rows[0] == ["ids", "I64", "[2,", "2]", "32"]
    assert rows[1] == ["layers.2.w", "F32", "[5]", "20"]
    assert rows[2] == ["layers.10.w", "BF16", "[3,", "4]", "24"]
    assert lines[4] == "total: 3 tensors (1 BF16, 1 F32, 1 I64), 21 elements, 76 bytes (0.0 MiB)"


def test_names_whose_digits_int_cannot_read_are_listed(tmp_path: Path) -> None:
    """Names the file format allows, sorted with layer 2 before 10 all the same: a digit run
    past int()'s 4300 digits, and a "²" (str.isdigit, but no int) after a digit. Each made the
    sort key raise ValueError, a traceback instead of the table."""
    path = tmp_path / "w.safetensors"
    long = "w" + "9" * 5000
    names = ["w10", "w1²", "w2", long, "w" + "1" + "0" * 4999]
    safetensors.torch.save_file({name: torch.zeros(1) for name in names}, str(path))
    code, out, err = run([str(path)])
    assert code == 0 and err == ""
    listed = [line.split()[0] for line in out.splitlines()[1:-1]]
    assert listed == ["w1²", "w2", "w10", "w" + "1" + "0" * 4999, long]


def test_model_folder_shows_config_and_check(tmp_path: Path) -> None:
    write_random_checkpoint(tmp_path, tiny_llama_config())
    code, out, err = run([str(tmp_path)])
    assert code == 0 and err == ""
    row = ["model.layers.1.mlp.down_proj.weight", "BF16", "[64,", "256]", "32,768"]
    assert row in [line.split() for line in out.splitlines()]
    expected_bytes = sum(
        t.numel() * 2
        for t in safetensors.torch.load_file(str(tmp_path / "model.safetensors")).values()
    )
    assert (
        f"total: 20 tensors (20 BF16), {expected_bytes // 2:,} elements, {expected_bytes:,} bytes"
        in out
    )
    assert "config: llama: hidden 64, layers 2, heads 4 (2 kv), head_dim 16" in out
    assert out.rstrip().endswith("check: tensors match config.json")


@pytest.mark.parametrize(
    ("config", "problem"),
    [
        ({"model_type": "gpt2"}, "config model_type 'gpt2' is not supported"),
        ({"quantization_config": {"quant_method": "awq"}}, "quant_method is 'awq'; sv reads only"),
        ({"hidden_size": None}, "config key 'hidden_size'"),
    ],
)
def test_a_config_sv_cannot_read_is_a_note_after_the_tensors(
    tmp_path: Path, config: dict[str, object], problem: str
) -> None:
    """The tensors are what this command is for: a config.json sv cannot run (another
    architecture or quantization) or cannot read does not hide them (it used to)."""
    write_random_checkpoint(tmp_path, tiny_llama_config())
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **config}))
    code, out, err = run([str(tmp_path)])
    assert code == 0
    assert "model.layers.1.mlp.down_proj.weight" in out and "total: 20 tensors" in out
    assert "config:" not in out and "check:" not in out
    assert err.startswith(f"sv weights inspect: note: {path}: ") and err.count("\n") == 1
    assert problem in err and err.endswith("; the tensors were not checked against it\n")


@pytest.mark.parametrize("problem", ["missing", "not safetensors", "mismatch"])
def test_bad_input_is_one_line_on_stderr_and_exit_2(tmp_path: Path, problem: str) -> None:
    if problem == "missing":
        target = tmp_path / "absent.safetensors"
    elif problem == "not safetensors":
        target = tmp_path / "junk.safetensors"
        target.write_bytes(b"\xff" * 64)
    else:
        write_random_checkpoint(tmp_path, tiny_llama_config())
        tiny_llama_config(num_hidden_layers=3).write_json(tmp_path / "config.json")
        target = tmp_path
    code, _, err = run([str(target)])
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("sv weights inspect: error: ")
    assert "Traceback" not in err and str(target) in err


def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert inspect_main([]) == 2
    err = capsys.readouterr().err  # one line, as every sv usage error (it was usage + error)
    assert err.count("\n") == 1
    assert err.startswith("sv weights inspect: error: the following arguments are required: path")
    assert inspect_main(["--help"]) == 0
    assert inspect_main([""]) == 2  # (an unset shell variable: not the current folder)
    assert capsys.readouterr().err == "sv weights inspect: error: the path must not be empty\n"


def write_kv_cache_checkpoint(folder: Path, scales: dict[str, torch.Tensor]) -> None:
    """The tiny Llama as an FP8 checkpoint with a kv_cache_scheme and the KV-cache `scales`,
    written by the `safetensors` package."""
    config = tiny_llama_config()
    write_random_checkpoint(folder, config)
    state = safetensors.torch.load_file(str(folder / "model.safetensors"))
    for name in [n for n in state if n.endswith("_proj.weight")]:
        state[name + "_scale"] = state[name].float().abs().amax(dim=1, keepdim=True) / 448
        state[name] = (state[name].float() / state[name + "_scale"]).to(torch.float8_e4m3fn)
    safetensors.torch.save_file(state | scales, str(folder / "model.safetensors"))
    raw = json.loads((folder / "config.json").read_text())
    fp8 = {"num_bits": 8, "type": "float"}
    raw["quantization_config"] = {
        "quant_method": "compressed-tensors",
        "format": "float-quantized",
        "config_groups": {
            "group_0": {"targets": ["Linear"], "weights": fp8 | {"strategy": "channel"}}
        },
        "kv_cache_scheme": fp8 | {"strategy": "tensor", "dynamic": False, "symmetric": True},
    }
    (folder / "config.json").write_text(json.dumps(raw))


@pytest.mark.parametrize("bad", [float("nan"), 0.0, -0.5])
def test_kv_cache_scales_the_load_refuses_are_an_error(tmp_path: Path, bad: float) -> None:
    """A K scale of NaN, 0 or below, which the load refuses: inspect says so too (it printed
    their range, e.g. "k nan-nan", as scales --kv-cache-dtype fp8 uses, and exited 0)."""
    from sv_weights import WeightsError, load_checkpoint

    k0 = "model.layers.0.self_attn.k_scale"
    write_kv_cache_checkpoint(
        tmp_path,
        {
            k0: torch.tensor([bad]),
            "model.layers.0.self_attn.v_scale": torch.tensor([0.25]),
            "model.layers.1.self_attn.k_scale": torch.tensor([0.5]),
            "model.layers.1.self_attn.v_scale": torch.tensor([0.5]),
        },
    )
    with pytest.raises(WeightsError, match=k0):
        load_checkpoint(tmp_path)
    code, out, err = run([str(tmp_path)])
    assert code == 2 and "kv cache:" not in out
    assert err.startswith("sv weights inspect: error: ") and err.count("\n") == 1
    assert f"tensor {k0} holds a scale of {bad:g}" in err


def test_a_calibrated_kv_cache_shows_its_scales(tmp_path: Path) -> None:
    """An FP8 checkpoint with a kv_cache_scheme and each layer's K and V scale (here one
    layer's in the older `output_scale` spelling): listed, checked, and summed up in one line
    that says only an FP8 cache uses them."""
    scales = {
        "model.layers.0.self_attn.k_scale": torch.tensor([0.5]),
        "model.layers.0.self_attn.v_scale": torch.tensor([0.25]),
        "model.layers.1.self_attn.k_proj.output_scale": torch.tensor(0.125, dtype=torch.bfloat16),
        "model.layers.1.self_attn.v_proj.output_scale": torch.tensor(2.0, dtype=torch.bfloat16),
    }
    write_kv_cache_checkpoint(tmp_path, scales)
    code, out, err = run([str(tmp_path)])
    assert code == 0 and err == ""
    assert ["model.layers.1.self_attn.k_proj.output_scale", "BF16", "[]", "2"] in [
        line.split() for line in out.splitlines()
    ]
    assert "check: tensors match config.json" in out
    assert out.rstrip().endswith(
        "kv cache: FP8 scales in all 2 layers (k 0.125-0.5, v 0.25-2), used by "
        "--kv-cache-dtype fp8; a BF16 or FP32 cache does not need them"
    )


def test_a_kv_cache_only_checkpoint_shows_plain_weights_and_its_scales(tmp_path: Path) -> None:
    """A checkpoint llm-compressor calibrated only for an FP8 KV cache (no config group, BF16
    weights, each layer's K and V scale): checked, its weights said to be unquantized and its
    scales summed up as an FP8 checkpoint's are. It was an error ("config_groups must hold
    exactly one group")."""
    config = tiny_llama_config()
    write_random_checkpoint(tmp_path, config)
    state = safetensors.torch.load_file(str(tmp_path / "model.safetensors"))
    scales = {
        "model.layers.0.self_attn.k_scale": torch.tensor([0.5]),
        "model.layers.0.self_attn.v_scale": torch.tensor([0.25]),
        "model.layers.1.self_attn.k_scale": torch.tensor([0.125]),
        "model.layers.1.self_attn.v_scale": torch.tensor([2.0]),
    }
    safetensors.torch.save_file(state | scales, str(tmp_path / "model.safetensors"))
    raw = json.loads((tmp_path / "config.json").read_text())
    raw["quantization_config"] = kv_cache_only_quantization_config()
    (tmp_path / "config.json").write_text(json.dumps(raw))
    code, out, err = run([str(tmp_path)])
    assert code == 0 and err == ""
    rows = [line.split() for line in out.splitlines()]
    assert ["model.layers.0.self_attn.q_proj.weight", "BF16", "[64,", "64]", "8,192"] in rows
    lines = out.rstrip().splitlines()
    assert lines[-3] == "check: tensors match config.json"
    assert lines[-2] == "weights: unquantized (quantization_config has no config_groups)"
    assert lines[-1] == (
        "kv cache: FP8 scales in all 2 layers (k 0.125-0.5, v 0.25-2), used by "
        "--kv-cache-dtype fp8; a BF16 or FP32 cache does not need them"
    )
