#!/usr/bin/env bash
# The GPU check, in two parts that each fit one call to a lent GPU machine (under 270 s each), part 1 first:
#   bash benchmarks/gpu_check.sh OUT --part 1    Ray sees the GPU; matmul limit; single-trial step; the same 8 points
#                                                one trial per GPU, --gpus-per-trial 0.125, --pack 8, and --pack 8
#                                                with --set sampler=fixed
#   bash benchmarks/gpu_check.sh OUT --part 2    --pack auto on 32 points; claim 9 at batch 6144; claim 1 at batch 8192
# from the repository root. A machine without network gets Ray from .carry/site.tar.xz (built by
# `bash benchmarks/gpu_bundle.sh`; carry .carry with the call): it is unpacked to /tmp/ablate-site and put on
# PYTHONPATH. OUT receives at most five files (summary.md, printed last; logs_tail.txt; results.json;
# nvidia_smi.txt; curves.md); runs and logs go to /tmp/ablate-gpu-check. Budgets: GPU_CHECK_* in
# benchmarks/gpu_lease.py. Without CUDA every GPU box says what it skips.
set -uo pipefail
usage="usage: bash benchmarks/gpu_check.sh OUT --part 1|2"
out="${1:?$usage}"; shift
[ "${1:-}" = "--part" ] && [ -n "${2:-}" ] || { echo "$usage" >&2; exit 2; }
part="$2"
mkdir -p "$out"
export RAY_USAGE_STATS_ENABLED=0 PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
carry=""
if [ -f .carry/site.tar.xz ] && ! python3 -c "import ray, pydantic" 2>/dev/null; then
  site=/tmp/ablate-site
  rm -rf "$site" && mkdir -p "$site"
  if untar_error="$(tar -xJf .carry/site.tar.xz -C "$site" 2>&1)"; then
    export PYTHONPATH="$site:$PYTHONPATH"
    carry="carry: unpacked .carry/site.tar.xz ($(du -sm "$site" | cut -f1) MiB) to $site"
  else
    carry="carry: unpacking .carry/site.tar.xz failed: $(echo "$untar_error" | tail -3 | tr '\n' ' ')"
  fi
elif [ -f .carry/site.tar.xz ]; then
  carry="carry: Ray and pydantic are installed here; .carry/site.tar.xz not used"
fi
if ! import_error="$(python3 -c "import ray, ray.tune, pydantic, ablate.cli" 2>&1)"; then
  carry="${carry:+$carry; }import failed: $(echo "$import_error" | tail -4 | tr '\n' ' ')"
fi
echo "${carry:-carry: none needed}"
GPU_CHECK_CARRY="${carry:-carry: none needed}" exec python3 -m benchmarks.gpu_lease "$out" --part "$part"
