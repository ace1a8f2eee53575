#!/usr/bin/env bash
# Build (once) and install llama-cpp-python with a CPU level that runs on this machine and on any
# machine of the same level -- never -march=native on x86 (its AMX tile kernels fault where the CPU reports
# AMX that the OS does not enable, and a native wheel cached by pip crashes on an older CPU).
#   level x86-64-v3: AVX, AVX2, FMA, F16C, BMI2 (every x86-64 CPU since 2013-2015); no AVX-512, no AMX
#   level x86-64-v4-vnni, only when asked (ECDYSIS_LLAMA_LEVEL=x86-64-v4-vnni) on a CPU that has it: x86-64-v3
#                    plus AVX-512 F/BW/CD/DQ/VL, VNNI and VBMI (Ice Lake and later Xeons, AMD Zen 4 and later), no
#                    AMX: prompt processing 1.59x the v3 build's on a 2-core Xeon; its numerics differ a little
#                    (docs/setup.md). Not the default: the tests and the rate table are run on x86-64-v3.
#   level x86-64:    SSE only (older CPUs; much slower)
#   other machines (aarch64, ...): llama.cpp's defaults for that architecture
# The wheel is kept in a cache folder named by version and level, so a cache shared across machines never
# hands a wheel to a CPU that cannot run it. Installing is skipped when the installed llama-cpp-python
# already came from that wheel; any other install of it (e.g. a native build from pip's cache) is replaced.
#   Usage: scripts/llama_wheel.sh PIP [VERSION]      (ECDYSIS_WHEEL_CACHE overrides the cache folder)
#          scripts/llama_wheel.sh --level              prints the level it would build here, and builds nothing
#   Rebuild: rm -rf ~/.cache/ecdysis/wheels/llama-cpp-python-VERSION-LEVEL, then run it again.
set -euo pipefail
PIP="$1"; VERSION="${2:-0.3.36}"
PY="$(dirname -- "$PIP")/python"
arch="$(uname -m)"
flags="$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null || true)"
has() { [[ " $flags " == *" $1 "* ]]; }
common="-DGGML_NATIVE=OFF -DGGML_AVX512_BF16=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF -DGGML_AVX_VNNI=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF"
v3="-DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON"
noavx512="-DGGML_AVX512=OFF -DGGML_AVX512_VBMI=OFF -DGGML_AVX512_VNNI=OFF"
avx512=(avx512f avx512bw avx512cd avx512dq avx512vl avx512_vnni avx512vbmi)
asked="${ECDYSIS_LLAMA_LEVEL:-}"
nox86=""
if [[ -n "$asked" && "$asked" != x86-64-v4-vnni && "$asked" != x86-64-v3 ]]; then
  echo "error: ECDYSIS_LLAMA_LEVEL=$asked is not a level this script builds: unset it, or x86-64-v4-vnni (AVX-512) or x86-64-v3" >&2
  exit 2
fi
if [[ "$asked" == x86-64-v4-vnni ]]; then
  missing=""; for f in avx2 fma f16c bmi2 "${avx512[@]}"; do has "$f" || missing="$missing $f"; done
  if [[ "$arch" != x86_64 || -n "$missing" ]]; then
    echo "error: ECDYSIS_LLAMA_LEVEL=x86-64-v4-vnni needs an x86-64 CPU with AVX-512; this one lacks:${missing:- x86-64} (unset ECDYSIS_LLAMA_LEVEL for the portable x86-64-v3 build)" >&2
    exit 2
  fi
  level=x86-64-v4-vnni; cmake="$common $v3 -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON"
elif [[ "$arch" == x86_64 ]] && has avx2 && has fma && has f16c && has bmi2; then
  level=x86-64-v3; cmake="$common $v3 $noavx512"
elif [[ "$asked" == x86-64-v3 ]]; then
  echo "error: ECDYSIS_LLAMA_LEVEL=x86-64-v3 needs an x86-64 CPU with AVX2, FMA, F16C and BMI2; unset it for the level this CPU runs" >&2
  exit 2
elif [[ "$arch" == x86_64 ]]; then
  level=x86-64; cmake="$common $noavx512 -DGGML_AVX=OFF -DGGML_AVX2=OFF -DGGML_FMA=OFF -DGGML_F16C=OFF -DGGML_BMI2=OFF"
else
  level="$arch-native"; cmake="-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF"; nox86=1
fi
if [[ "$PIP" == --level ]]; then echo "$level"; exit 0; fi
dir="${ECDYSIS_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ecdysis/wheels}/llama-cpp-python-$VERSION-$level"
mkdir -p "$(dirname "$dir")"
exec 9>"$dir.lock"  # two setups at once: the second waits for the first one's wheel
command -v flock >/dev/null && flock 9
if ! ls "$dir"/llama_cpp_python-"$VERSION"-*.whl >/dev/null 2>&1; then
  command -v c++ >/dev/null || command -v g++ >/dev/null || command -v clang++ >/dev/null || {
    echo "error: building llama-cpp-python needs a C/C++ compiler: sudo apt-get install build-essential" >&2; exit 1; }
  echo "building llama-cpp-python $VERSION for $level (about 6 minutes on 2 cores; once per cache: $dir)"
  rm -rf "$dir.tmp"; mkdir -p "$dir.tmp"
  # -mno-amx-*: belt and braces, in case a future CMake default turns the tiles back on.
  noamx=""; [[ -z "$nox86" ]] && noamx="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
  if ! CMAKE_ARGS="$cmake" CFLAGS="$noamx" CXXFLAGS="$noamx" \
      "$PIP" wheel --no-deps --no-cache-dir --no-binary llama-cpp-python -w "$dir.tmp" \
      "llama-cpp-python==$VERSION" >"$dir.tmp/build.log" 2>&1; then
    tail -n 40 "$dir.tmp/build.log" >&2
    echo "error: building llama-cpp-python failed; full log: $dir.tmp/build.log" >&2
    exit 1
  fi
  rm -rf "$dir"; mkdir -p "$dir"
  mv "$dir.tmp"/llama_cpp_python-*.whl "$dir.tmp/build.log" "$dir"/
  rm -rf "$dir.tmp"
fi
wheel="$(ls "$dir"/llama_cpp_python-"$VERSION"-*.whl | head -n 1)"
# where the installed llama-cpp-python came from (pip's direct_url.json), if it is installed at all
from="$("$PY" - <<'EOF' 2>/dev/null || true
import json
from importlib import metadata
print(json.loads(metadata.distribution("llama_cpp_python").read_text("direct_url.json") or "{}").get("url", ""))
EOF
)"
if [[ "$from" == "file://$wheel" ]]; then
  echo "llama-cpp-python $VERSION ($level) already installed from $wheel"
else
  "$PIP" install -q --no-deps --force-reinstall "$wheel"
  echo "llama-cpp-python $VERSION ($level) installed from $wheel"
fi
