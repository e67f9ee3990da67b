#!/usr/bin/env bash
# Create .venv and install genprobe with the CPU build of torch 2.13.0 (what CI machines get quickly).
# Usage: bash scripts/setup.sh [--test]   (--test adds pytest, hypothesis, playwright and headless Chromium)
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
"$PY" - <<'PYEOF'
import sys
if sys.version_info < (3, 11):
    sys.exit(f"genprobe needs Python >= 3.11, this is {sys.version.split()[0]}")
PYEOF
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
VPIP=".venv/bin/python -m pip"
$VPIP install -q --disable-pip-version-check --upgrade pip >/dev/null 2>&1 || true
# Pin torch first so the range in pyproject is satisfied by the CPU wheel (no multi-GB CUDA download).
$VPIP install -q --disable-pip-version-check "torch==2.13.0"
if [ "${1:-}" = "--test" ]; then
  $VPIP install -q --disable-pip-version-check -e ".[test]"
  bash scripts/install_system_packages.sh
else
  $VPIP install -q --disable-pip-version-check -e .
fi
echo "genprobe installed in .venv ($(.venv/bin/python -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)'))"
