#!/usr/bin/env bash
# One command: set up with the test extras (incl. headless Chromium) and run the whole test-suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --test
.venv/bin/python -m pytest -q -p no:randomly "$@"
