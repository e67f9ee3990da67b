#!/usr/bin/env bash
# Install llama.cpp's Python bindings, llama-cpp-python 0.3.36 (genprobe's optional extra `llamacpp`), into .venv.
#
# Usage: bash scripts/install_llamacpp.sh        (after scripts/setup.sh; run by users, never by the tests)
#        bash scripts/install_llamacpp.sh --wheel-only  (step 2 below alone: the wheel into the cache, needing no .venv;
#                                   scripts/test.sh starts it before setup, so the build overlaps setup's downloads)
#        bash scripts/install_llamacpp.sh --for-this-cpu DIR  (a benchmark peer: llama.cpp built with every AVX-512
#                                   extension this CPU has, installed into DIR, not into .venv; put DIR first on
#                                   PYTHONPATH, or give it to benchmarks/llama_speed.py --llamacpp-site DIR)
#   LLAMACPP_REBUILD=1         build again even when a cached wheel fits
#   GENPROBE_LLAMACPP_SDIST=F  use this local copy of the sdist instead of downloading it (its sha256 is checked)
#
# The package registry has llama-cpp-python as source only (no registry package ships a prebuilt library of the
# llama.cpp commit 0.3.36 vendors: see docs/llamacpp.md), and `pip install llama-cpp-python` builds it with
# llama.cpp's default -DGGML_NATIVE=ON, whose quantized kernels crashed on the 2-core test machines. So:
#   1. a wheel built earlier on this machine for this Python (<cache>/wheels/, beside the wheels `genprobe fetch`
#      keeps; its build flags recorded next to it) is installed as is — seconds;
#   2. otherwise the sdist is downloaded with pip (pinned version, sha256 checked), built into a wheel with the
#      explicit flags below — only the two libraries the bindings load, libllama and libggml (~2 min on 2 idle
#      cores) —, kept in the cache, and installed;
#   3. llama.cpp's own source tree of that version (convert_hf_to_gguf.py, gguf-py: what the quantization study
#      writes GGUF files with) is extracted once to <cache>/llama.cpp-0.3.36/.
# Prints the wall time. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
START=$(date +%s)

VERSION=0.3.36
SDIST=llama_cpp_python-$VERSION.tar.gz
SDIST_SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
CACHE="${GENPROBE_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/genprobe}"  # genprobe.registry.cache_root()
WHEELS="$CACHE/wheels"
SDIST_DIR="$WHEELS"  # the one checked sdist, whichever wheel is built from it
SOURCE_TREE="$CACHE/llama.cpp-$VERSION"
PY=.venv/bin/python
WHEEL_ONLY=""
THIS_CPU_DIR=""
case "${1:-}" in
  --wheel-only) WHEEL_ONLY=1 ;;
  --for-this-cpu) THIS_CPU_DIR="${2:?--for-this-cpu needs the directory to install into}" ;;
  "") ;;
  *) echo "install_llamacpp: unknown option $1 (--wheel-only, --for-this-cpu DIR)" >&2; exit 2 ;;
esac

# Why each flag:
#   GGML_NATIVE=OFF      -march=native crashed in the quantized (Q4/Q8) kernels on these machines; name the ISA instead
#   GGML_AVX/AVX2/FMA/F16C=ON  the x86-64 extensions every machine we run on has (checked below), so the wheel is
#                        portable across them and still vectorised
#   GGML_AVX512=OFF      not every CPU here has AVX-512, and a wheel kept in a shared cache must run on all of them
#   LLAMA_BUILD_TESTS/EXAMPLES/SERVER/TOOLS=OFF  only the library the bindings load: halves the build time
#   LLAMA_CURL=OFF       no libcurl dependency (genprobe never downloads at run time)
#   LLAVA_BUILD=OFF      no libmtmd (the multimodal library: llama_cpp imports it only for image chat handlers)
#   -O2                  Release's -O3 costs a third more compile time in ggml's kernels for no speed our tests or
#                        figures see (Debian builds its packages with -O2); the library's results are the same code
# and, patched into the unpacked sdist (COMMON_* below), no llama-common: llama-cpp-python's CMakeLists forces it ON
# although nothing in the Python package loads it; it and the cpp-httplib it links were half of the build's CPU.
CMAKE_FLAGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=OFF"
CMAKE_FLAGS="$CMAKE_FLAGS -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF"
CMAKE_FLAGS="$CMAKE_FLAGS -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_CURL=OFF -DLLAVA_BUILD=OFF"
CMAKE_FLAGS="$CMAKE_FLAGS '-DCMAKE_C_FLAGS_RELEASE=-O2 -DNDEBUG' '-DCMAKE_CXX_FLAGS_RELEASE=-O2 -DNDEBUG'"
COMMON_ON='set(LLAMA_BUILD_COMMON ON CACHE'  # in basic sed regex, ( is a plain character
COMMON_OFF='set(LLAMA_BUILD_COMMON OFF CACHE'
if [ -n "$THIS_CPU_DIR" ]; then
  # The peer a user of this machine has: llama.cpp's AVX-512 kernels (its Q4/Q8 dot products on VNNI where the CPU
  # has it) instead of the portable wheel's AVX2. Named extension by extension from /proc/cpuinfo, not with
  # GGML_NATIVE (see above); kept in a cache folder of its own, so the portable wheel the tests install stays as is.
  cpu_has() { grep -qw "$1" /proc/cpuinfo 2>/dev/null; }
  cpu_has avx512f || { echo "install_llamacpp: this CPU has no AVX-512: the portable build is already its best" >&2; exit 2; }
  CMAKE_FLAGS="${CMAKE_FLAGS/-DGGML_AVX512=OFF/-DGGML_AVX512=ON}"
  for pair in avx512_vnni:VNNI avx512vbmi:VBMI avx512_bf16:BF16; do
    cpu_has "${pair%%:*}" && CMAKE_FLAGS="$CMAKE_FLAGS -DGGML_AVX512_${pair##*:}=ON"
  done
  WHEELS="$WHEELS/llamacpp-this-cpu"
