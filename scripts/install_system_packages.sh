#!/usr/bin/env bash
# Install the system packages the test-suite needs, from Debian:
# - chromium (+ CJK fonts) for the report browser tests. We never run `playwright install`: the PyPI
#   playwright package drives this system chromium;
# - a C++ compiler, which torch.compile needs on CPU (compiled decoding, genprobe.engine.fast.compiled).
# Idempotent: does nothing when all of them are already present.
set -euo pipefail

need=()
[ -x /usr/bin/chromium ] || need+=(chromium)
# Chinese characters render as boxes without a CJK font.
fc-list 2>/dev/null | grep -qi 'cjk' || need+=(fonts-noto-cjk)
command -v g++ >/dev/null || command -v c++ >/dev/null || need+=(g++)

if [ ${#need[@]} -eq 0 ]; then
    echo "chromium, CJK fonts and a C++ compiler already installed: $(/usr/bin/chromium --version 2>/dev/null || echo /usr/bin/chromium)"
    exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || { echo "need root (or sudo) to apt-get install ${need[*]}" >&2; exit 1; }
    SUDO=sudo
fi

export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${need[@]}"
/usr/bin/chromium --version
