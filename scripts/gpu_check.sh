#!/usr/bin/env bash
# GPU check of the Triton backend: one command, one CUDA device, the machine's own python3 with torch + triton +
# transformers, this repository only (no installs, no network, nothing built: PYTHONPATH=src).
#
#   scripts/gpu_check.sh                 # writes ${OUT:-.}/gpu_check.json, progress on stderr
#   scripts/gpu_check.sh --dry-run       # the same on the CPU: Triton's interpreter, tiny shapes (what CI runs)
#
# What it checks (scripts/gpu_check.py has the details): the kernels against the torch engine at the real
# Fast-dLLM-v2-1.5B and NLD-8B shapes (fp32 and bf16), the embedded model's decodes (vanilla, spiffy, specfold
# delta = 0 on the torch and triton backends: the same tokens), the compile table of every kernel for sm_80 and
# sm_90 (`specfold bench kernels --compile-only`), and the kernel test files under pytest when pytest is there.
# Timings beside each. Meant to end in under 8 minutes on one H100 (a hard stop at 470 s; the report is written
# by then); exit status 0 when everything passed, 1 otherwise.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="src${PYTHONPATH:+:$PYTHONPATH}"
PY="${PYTHON:-python3}"
OUT_DIR="${OUT:-.}"
mkdir -p "$OUT_DIR"
if [ "${1:-}" = "--dry-run" ]; then
    export TRITON_INTERPRET=1
else
    unset TRITON_INTERPRET
fi
exec timeout -k 10 470 "$PY" scripts/gpu_check.py --out "$OUT_DIR/gpu_check.json" "$@"