fi
BUILD_RECIPE="$CMAKE_FLAGS; CMakeLists.txt: $COMMON_OFF"  # recorded beside the wheel: what makes a cached one fit

die() { echo "install_llamacpp: $*" >&2; exit 1; }
elapsed() { echo "install_llamacpp: done in $(( $(date +%s) - START )) s ($1)"; }

if [ -z "$WHEEL_ONLY" ]; then
  [ -x "$PY" ] || die "no .venv here: run \`bash scripts/setup.sh\` first"
fi
build_python() {  # --wheel-only: pip from a venv of its own, made only when something is to be downloaded or built
  # (.venv may be being made by scripts/setup.sh at this moment, its pip upgraded under ours). The wheel is py3-none,
  # so this Python builds the same one.
  [ -z "$WHEEL_ONLY" ] || [ -n "${BUILD_VENV:-}" ] && return
  BUILD_VENV=$(mktemp -d)
  trap 'rm -rf "$BUILD_VENV"' EXIT
  "${PYTHON:-python3}" -m venv "$BUILD_VENV" || die "could not make a venv to build in (${PYTHON:-python3} -m venv)"
  PY="$BUILD_VENV/bin/python"
}
[ "$(uname -m)" = x86_64 ] || die "this recipe builds for x86-64 (AVX2); on $(uname -m) build llama-cpp-python $VERSION yourself"
for flag in avx2 fma f16c; do
  grep -qw "$flag" /proc/cpuinfo 2>/dev/null || die "this CPU lacks $flag, which the pinned build flags (-DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON) need"
done
mkdir -p "$WHEELS"

# What makes a cached wheel fit: built here (x86-64 Linux) with the same flags, recorded beside it. The wheel is
# py3-none (the bindings load the library with ctypes), so one build serves every Python 3 of the machine.
WHEEL_NAME=llama_cpp_python-$VERSION-py3-none-linux_x86_64.whl
BUILD_INFO="$WHEELS/$WHEEL_NAME.build-flags"
# One install per cache at a time (#52): a second one waits (at most 30 min) instead of writing the same .part files
# and source tree; the kernel drops the lock of a killed install. What a killed one left is removed under the lock.
exec 9>"$CACHE/.install_llamacpp.lock"
if ! flock -n 9; then
  echo "install_llamacpp: waiting for another install into $CACHE to finish" >&2
  flock -w 1800 9 || die "another install held $CACHE/.install_llamacpp.lock for 30 min"
fi
rm -rf "$CACHE"/.llama.cpp-?????? "$SDIST_DIR/$SDIST.part" "$WHEELS/$WHEEL_NAME.part"
WHEEL=""
[ -f "$WHEELS/$WHEEL_NAME" ] && WHEEL="$WHEELS/$WHEEL_NAME"

fetch_sdist() {  # prints the path of the checked sdist (the cache's copy)
  local dest="$SDIST_DIR/$SDIST"
  if [ ! -f "$dest" ]; then
    if [ -n "${GENPROBE_LLAMACPP_SDIST:-}" ]; then
      cp "$GENPROBE_LLAMACPP_SDIST" "$dest.part"
    else
      local tmp; tmp=$(mktemp -d)
      "$PY" -m pip download -q --disable-pip-version-check --no-binary :all: --no-deps -d "$tmp" \
        "llama-cpp-python==$VERSION" >&2 || die "pip could not download llama-cpp-python==$VERSION (network/registry?)"
      mv "$tmp/$SDIST" "$dest.part" && rm -rf "$tmp"
    fi
    echo "$SDIST_SHA256  $dest.part" | sha256sum -c --quiet - >&2 || { rm -f "$dest.part"; die "$SDIST: sha256 mismatch (expected $SDIST_SHA256)"; }
    mv "$dest.part" "$dest"
  fi
  echo "$dest"
}

