#!/usr/bin/env bash
# Set up the repo's virtual environment with pinned dependencies (once; again when pyproject.toml
# changes), then run one job:
#   bash tools/dev.sh build [zonnx build args]   the main job on the embedded default model
#   bash tools/dev.sh test  [pytest args]        lint + the whole test suite (what .ci/run calls); without
#                                                args, then the exactness subset under emulated AVX2 and
#                                                SSE4.1 CPUs (tools/exactness.sh, qemu-user)
set -euo pipefail
cd "$(dirname "$0")/.."
job=${1:-build}
shift || true

pick_python() {
  for py in "${PYTHON:-}" python3.11 python3; do
    [ -n "$py" ] && command -v "$py" >/dev/null 2>&1 || continue
    if "$py" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then echo "$py"; return; fi
  done
  echo "zonnx needs Python 3.11 (set PYTHON=/path/to/python3.11)" >&2
  exit 2
}

venv=.venv
if [ ! -x "$venv/bin/python" ]; then
  "$(pick_python)" -m venv "$venv"
fi
stamp="$venv/.zonnx-deps"
want=$(cat pyproject.toml tools/dev.sh | sha256sum | cut -c1-16)
if [ "$(cat "$stamp" 2>/dev/null || true)" != "$want" ]; then
  echo "setting up $venv (pinned dependencies; first time takes about a minute)" >&2
  "$venv/bin/python" -m pip install -q --upgrade pip
  # torch first and pinned: an unpinned torch resolves to a multi-GB CUDA build.
  "$venv/bin/python" -m pip install -q "torch==2.13.0"
  "$venv/bin/python" -m pip install -q -e ".[dev,tf]"
  # Only the PP-OCR model files are needed from this wheel, not its OpenCV dependencies.
  "$venv/bin/python" -m pip install -q --no-deps "rapidocr-onnxruntime==1.4.4"
  echo "$want" > "$stamp"
fi
# The native NPU kernels (C++ custom ops for ORT, cached by source hash under ~/.cache/zonnx/native):
# built when their sources change; a failed build prints one line and the NPU uses the ONNX lowering.
nstamp="$venv/.zonnx-native"
nwant=$(cat backend/native/src/* backend/native/build.py | sha256sum | cut -c1-16)
if [ "$(cat "$nstamp" 2>/dev/null || true)" != "$nwant" ]; then
  "$venv/bin/python" -m zonnx.tools.build_native && echo "$nwant" > "$nstamp"
fi

# The report test renders report.html in Debian's chromium, driven by Playwright (pinned in the dev extra)
# with executable_path: no browser is downloaded. Installed from Debian when missing (root or sudo).
setup_report_browser() {
  command -v chromium >/dev/null 2>&1 && return 0
  echo "installing Debian's chromium (tests/deploy renders report.html in it)" >&2
  local sudo_=""
  [ "$(id -u)" -eq 0 ] || sudo_="sudo"
  $sudo_ apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_ apt-get install -y -qq chromium >/dev/null
}

case "$job" in
  build)
    exec "$venv/bin/zonnx" build "$@"
    ;;
  test)
    setup_report_browser
    "$venv/bin/ruff" check .
    # The exactness tests' quantized models, built once by the native run and read by the emulated runs.
    ZONNX_TEST_MODELS=$(mktemp -d)
    export ZONNX_TEST_MODELS
    trap 'rm -rf "$ZONNX_TEST_MODELS"' EXIT
    # The whole suite runs on up to 4 cores (pytest-xdist, one module per worker: module fixtures are
    # built once); a selection given as arguments runs in one process.
    parallel=()
    if [ "$#" -eq 0 ]; then
      cores=$(nproc)
      parallel=(-n "$(( cores < 4 ? cores : 4 ))" --dist loadscope)
    fi
    set +e
    "$venv/bin/python" -m pytest -q "${parallel[@]}" "$@"
    rc=$?
    set -e
    if [ "$rc" -eq 5 ]; then
      echo "pytest collected no tests (exit 5): a selection that matches nothing, or broken collection" >&2
    fi
    # The whole suite (no arguments, as CI runs it) also proves exactness on emulated non-VNNI CPUs.
    if [ "$rc" -eq 0 ] && [ "$#" -eq 0 ]; then
      bash tools/exactness.sh || rc=$?
    fi
    exit "$rc"
    ;;
  *)
    echo "usage: bash tools/dev.sh build|test [args]" >&2
    exit 2
    ;;
esac
