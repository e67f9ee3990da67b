#!/usr/bin/env bash
# One command: set up with the test extras (pytest, hypothesis, playwright + headless Chromium, g++, the vLLM CPU
# build, ruff, mypy), check lint, format and types, then run the whole test-suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --test
echo "ruff check / ruff format --check / mypy …"
.venv/bin/ruff check src tests benchmarks scripts
.venv/bin/ruff format --check src tests benchmarks scripts
.venv/bin/mypy
.venv/bin/python -m pytest -q -p no:randomly "$@"
