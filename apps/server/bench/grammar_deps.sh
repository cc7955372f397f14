#!/usr/bin/env bash
# The grammar library of structured output (llguidance, no dependencies of its own), at the
# version uv.lock pins, as the manylinux CPython 3.12 wheel, installed into one folder. For the
# GPU machine, whose image has no uv sync and no internet:
#
#   bash apps/server/bench/grammar_deps.sh .grammar-deps     # here (reaches PyPI)
#   # carry .grammar-deps; scripts/gpu-check.sh puts it on PYTHONPATH when it is there
set -euo pipefail
target=${1:?usage: grammar_deps.sh TARGET_DIR}
root=$(cd "$(dirname "$0")/../../.." && pwd)
pin=$(python3 - "$root/uv.lock" <<'PY'
import sys, tomllib
packages = {p["name"]: p["version"] for p in tomllib.load(open(sys.argv[1], "rb"))["package"]}
print(f"llguidance=={packages['llguidance']}")
PY
)
echo "installing into $target: $pin"
uv pip install --quiet --target "$target" --no-deps --python-version 3.12 \
    --python-platform x86_64-manylinux_2_31 --only-binary :all: "$pin"
