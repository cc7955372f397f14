#!/usr/bin/env bash
# Everything GPU in one call, for the device machine (no uv there, no internet): the image's
# python3 with PYTHONPATH set to each package's src/. GPU tests first, then every benchmark;
# the last thing printed is the short table. Logs and JSON go to $OUT (copied back from the GPU
# machine).
#
#   on the GPU:  bash scripts/gpu-check.sh            (carry: .assets, .grammar-deps for
#                structured output, and .http-deps for the serving benchmark: `make gpu-assets`
#                builds all three)
#   options via env: SV_BENCH_ARGS="--quick" (added), SV_BENCH_FLAGS (replaces the default
#   "--kernels --peer --profile --quantization fp8,int8"), SV_SKIP_TESTS=1,
#   SV_PYTEST_ARGS="-k decode", SV_SERVE_ARGS and
#   SV_MIX_ARGS (the two serving benchmarks' arguments), SV_SKIP_SERVE=1, SV_SKIP_FAMILIES=1
#   (the Qwen presets' decode and throughput rows, run when .assets/qwen-tokenizer exists),
#   SV_GPU_BUDGET_S=N: end within N seconds (a device call's limit); each step gets what is
#   left, and once less than a minute is, the rest are skipped (rc 124 in the last line)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/sv-gpu-out}
mkdir -p "$OUT"
PYTHONPATH=$(printf '%s:' packages/*/src apps/*/src)
# Structured output's grammar library (llguidance), which the image lacks: carry .grammar-deps
# (`make gpu-assets`); without it everything but the grammar tests and benchmark still runs.
[ -d .grammar-deps ] && PYTHONPATH="$PYTHONPATH$PWD/.grammar-deps:"
export PYTHONPATH PYTHONUNBUFFERED=1
export SV_TOKENIZER_DIR=${SV_TOKENIZER_DIR:-$PWD/.assets/llama-3.2-tokenizer}
export SV_BENCH_WORKDIR=${SV_BENCH_WORKDIR:-/tmp/sv-bench}

END=$(( $(date +%s) + ${SV_GPU_BUDGET_S:-86400} ))
within() {  # run "$@" in the time left; SIGINT, so pytest still prints what it finished
    local left=$(( END - $(date +%s) ))
    if [ "$left" -lt 60 ]; then
        echo "(skipped: the ${SV_GPU_BUDGET_S}s budget is spent)"
        return 124
    fi
    timeout -s INT "$left" "$@"
}

echo "== environment"
python3 -c "import sys, torch, triton; print('python', sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())"
nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.sm,clocks.mem --format=csv,noheader
git log -1 --format='commit %h %s' 2>/dev/null || true

tests_rc=skipped
if [ -z "${SV_SKIP_TESTS:-}" ]; then
    echo "== GPU tests (pytest -m gpu)"
    # Only the suites that hold GPU tests: other suites import packages the image lacks (gguf).
    within python3 -m pytest -q -m gpu -p no:cacheprovider -o addopts="--import-mode=importlib -ra -rP" \
        --continue-on-collection-errors ${SV_PYTEST_ARGS:-} \
        packages/sv-kernels/tests packages/sv-model/tests packages/sv-weights/tests/test_weights_safetensors.py \
        apps/cli/tests/test_bench_runner.py packages/sv-trace/tests/test_trace_gpu.py 2>&1 | tee "$OUT/gpu-tests.log" | tail -60
    tests_rc=${PIPESTATUS[0]}
fi

