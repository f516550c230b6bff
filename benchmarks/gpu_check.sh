#!/usr/bin/env bash
# The prepared GPU check: `bash benchmarks/gpu_check.sh OUT_DIR [--quick]` from the repository root.
# On a machine without pydantic, carry its wheels in .whl/ (see docs/performance.md); Ray is not needed.
set -euo pipefail
out="${1:?usage: gpu_check.sh OUT_DIR [--quick]}"; shift
if ! python3 -c "import pydantic" 2>/dev/null && ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/ablate-site .whl/*.whl
  export PYTHONPATH="/tmp/ablate-site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
python3 -m benchmarks.gpu_check "$out" "$@"
