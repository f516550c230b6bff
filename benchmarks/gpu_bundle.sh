#!/usr/bin/env bash
# The offline bundle for a GPU node without network: `bash benchmarks/gpu_bundle.sh [OUT_DIR] [--with-optuna] [--with-plotly]`
# writes OUT_DIR/site.tar.xz (default OUT_DIR: .carry, the folder benchmarks/gpu_check.sh unpacks): Ray Tune 2.60,
# pydantic and psutil, with the packages they need that a CUDA PyTorch image does not already hold, for CPython 3.12
# on x86-64 Linux. It is built from wheels (pip download --only-binary for that platform), so it can be built on any machine
# with the package index, whatever its own Python. The node must already have torch, numpy, pandas, pyarrow, scipy,
# scikit-learn, PyYAML and Ray's other pure-Python dependencies (click, filelock, msgpack, protobuf, requests,
# packaging, aiohttp, grpcio, attrs), as the usual CUDA PyTorch images do.
#
# Pruned, because a call to a lent GPU machine carries at most 64 MiB: the Java worker jar, RLlib, Serve, LLM,
# Workflow, the test folders and the dashboard's web build are left out (ablate's GPU check runs Ray headless,
# include_dashboard=False), and Ray's three native binaries lose their symbol tables (dynamic symbols stay). About
# 21 MiB. On the node: mkdir -p DIR && tar -xJf site.tar.xz -C DIR && export PYTHONPATH=DIR:$PYTHONPATH (gpu_check.sh
# does this and says so if the untar or an import fails).
set -euo pipefail
out=".carry"; optuna=0; plotly=0
for a in "$@"; do
  case "$a" in
    --with-optuna) optuna=1 ;;
    --with-plotly) plotly=1 ;;
    -*) echo "gpu_bundle.sh: unknown option $a (allowed: --with-optuna, --with-plotly)" >&2; exit 2 ;;
    *) out="$a" ;;
  esac
done
out="$(realpath -m "$out")"
work="$(mktemp -d)"; trap 'rm -rf "$work"' EXIT
mkdir -p "$out" "$work/wheels" "$work/site"
platform=(--only-binary=:all: --no-deps --implementation cp --python-version 3.12 --platform manylinux_2_28_x86_64
          --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64)
# Pinned to the versions ablate's tests run with (Ray's lower end, 2.52, is tested in CI too).
wheels=(ray==2.60.0 pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5
        typing_extensions==4.16.0 jsonschema==4.26.0 jsonschema-specifications==2025.9.1 referencing==0.37.0
        rpds-py==2026.9.1 tensorboardX==2.6.5 psutil==7.2.2)
((optuna)) && wheels+=(optuna==5.0.0 alembic==1.20.1 SQLAlchemy==2.1.9 Mako==1.4.3 colorlog==6.12.0)
((plotly)) && wheels+=(plotly==7.1.0)
python3 -m pip download -q "${platform[@]}" -d "$work/wheels" "${wheels[@]}"
for w in "$work"/wheels/*.whl; do unzip -q -o "$w" -d "$work/site"; done  # unzip keeps the executable bits
ray_dir="$work/site/ray"
rm -rf "$ray_dir/jars" "$ray_dir/rllib" "$ray_dir/serve" "$ray_dir/llm" "$ray_dir/workflow" "$ray_dir/dashboard/client/build"
find "$ray_dir" -type d \( -name tests -o -name test \) -prune -exec rm -rf {} +
for binary in "$ray_dir/_raylet.so" "$ray_dir/core/src/ray/gcs/gcs_server" "$ray_dir/core/src/ray/raylet/raylet"; do
  if command -v strip >/dev/null; then strip --strip-unneeded "$binary"; fi
done
tar -C "$work/site" -cf - . | xz -9 -T1 > "$out/site.tar.xz"
echo "$out/site.tar.xz: $(du -m "$out/site.tar.xz" | cut -f1) MiB (unpacked $(du -sm "$work/site" | cut -f1) MiB)"
