"""Build the native kernel library ``libzonnx_npu_kernels.so`` from ``src/*.cpp`` against ORT's C API headers.

The headers (ONNX Runtime 1.17, MIT) come from the ``amd-quark==0.13`` wheel on PyPI: ``pip download
--no-deps --only-binary :all: amd-quark==0.13`` into ``<native dir>/wheels``, and only the four header
files under ``quark/onnx/operators/custom_ops/include/onnxruntime-1.17.0/onnxruntime/core/session/`` are
extracted to ``<native dir>/headers``. Nothing of it is committed. The library talks to ORT only through
the ``OrtApiBase*`` that ``RegisterCustomOps`` receives (``GetApi(17)``); it does not link libonnxruntime.

Build: every source compiled in parallel with ``g++ -std=c++17 -O3 -fPIC -fvisibility=hidden -Wall
-Wextra -Wshadow`` (ORT's headers as system headers; portable x86-64 baseline: no ``-march=native``, the kernels are pure integer code and exact on
every CPU), linked ``-shared``. The library is cached as ``<native dir>/<key>/libzonnx_npu_kernels.so``
where ``key`` hashes the sources, the flags and the ABI version, so a source change builds a new library
and a stale one is never loaded. ``<native dir>`` is ``$ZONNX_NATIVE_DIR``, else
``$XDG_CACHE_HOME/zonnx/native``, else ``~/.cache/zonnx/native``.
"""

from __future__ import annotations

__all__ = [
    "ABI_VERSION",
    "LIB_NAME",
    "NativeBuildError",
    "BuildResult",
    "native_dir",
    "source_key",
    "library_path",
    "fetch_headers",
    "build_library",
]

import dataclasses
import hashlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

from zonnx.errors import ZonnxError

logger = logging.getLogger(__name__)

#: Must equal ``kAbiVersion`` in ``src/zonnx_native.h`` (the loader refuses a library reporting another).
ABI_VERSION = 8
LIB_NAME = "libzonnx_npu_kernels.so"
SRC_DIR = Path(__file__).resolve().parent / "src"
WHEEL = "amd-quark==0.13"
_HEADER_DIR = "quark/onnx/operators/custom_ops/include/onnxruntime-1.17.0/onnxruntime/core/session/"
_HEADERS = (
    "onnxruntime_c_api.h",
    "onnxruntime_cxx_api.h",
    "onnxruntime_cxx_inline.h",
    "onnxruntime_float16.h",
)
FLAGS = ("-std=c++17", "-O3", "-fPIC", "-fvisibility=hidden", "-Wall", "-Wextra", "-Wshadow")
SANITIZE = ("-fsanitize=undefined", "-fno-sanitize-recover=all", "-fno-omit-frame-pointer")


class NativeBuildError(ZonnxError):
    """The native kernel library could not be built (the message names the step and the log)."""


@dataclasses.dataclass(frozen=True)
class BuildResult:
    """A built (or cached) library: its path, whether this call compiled it, and the seconds it took."""

    path: Path
    built: bool
    seconds: float


def native_dir() -> Path:
    """``$ZONNX_NATIVE_DIR``, else ``$XDG_CACHE_HOME/zonnx/native``, else ``~/.cache/zonnx/native``."""
    if os.environ.get("ZONNX_NATIVE_DIR"):
        return Path(os.environ["ZONNX_NATIVE_DIR"]).expanduser()
    home = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(home) / "zonnx" / "native"


def _sources() -> list[Path]:
    return sorted(p for p in SRC_DIR.iterdir() if p.suffix in (".cpp", ".h"))


