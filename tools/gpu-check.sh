#!/usr/bin/env bash
# The GPU check on a lent GPU machine, as one command (native/README.md, "CUDA backend"): uses the
# gpu_check and libconduit_cuda.so carried from the machine that ran tools/gpu-check-prepare.ts,
# or builds them here without Node when those do not run; then runs the check (correctness and
# the benchmark) under a deadline, printing every figure and writing $OUT/gpu-check.json.
#   bash tools/gpu-check.sh [SPEC_DIR]     (default .gpu-check; OUT defaults to /tmp/gpu-check-out)
set -u
cd "$(dirname "$0")/.."
SPECS=${1:-.gpu-check}
OUT=${OUT:-/tmp/gpu-check-out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader 2>&1 | sed 's/^/nvidia-smi: /'
BIN=native/build/Release
# gpu_check without arguments prints its usage and exits 2: the carried binary loads here.
"$BIN/gpu_check" >/dev/null 2>&1
if [ $? -ne 2 ] || [ ! -f "$BIN/libconduit_cuda.so" ]; then
  echo "building gpu_check and the CUDA plugin here (the carried binaries do not run)"
  start=$(date +%s)
  generator=()
  command -v ninja >/dev/null && generator=(-G Ninja)
  cmake -S native -B /tmp/gpu-check-build "${generator[@]}" -DCMAKE_BUILD_TYPE=Release >"$OUT/cmake.log" 2>&1 &&
    cmake --build /tmp/gpu-check-build -j "$(nproc)" --target gpu_check conduit_cuda >>"$OUT/cmake.log" 2>&1 ||
    { tail -40 "$OUT/cmake.log"; exit 1; }
  echo "built in $(( $(date +%s) - start )) s"
  BIN=/tmp/gpu-check-build/Release
fi
timeout 480 "$BIN/gpu_check" "$SPECS" "$OUT/gpu-check.json"
status=$?
[ $status -eq 124 ] && echo "gpu_check ran past 480 s"
exit $status
