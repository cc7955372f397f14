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