def source_key(sanitize: bool = False) -> str:
    """16 hex digits of sha256 over the sources, the compile flags and the ABI version."""
    h = hashlib.sha256(f"abi={ABI_VERSION};flags={' '.join(FLAGS)};san={int(sanitize)}".encode())
    for p in _sources():
        h.update(p.name.encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def library_path(sanitize: bool = False) -> Path:
    """Where the library for the current sources lives (it may not be built yet)."""
    suffix = "-ubsan" if sanitize else ""
    return native_dir() / f"{source_key(sanitize)}{suffix}" / LIB_NAME


def fetch_headers(root: Path | None = None) -> Path:
    """The folder holding ORT 1.17's C/C++ API headers, downloading the wheel once; NativeBuildError if unreachable."""
    root = root or native_dir()
    hdr = root / "headers" / "onnxruntime-1.17"
    if all((hdr / n).is_file() for n in _HEADERS):
        return hdr
    wheels = root / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    found = sorted(wheels.glob("amd_quark-0.13-*.whl"))
    if not found:
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary", ":all:", WHEEL]
        proc = subprocess.run([*cmd, "-d", str(wheels)], capture_output=True, text=True, check=False)
        found = sorted(wheels.glob("amd_quark-0.13-*.whl"))
        if proc.returncode != 0 or not found:
            last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            raise NativeBuildError(
                f"cannot download the ORT headers' wheel ({WHEEL}): {last[:200]}; the NPU runs on the "
                "pure-ONNX lowering (retry with network access: python -m zonnx.tools.build_native)."
            )
    tmp = Path(tempfile.mkdtemp(prefix="hdr-", dir=root))
    try:
        with zipfile.ZipFile(found[-1]) as zf:
            for n in _HEADERS:
                (tmp / n).write_bytes(zf.read(_HEADER_DIR + n))
        hdr.parent.mkdir(parents=True, exist_ok=True)
        if hdr.exists():
            shutil.rmtree(hdr)
        tmp.rename(hdr)
    except (OSError, KeyError, zipfile.BadZipFile) as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise NativeBuildError(
            f"{found[-1]}: the ORT headers cannot be extracted ({e}); delete it and retry."
        ) from None
    return hdr


def _compiler() -> str:
    cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if not cxx:
        raise NativeBuildError(
            "no C++ compiler (g++ or $CXX) on this machine; the NPU runs on the pure-ONNX lowering "
            "(install g++ and run python -m zonnx.tools.build_native for the native kernels)."
        )
    return cxx


def build_library(force: bool = False, sanitize: bool = False) -> BuildResult:
    """Compile the library for the current sources unless it is cached (module docstring)."""
    out = library_path(sanitize)
    if out.is_file() and not force:
        return BuildResult(out, False, 0.0)
    start = time.perf_counter()
    cxx = _compiler()
    hdr = fetch_headers()
    out.parent.mkdir(parents=True, exist_ok=True)
    log = out.parent / "build.log"
    work = Path(tempfile.mkdtemp(prefix="obj-", dir=out.parent))
    flags = [*FLAGS, *(SANITIZE if sanitize else ())]
    try:
        procs = []
        with log.open("w", encoding="utf-8") as fh:
            for src in (p for p in _sources() if p.suffix == ".cpp"):
                cmd = [cxx, *flags, "-isystem", str(hdr), "-c", str(src), "-o", str(work / (src.stem + ".o"))]
                fh.write(" ".join(cmd) + "\n")
                fh.flush()
                procs.append(subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT))
            codes = [p.wait() for p in procs]
            tmp_lib = work / LIB_NAME
            if not any(codes):
                cmd = [cxx, *flags, "-shared", "-o", str(tmp_lib), *map(str, sorted(work.glob("*.o")))]
                fh.write(" ".join(cmd) + "\n")
                fh.flush()
                codes.append(subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, check=False).returncode)
        if any(codes):
            text = log.read_text(encoding="utf-8", errors="replace").splitlines()
            first = next((ln for ln in text if "error" in ln), text[-1] if text else "no output")
            raise NativeBuildError(
                f"the native kernels did not compile: {first.strip()[:240]} (full log: {log})"
            )
        os.replace(tmp_lib, out)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    seconds = time.perf_counter() - start
    logger.info("built %s in %.1f s", out, seconds)
    return BuildResult(out, True, seconds)
