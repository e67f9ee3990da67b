#!/usr/bin/env bash
# One command: set everything up, then run the main job (the Tang case study) on the bundled default.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/genprobe case --out out/case "$@"
echo "open out/case/report.html"
