"""The GPU benchmark script runs end to end (at tiny shapes, on whatever device is here)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sv_kernels import bench


def test_bench_smoke_run_measures_every_triton_op(tmp_path: Path) -> None:
    out = tmp_path / "rows.json"
    rows = bench.main(["--smoke", "--skip-flex", "--json", str(out)])
    saved = json.loads(out.read_text())
    assert saved["rows"] == rows
    assert saved["copy_gbps"] > 0
    triton_rows = [r for r in rows if r["impl"].startswith("triton")]
    ops = {r["op"] for r in triton_rows}
    assert ops == {
        "rms_norm+residual",
        "swiglu",
        "embedding",
        "rope_cache_write",
        "decode_attention",
        "prefill_attention",
        "argmax",
        "sample",
        "token_logprobs",
    }
    for row in triton_rows:
        assert row["ms"] is not None and row["ms"] > 0, row
        assert row["bytes"] > 0 and row["gbps"] > 0, row
    prefill = [r for r in triton_rows if r["op"] == "prefill_attention"]
    assert all(r["tflops"] is not None for r in prefill)


def test_bench_smoke_run_sweeps_the_gemv_tiles(tmp_path: Path) -> None:
    """`--only gemv`: per matrix and weight type a cuBLAS row and a best-tile row, whose bytes
    are the matrix's (1 byte per weight plus FP32 row scales when quantized), x and the output;
    per type a per-token row that is the layers' and the LM head's best times summed."""
    rows = bench.main(["--smoke", "--only", "gemv", "--json", str(tmp_path / "gemv.json")])
    gemv = [r for r in rows if r["op"] == "gemv b1"]
    s = bench.SMOKE
    qkv = (s.hq + 2 * s.hkv) * s.head_dim
    shapes = {
        "qkv": (qkv, s.hidden),
        "o": (s.hq * s.head_dim, s.hidden),
        "gate_up": (2 * s.inter, s.hidden),
        "down": (s.hidden, s.inter),
        "lm_head": (s.vocab, s.hidden),
    }
    assert len(gemv) == 2 * 3 * len(shapes)
    expected_ms = {"bf16": 0.0, "fp8": 0.0, "int8": 0.0}
    for name, (n, k) in shapes.items():
        for kind, per_weight in (("bf16", 2), ("fp8", 1), ("int8", 1)):
            mine = [
                r for r in gemv if r["shape"] == f"{name} {n}x{k}" and r["impl"].startswith(kind)
            ]
            assert len(mine) == 2, (name, kind, mine)
            scales = 0 if kind == "bf16" else 4 * n
            for r in mine:
                assert r["bytes"] == n * k * per_weight + scales + 2 * (n + k), r
                assert r["ms"] > 0 and r["gbps"] > 0
            count = 1 if name == "lm_head" else s.layers
            expected_ms[kind] += count * min(r["ms"] for r in mine)
    per_token = {r["impl"].split()[0]: r for r in rows if r["op"] == "gemv b1 per token"}
    assert set(per_token) == set(expected_ms)
    for kind, ms in expected_ms.items():
        assert abs(per_token[kind]["ms"] - ms) <= 1e-9 * ms, kind


def test_bench_runs_only_the_named_sections() -> None:
    rows = bench.main(["--smoke", "--only", "logprobs"])
    assert {r["op"] for r in rows} == {"copy", "token_logprobs"}
    assert {r["impl"] for r in rows if r["op"] == "token_logprobs"} == {
        "triton",
        "torch two-stage top-k",
        "torch-ref",
    }
    with pytest.raises(SystemExit):
        bench.main(["--smoke", "--only", "logprob"])


@pytest.mark.parametrize("smoke", [["--smoke"], []])
def test_an_unknown_section_is_refused_before_any_measurement(
    smoke: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """It was found only after the copy benchmark ran (with --smoke) or, without a GPU, not at
    all: "needs a CUDA device" came first."""
    with pytest.raises(SystemExit) as caught:
        bench.main([*smoke, "--only", "rope,logprob"])
    assert caught.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "unknown --only section 'logprob'" in captured.err
