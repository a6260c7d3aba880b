#!/usr/bin/env bash
# The exactness subset (pytest -m exactness) under emulated x86 CPUs without VNNI, where ONNX Runtime's
# u8 x s8 kernels saturate (AVX2: Haswell) and on the SSE4.1 path (Haswell without AVX2), with qemu-user.
# Called by `bash tools/dev.sh test` after the native run; installs qemu-user from Debian if missing.
# AVX-512 cannot be emulated by qemu's TCG: a VNNI host covers that path natively.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=.venv

if ! command -v qemu-x86_64 >/dev/null 2>&1; then
  echo "installing qemu-user (Debian) for the emulated exactness run" >&2
  sudo_=""
  [ "$(id -u)" -eq 0 ] || sudo_="sudo"
  $sudo_ apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_ apt-get install -y -qq qemu-user >/dev/null
fi

logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
pids=()
cpus=("Haswell" "Haswell,-avx2")
# OpenBLAS kernels per emulated CPU: a machine-wide OPENBLAS_CORETYPE=Haswell would make numpy execute
# AVX2 code on the SSE4.1 CPU (illegal instruction); Nehalem is OpenBLAS's SSE4 core.
blas=("${OPENBLAS_CORETYPE:-Haswell}" "Nehalem")
for i in "${!cpus[@]}"; do
  cpu=${cpus[$i]}
  log="$logs/${cpu//[,]/_}.log"
  # TCG lists the Haswell features it cannot emulate (none of them matter here) on every start.
  ( OPENBLAS_CORETYPE=${blas[$i]} ZONNX_THREADS=1 qemu-x86_64 -cpu "$cpu" "$venv/bin/python" -m pytest -q \
      -p no:cacheprovider -m exactness --durations=8 > "$log" 2> >(grep -v "TCG doesn't support requested feature" >&2) ) &
  pids+=($!)
done
rc=0
for i in "${!cpus[@]}"; do
  set +e
  wait "${pids[$i]}"
  code=$?
  set -e
  log="$logs/${cpus[$i]//[,]/_}.log"
  echo "=== exactness subset under qemu-x86_64 -cpu ${cpus[$i]} (exit $code) ==="
  cat "$log"
  [ "$code" -eq 0 ] || rc=1  # exit 5 (no tests collected) fails too: the subset must run
done
exit "$rc"
