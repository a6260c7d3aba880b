#!/usr/bin/env bash
# The exactness subset (pytest -m exactness) under emulated x86 CPUs without VNNI, where ONNX Runtime's
# u8 x s8 kernels saturate (AVX2: Haswell) and on the SSE4.1 path (Haswell without AVX2), with qemu-user.
# Called by `bash tools/dev.sh test` after the native run; installs qemu-user from Debian if missing.
# AVX-512 cannot be emulated by qemu's TCG: a VNNI host covers that path natively; an AVX2 host covers
# the Haswell path natively, and only SSE4.1 is emulated there. The exactness tests' quantized models are
# built natively and read under emulation: from $ZONNX_TEST_MODELS when tools/dev.sh's native run left them
# there, else built first into a folder of this script's own (about 15 s; under qemu, minutes per run).
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
own_models=""
trap 'rm -rf "$logs" $own_models' EXIT
if [ -z "${ZONNX_TEST_MODELS:-}" ]; then
  ZONNX_TEST_MODELS=$(mktemp -d)
  own_models="$ZONNX_TEST_MODELS"
  export ZONNX_TEST_MODELS
  echo "=== building the exactness tests' quantized models natively ===" >&2
  "$venv/bin/python" -m pytest -q -p no:cacheprovider --setup-only -m exactness \
    tests/backend/test_compiler.py tests/backend/test_ort_lowering.py > "$logs/build.log" 2>&1 \
    || { cat "$logs/build.log" >&2; exit 1; }
fi
# The subset's files: the test modules that carry the marker. Naming them keeps qemu from importing every
# test module only to deselect it (that collection alone took about 3.5 of the 7.3 minutes of the SSE4.1
# half on AMD EPYC Zen 3); tests/test_exactness_files.py fails when a marked test sits in a file this
# pattern does not find.
mapfile -t subset < <(grep -rlE --include='test_*.py' 'mark\.exactness' tests | sort)
[ "${#subset[@]}" -gt 0 ] || { echo "no test module carries pytest.mark.exactness" >&2; exit 1; }
# One job per emulated CPU: its qemu -cpu model, OpenBLAS core and pytest arguments. A machine-wide
# OPENBLAS_CORETYPE=Haswell would make numpy execute AVX2 code on the SSE4.1 CPU (illegal instruction);
# Nehalem is OpenBLAS's SSE4 core.
jobs_cpu=("Haswell" "Haswell,-avx2")
jobs_blas=("${OPENBLAS_CORETYPE:-Haswell}" "Nehalem")
jobs_args=("${subset[*]}" "${subset[*]}")
# A host whose integer kernels are the AVX2 ones (AMD Zen 1-3, Intel before VNNI) ran the AVX2 path in
# the native suite already: emulating Haswell would repeat it. Only SSE4.1 is emulated then, in two
# halves side by side (qemu-user runs one process: pytest-xdist's workers would escape it): the
# whole-ResNet-18 file in one and the rest in the other (4.4 and 5.2 minutes on AMD EPYC Zen 3, 2026-11-28).
host_isa=$("$venv/bin/python" -c 'from zonnx.hostcpu import host_int; print(host_int().isa)')
if [ "$host_isa" = "avx2" ]; then
  echo "=== exactness subset: this host's integer path is AVX2 (run natively); emulating only SSE4.1 ===" >&2
  big=tests/backend/test_ort_lowering.py
  rest=()
  for f in "${subset[@]}"; do [ "$f" = "$big" ] || rest+=("$f"); done
  jobs_cpu=("Haswell,-avx2" "Haswell,-avx2")
  jobs_blas=("Nehalem" "Nehalem")
  jobs_args=("$big" "${rest[*]}")
fi
pids=()
for i in "${!jobs_cpu[@]}"; do
  log="$logs/$i.log"
  # TCG lists the Haswell features it cannot emulate (none of them matter here) on every start.
  # shellcheck disable=SC2086  # jobs_args[i] is a list of pytest arguments without spaces inside
  ( OPENBLAS_CORETYPE=${jobs_blas[$i]} ZONNX_THREADS=1 qemu-x86_64 -cpu "${jobs_cpu[$i]}" "$venv/bin/python" \
      -m pytest -q -p no:cacheprovider -m exactness --durations=8 ${jobs_args[$i]} > "$log" \
      2> >(grep -v "TCG doesn't support requested feature" >&2) ) &
  pids+=($!)
done
rc=0
for i in "${!jobs_cpu[@]}"; do
  set +e
  wait "${pids[$i]}"
  code=$?
  set -e
  echo "=== exactness subset under qemu-x86_64 -cpu ${jobs_cpu[$i]}: ${jobs_args[$i]} (exit $code) ==="
  cat "$logs/$i.log"
  [ "$code" -eq 0 ] || rc=1  # exit 5 (no tests collected) fails too: the subset must run
done
exit "$rc"