build_wheel() {
  command -v c++ >/dev/null || command -v g++ >/dev/null \
    || die "no C++ compiler: install one (Debian/Ubuntu: \`sudo apt-get install g++\`, as scripts/install_system_packages.sh does) and rerun"
  command -v cmake >/dev/null \
    || echo "install_llamacpp: no cmake on PATH; pip will fetch cmake for the build (or: sudo apt-get install cmake)" >&2
  local sdist out root tree
  build_python
  sdist=$(fetch_sdist)
  out=$(mktemp -d)
  root=$(mktemp -d)
  trap "rm -rf '$out' '$root' ${BUILD_VENV:-}" EXIT  # the unpacked sdist (~0.5 GB) goes with the script, whatever ends it
  tar -xzf "$sdist" -C "$root"
  tree="$root/llama_cpp_python-$VERSION"
  grep -qF "$COMMON_ON" "$tree/CMakeLists.txt" || die "$SDIST's CMakeLists.txt no longer forces llama-common on: review the patch"
  sed -i "s/$COMMON_ON/$COMMON_OFF/" "$tree/CMakeLists.txt"
  ! grep -qF "$COMMON_ON" "$tree/CMakeLists.txt" || die "could not turn llama-common off in $tree/CMakeLists.txt"
  echo "install_llamacpp: building llama-cpp-python $VERSION from source with $CMAKE_FLAGS (~2 min on 2 cores)" >&2
  CMAKE_ARGS="$CMAKE_FLAGS" CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" \
    "$PY" -m pip wheel -q --disable-pip-version-check --no-deps -w "$out" "$tree" \
    || die "the build failed (see pip's output above); a C++17 compiler and cmake >= 3.21 are needed"
  [ -f "$out/$WHEEL_NAME" ] || die "the build made $(ls "$out"), not $WHEEL_NAME"
  mv "$out/$WHEEL_NAME" "$WHEELS/$WHEEL_NAME.part" && mv "$WHEELS/$WHEEL_NAME.part" "$WHEELS/$WHEEL_NAME"
  rm -rf "$out" "$root"
  trap - EXIT
  echo "$BUILD_RECIPE" > "$BUILD_INFO"
  WHEEL="$WHEELS/$WHEEL_NAME"
}

extract_source() {  # llama.cpp's tree at this version (converter, gguf-py), once, atomically
  if [ -f "$SOURCE_TREE/convert_hf_to_gguf.py" ] && [ -d "$SOURCE_TREE/gguf-py" ]; then
    return
  fi
  local sdist tmp
  build_python
  sdist=$(fetch_sdist)
  tmp=$(mktemp -d "$CACHE/.llama.cpp-XXXXXX")
  tar -xzf "$sdist" -C "$tmp" "llama_cpp_python-$VERSION/vendor/llama.cpp"
  rm -rf "$SOURCE_TREE" && mv "$tmp/llama_cpp_python-$VERSION/vendor/llama.cpp" "$SOURCE_TREE" && rm -rf "$tmp"
}

how="cached wheel"
if [ -n "${LLAMACPP_REBUILD:-}" ] || [ -z "$WHEEL" ] || [ "$(cat "$BUILD_INFO" 2>/dev/null)" != "$BUILD_RECIPE" ]; then
  build_wheel
  how="built from source"
fi
if [ -n "$WHEEL_ONLY" ]; then
  extract_source
  rm -rf "${BUILD_VENV:-}"
  echo "install_llamacpp: $(basename "$WHEEL") and the source tree are in $CACHE (not installed: --wheel-only)"
  elapsed "$how"
  exit 0
fi
if [ -n "$THIS_CPU_DIR" ]; then
  mkdir -p "$THIS_CPU_DIR"
  "$PY" -m pip install -q --disable-pip-version-check --no-deps --upgrade --target "$THIS_CPU_DIR" "$WHEEL"
  PYTHONPATH="$THIS_CPU_DIR" "$PY" -c "import llama_cpp as lc; print('install_llamacpp:', lc.__file__); print(lc.llama_print_system_info().decode())" \
    || die "the build for this CPU does not load (above)"
  echo "install_llamacpp: put $THIS_CPU_DIR first on PYTHONPATH to use it (benchmarks/llama_speed.py --llamacpp-site $THIS_CPU_DIR)"
  elapsed "$how, for this CPU: $CMAKE_FLAGS"
  exit 0
fi
echo "install_llamacpp: installing $(basename "$WHEEL") ($how)"
"$PY" -m pip install -q --disable-pip-version-check "$WHEEL"
extract_source
echo "install_llamacpp: llama.cpp $VERSION source tree (convert_hf_to_gguf.py, gguf-py): $SOURCE_TREE"
# Loading the library is the check: a wheel built for another CPU fails here, not in the middle of a run.
"$PY" - <<'PYEOF' || die "llama_cpp is installed but not usable (above); rebuild with LLAMACPP_REBUILD=1"
from genprobe.serving.llamacpp.engine import llama_cpp_problem, require_llama_cpp

problem = llama_cpp_problem()
if problem:
    raise SystemExit(problem)
lc = require_llama_cpp()
sampler = lc.llama_sampler_init_top_k(1)
lc.llama_sampler_free(sampler)
print(f"install_llamacpp: llama_cpp {lc.__version__} loads ({lc.__file__})")
PYEOF
elapsed "$how"