echo "== benchmarks"
within python3 -m sv_cli bench --tokenizer-dir "$SV_TOKENIZER_DIR" --workdir "$SV_BENCH_WORKDIR" \
    ${SV_BENCH_FLAGS:---kernels --peer --profile --quantization fp8,int8} --json "$OUT/bench.json" ${SV_BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.log" | grep -v '^\[bench\]'
bench_rc=${PIPESTATUS[0]}

families_rc=skipped
if [ -d .assets/qwen-tokenizer ] && [ -z "${SV_SKIP_FAMILIES:-}" ]; then
    # The Qwen shapes beside the 1B figures, with Qwen's own tokenizer (its ids are past the
    # Llama tokenizer's): `make gpu-assets` puts it in .assets/qwen-tokenizer.
    families_rc=0
    for preset in qwen2.5-0.5b qwen3-0.6b; do
        echo "== $preset (sv bench --preset $preset --only decode,throughput)"
        within python3 -m sv_cli bench --tokenizer-dir "$PWD/.assets/qwen-tokenizer" --workdir "$SV_BENCH_WORKDIR" \
            --preset $preset --only decode,throughput --json "$OUT/bench-$preset.json" 2>&1 | tee "$OUT/bench-$preset.log" | grep -v '^\[bench\]'
        [ "${PIPESTATUS[0]}" = 0 ] || families_rc=1
    done
fi

tp_rc=skipped
if [ "$(nvidia-smi -L | wc -l)" -ge 2 ] && [ -z "${SV_SKIP_TP:-}" ]; then
    # Tensor parallelism (NCCL, NVLink multicast off): decode-b1 and throughput at TP=2 beside
    # TP=1 in the same run; SV_TP_ARGS="--preset llama-3.1-8b" for the 8B shapes.
    echo "== tensor parallelism (sv bench --only tp --tensor-parallel-size 2)"
    NCCL_NVLS_ENABLE=0 within python3 -m sv_cli bench --tokenizer-dir "$SV_TOKENIZER_DIR" --workdir "$SV_BENCH_WORKDIR" \
        --only tp --tensor-parallel-size 2 ${SV_TP_ARGS:-} --json "$OUT/bench-tp.json" 2>&1 | tee "$OUT/bench-tp.log" | grep -v '^\[bench\]'
    tp_rc=${PIPESTATUS[0]}
fi

serve_rc=skipped
if [ -d .http-deps ] && [ -z "${SV_SKIP_SERVE:-}" ]; then
    # The serving benchmark needs starlette/uvicorn, which the image lacks: carry .http-deps,
    # made by `bash apps/server/bench/http_deps.sh .http-deps`.
    echo "== serving benchmark (sv serve, concurrent streaming clients)"
    PYTHONPATH="$PYTHONPATH$PWD/.http-deps" within python3 apps/server/bench/bench_serve.py \
        "$SV_BENCH_WORKDIR/llama-3.2-1b-random" ${SV_SERVE_ARGS:---clients 64 --requests 256 --max-tokens 128} \
        --json "$OUT/serve.json" 2>&1 | tail -5
    serve_rc=${PIPESTATUS[0]}
    # A realistic mix: half the requests are chats without max_tokens (they run to the context
    # limit), beside short completions; a pool small enough that admission matters.
    for admission in conservative preemptive; do
        echo "== serving mix, --admission $admission (half without max_tokens)"
        PYTHONPATH="$PYTHONPATH$PWD/.http-deps" within python3 apps/server/bench/bench_serve.py \
            "$SV_BENCH_WORKDIR/llama-3.2-1b-random" --admission $admission \
            ${SV_MIX_ARGS:---clients 64 --requests 256 --max-tokens 128 --omit-max-tokens 0.5 --max-model-len 2048 --kv-cache-mib 2048} \
            --json "$OUT/serve-mix-$admission.json" 2>&1 | tail -3
        [ "${PIPESTATUS[0]}" = 0 ] || serve_rc=1
    done
    python3 - "$OUT" <<'PY'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
print(f"{'serving mix':<14}{'req/s':>8}{'TTFT p50':>10}{'p99':>9}{'bounded p50':>13}{'p99':>9}{'preempt':>9}{'recomp':>9}")
for name in ("conservative", "preemptive"):
    path = out / f"serve-mix-{name}.json"
    if not path.is_file():
        continue
    r = json.loads(path.read_text())
    t, b = r["ttft_ms"], r["ttft_ms_with_max_tokens"]
    # !s: a percentile of no request is None, which a width alone cannot format (TypeError)
    print(f"{name:<14}{r['requests_per_s']!s:>8}{t['p50']!s:>10}{t['p99']!s:>9}{b['p50']!s:>13}{b['p99']!s:>9}"
          f"{r.get('server_preemptions')!s:>9}{r.get('server_recomputed_tokens')!s:>9}")
PY
fi
echo "GPU tests: rc=$tests_rc ($(tail -1 "$OUT/gpu-tests.log" 2>/dev/null))   bench: rc=$bench_rc   families: rc=$families_rc   tp: rc=$tp_rc   serve: rc=$serve_rc"
