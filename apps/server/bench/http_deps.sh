#!/usr/bin/env bash
# The pure-Python packages sv-server and bench_serve.py need beyond torch/triton/numpy/regex/jinja2
# (starlette, uvicorn, httpx and their dependencies), at the versions uv.lock pins, installed into
# one folder. For the GPU machine, whose image has no uv sync and no internet:
#
#   bash apps/server/bench/http_deps.sh .http-deps          # here (reaches PyPI)
#   # carry .http-deps, then on the device (after the image's own PYTHONPATH entries):
#   PYTHONPATH=$PYTHONPATH:$PWD/.http-deps python3 apps/server/bench/bench_serve.py MODEL_DIR
set -euo pipefail
target=${1:?usage: http_deps.sh TARGET_DIR}
root=$(cd "$(dirname "$0")/../../.." && pwd)
pins=$(python3 - "$root/uv.lock" <<'PY'
import sys, tomllib
wanted = ["starlette", "uvicorn", "h11", "click", "anyio", "httpx", "httpcore", "certifi", "idna",
          "sniffio", "typing-extensions"]
packages = {p["name"]: p["version"] for p in tomllib.load(open(sys.argv[1], "rb"))["package"]}
print(" ".join(f"{name}=={packages[name]}" for name in wanted if name in packages))
PY
)
echo "installing into $target: $pins"
# shellcheck disable=SC2086  # one argument per pin
uv pip install --quiet --target "$target" --no-deps --python-version 3.12 $pins
