#!/usr/bin/env bash
# The prepared GPU check, about 8 minutes: `bash benchmarks/gpu_check.sh OUT_DIR [--quick]` from the repository root.
#   1. Ray: if .carry/site.tar.xz exists (Ray 2.60 and pydantic for CPython 3.12, installed with
#      `pip install --target .carry/site` and tarred, for a machine with no network; carry .carry with the call), it is unpacked onto PYTHONPATH; then a
#      60-second Ray Tune smoke run (benchmarks/gpu_service.py ray_smoke). If Ray cannot run, the check says why and
#      goes on with the parts that need no Ray.
#   2. No Ray: the card's matmul limit and the single-trial training step (benchmarks/gpu_check.py limit,step).
#   3. The service with Ray: --pack 8 against --gpus-per-trial 0.125 and one trial per GPU, --pack auto with 32
#      points, claim 9 at batch 6144 (its seeds in one pack) and claim 1 at batch 8192, each time-boxed.
# Tables: OUT_DIR/gpu_check.md (part 2) and OUT_DIR/gpu_service.md (parts 1 and 3). Without CUDA every GPU part
# says what it skips. GPU_CHECK_PARTS (default limit,step) and GPU_SERVICE_PARTS choose parts.
set -uo pipefail
out="${1:?usage: gpu_check.sh OUT_DIR [--quick]}"; shift
mkdir -p "$out"
if [ -f .carry/site.tar.xz ] && ! python3 -c "import ray" 2>/dev/null; then
  mkdir -p /tmp/ablate-site && tar -xJf .carry/site.tar.xz -C /tmp/ablate-site
  export PYTHONPATH="/tmp/ablate-site${PYTHONPATH:+:$PYTHONPATH}"
fi
if ! python3 -c "import pydantic" 2>/dev/null && ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/ablate-whl .whl/*.whl
  export PYTHONPATH="/tmp/ablate-whl${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" RAY_AUTH_MODE="${RAY_AUTH_MODE:-token}"
service_parts="${GPU_SERVICE_PARTS:-ray_smoke,pack,claim9,claim1}"
budget=45; science=60
if [ "${1:-}" = "--quick" ]; then budget=10; science=10; fi
rc=0
if python3 -c "import ray" 2>/dev/null; then
  python3 -m benchmarks.gpu_service "$out" --only ray_smoke || { rc=1; service_parts=""; }
  service_parts="${service_parts/ray_smoke/}"
else
  echo "Ray is not installed here and .carry/site.tar.xz is missing: skipping every part that needs Ray"
  service_parts=""
fi
python3 -m benchmarks.gpu_check "$out" --only "${GPU_CHECK_PARTS:-limit,step}" "$@" || rc=1
service_parts="$(echo "$service_parts" | sed 's/^,*//; s/,,*/,/g; s/,*$//')"
if [ -n "$service_parts" ]; then
  mv "$out/gpu_service.md" "$out/gpu_service_smoke.md" 2>/dev/null
  mv "$out/gpu_service.json" "$out/gpu_service_smoke.json" 2>/dev/null
  python3 -m benchmarks.gpu_service "$out" --only "$service_parts" --budget "$budget" --science-budget "$science" || rc=1
fi
exit $rc
