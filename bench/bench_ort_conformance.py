"""ONNX Runtime's own quantization tests, run with ORT's ``quantize_static`` and with zonnx's in its place.

The tests come from a local snapshot of ORT's repository (a git directory, e.g. the one the search
tool's ``fetch`` brings): ``onnxruntime/test/python/quantization/`` is extracted with ``git archive`` into
a temporary folder, never into this repository, and pytest runs there twice in child processes:

* ``ort``: as written, with the installed onnxruntime;
* ``zonnx``: a generated ``conftest.py`` first rebinds ``quantize_static`` (and ``quantize``,
  ``get_qdq_config``, ``StaticQuantConfig``' consumer) in ``onnxruntime.quantization`` and its
  submodules to zonnx's, so every name the tests import resolves to zonnx.

A test counts once per test function: it passes only when all its subtests pass. The figure is
``passed with zonnx / passed with ORT`` over the test files that quantize statically (files naming
``quantize_static``, ``get_qdq_config`` or ``StaticQuantConfig``); tests that fail with ORT itself are
not counted.

The pinned onnx writes a newer IR version by default than the pinned onnxruntime loads, which fails
many of ORT's tests with ORT itself; in both runs the conftest caps ``onnx.helper.make_model``'s default
IR version at the newest one the installed onnxruntime loads (an explicit ``ir_version`` is kept).

Run ``python -m bench.bench_ort_conformance --snapshot /path/to/repo.git [--commit REV] [-k EXPR]`` or
``python -m bench.runner ort_conformance`` (snapshot from ``ZONNX_ORT_SNAPSHOT``).
"""

from __future__ import annotations

__all__ = ["ConformanceResult", "run_conformance", "bench_ort_conformance", "main"]

import argparse
import dataclasses
import logging
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

from bench.header import host_lines

logger = logging.getLogger(__name__)

TEST_DIR = "onnxruntime/test/python/quantization"
#: A test file is counted when it names one of these (it exercises static quantization).
STATIC_NAMES = ("quantize_static", "get_qdq_config", "StaticQuantConfig")
#: Where to find the git directory of an ORT repository (a clone of github.com/microsoft/onnxruntime).
SNAPSHOT_ENV = "ZONNX_ORT_SNAPSHOT"


def snapshot_from_env() -> str:
    """The snapshot named by ``ZONNX_ORT_SNAPSHOT``; a clear SystemExit when it is not set."""
    path = os.environ.get(SNAPSHOT_ENV)
    if not path:
        raise SystemExit(
            f"ort_conformance: set {SNAPSHOT_ENV} (or pass --snapshot) to the git directory of an "
            "onnxruntime repository clone (git clone https://github.com/microsoft/onnxruntime)."
        )
    return path


#: Written into the extracted folder for the zonnx run: rebinds ORT's static entry points to zonnx's.
_PATCH = """
import os, sys, importlib, pkgutil
import onnx.helper
import onnxruntime

_MAX_IR = int(os.environ.get("ZONNX_CONFORMANCE_MAX_IR", "0"))
if _MAX_IR:
    _make_model = onnx.helper.make_model

    def make_model(graph, **kwargs):
        model = _make_model(graph, **kwargs)
        if "ir_version" not in kwargs and model.ir_version > _MAX_IR:
            model.ir_version = _MAX_IR
        return model

    onnx.helper.make_model = make_model

if os.environ.get("ZONNX_CONFORMANCE") == "1":
    import zonnx
    import onnxruntime.quantization as _q

    def _zonnx_quantize_static(*args, **kwargs):
        zonnx.quantize_static(*args, **kwargs)

    def _zonnx_quantize(model_input, model_output, quant_config):
        zonnx.quantize(model_input, model_output, quant_config)

    _names = {"quantize_static": _zonnx_quantize_static}
    if hasattr(zonnx, "quantize"):
        _names["quantize"] = _zonnx_quantize
    for _info in pkgutil.walk_packages(_q.__path__, _q.__name__ + "."):
        try:
            importlib.import_module(_info.name)
        except Exception:
            pass
    for _name, _mod in list(sys.modules.items()):
        if _name == _q.__name__ or _name.startswith(_q.__name__ + "."):
            for _attr, _fn in _names.items():
                if callable(getattr(_mod, _attr, None)):
                    setattr(_mod, _attr, _fn)
"""


@dataclasses.dataclass
class ConformanceResult:
    """Per-test outcomes of both runs (test id -> passed)."""

    commit: str
    ort: dict[str, bool]
    zonnx: dict[str, bool]

    @property
    def ort_passed(self) -> set[str]:
        return {t for t, ok in self.ort.items() if ok}

    @property
    def zonnx_passed(self) -> set[str]:
        return {t for t, ok in self.zonnx.items() if ok} & self.ort_passed

    @property
    def failing(self) -> list[str]:
        return sorted(self.ort_passed - self.zonnx_passed)


def _git(snapshot: str, *args: str) -> bytes:
    return subprocess.run(["git", "--git-dir", snapshot, *args], check=True, capture_output=True).stdout


def _git_dir(snapshot: str) -> str:
    path = Path(snapshot)
    return str(path / ".git") if (path / ".git").is_dir() else str(path)


def extract(snapshot: str, commit: str, dest: Path) -> list[str]:
    """Extract ORT's quantization test folder at ``commit`` into ``dest``; return the static test files."""
    archive = _git(snapshot, "archive", "--format=tar", commit, TEST_DIR)
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    folder = dest / TEST_DIR
    files = sorted(
        p.name
        for p in folder.glob("test_*.py")
        if any(name in p.read_text(encoding="utf-8", errors="replace") for name in STATIC_NAMES)
    )
    (folder / "conftest.py").write_text(_PATCH, encoding="utf-8")
    (folder / "pytest.ini").write_text("[pytest]\n", encoding="utf-8")
    return files


def _outcomes(xml_path: Path) -> dict[str, bool]:
    """Test id -> passed, from pytest's junit XML (any failure/error in a test function fails it)."""
    result: dict[str, bool] = {}
    for case in ET.parse(xml_path).iter("testcase"):
        tid = f"{case.get('classname')}::{case.get('name')}"
        bad = any(child.tag in ("failure", "error") for child in case)
        skipped = any(child.tag == "skipped" for child in case)
        ok = not bad and not skipped
        result[tid] = result.get(tid, True) and ok
    return result


def max_ir_version() -> int:
    """The newest ONNX IR version the installed onnxruntime loads (probed with an Identity model)."""
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        "probe",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    for ir_version in range(onnx.IR_VERSION, 6, -1):
        model.ir_version = ir_version
        try:
            ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        except Exception:  # noqa: BLE001 - any load failure means: try an older IR version
            continue
        return ir_version
    return 7


def _run_pytest(
    folder: Path, files: list[str], zonnx: bool, keyword: str | None, tag: str
) -> dict[str, bool]:
    env = {**os.environ, "ZONNX_CONFORMANCE": "1" if zonnx else "0", "PYTHONDONTWRITEBYTECODE": "1"}
    env.setdefault("OMP_NUM_THREADS", "1")
    env["ZONNX_CONFORMANCE_MAX_IR"] = str(max_ir_version())
    xml = folder / f"results-{tag}.xml"
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c", str(folder / "pytest.ini"),
           "--rootdir", str(folder), f"--junitxml={xml}", "-o", "junit_family=xunit1", *files]  # fmt: skip
    if keyword:
        cmd += ["-k", keyword]
    logger.info("running ORT's tests with %s quantize_static", "zonnx's" if zonnx else "ORT's")
    proc = subprocess.run(cmd, cwd=folder, env=env, capture_output=True, text=True)
    if not xml.exists():
        raise RuntimeError(f"pytest wrote no results ({tag}): {proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    return _outcomes(xml)


def run_conformance(
    snapshot: str, commit: str = "HEAD", keyword: str | None = None, files: list[str] | None = None
) -> ConformanceResult:
    """Extract the tests to a temporary folder and run them with ORT's then zonnx's quantize_static."""
    git_dir = _git_dir(snapshot)
    rev = _git(git_dir, "rev-parse", commit).decode().strip()
    with tempfile.TemporaryDirectory(prefix="zonnx-ort-conformance-") as tmp:
        found = extract(git_dir, rev, Path(tmp))
        chosen = [f for f in found if not files or f in files or f.removesuffix(".py") in files]
        folder = Path(tmp) / TEST_DIR
        ort = _run_pytest(folder, chosen, False, keyword, "ort")
        ours = _run_pytest(folder, chosen, True, keyword, "zonnx")
    return ConformanceResult(rev, ort, ours)


def bench_ort_conformance(ctx: object) -> list[object]:
    """bench.runner entry: the share of ORT-passing tests that pass with zonnx (snapshot from the env)."""
    from bench.runner import HIGHER, Measurement

    snapshot = snapshot_from_env()
    result = run_conformance(snapshot, files=["test_op_gemm", "test_qdq"] if ctx.quick else None)
    _print(result)
    return [
        Measurement(
            "ORT quantization tests passing with zonnx",
            len(result.zonnx_passed),
            "tests",
            HIGHER,
            peer="ORT",
            peer_value=len(result.ort_passed),
            target=0.95,
            note=f"snapshot {result.commit[:10]}",
        )
    ]


def _print(result: ConformanceResult) -> None:
    ort, ours = len(result.ort_passed), len(result.zonnx_passed)
    for line in host_lines():
        print(f"- {line}")
    print(f"snapshot commit {result.commit}")
    print(f"passed with zonnx / passed with ORT: {ours} / {ort} ({100 * ours / max(ort, 1):.1f}%)")
    if result.failing:
        print("failing with zonnx:")
        for tid in result.failing:
            print(f"  {tid}")


def main(argv: list[str] | None = None) -> int:
    """Command line: print the figure and the failing test ids."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--snapshot", default=os.environ.get(SNAPSHOT_ENV),
                        help=f"git directory of an ORT repository clone (default: ${SNAPSHOT_ENV})")  # fmt: skip
    parser.add_argument("--commit", default="HEAD", help="revision of the snapshot to test (HEAD)")
    parser.add_argument("-k", dest="keyword", help="pytest -k expression to run a subset")
    parser.add_argument("--files", nargs="*", help="test file names to run (default: all static ones)")
    args = parser.parse_args(argv)
    if not args.snapshot:
        snapshot_from_env()  # says what to set
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    _print(run_conformance(args.snapshot, args.commit, args.keyword, args.files))
    return 0


if __name__ == "__main__":
    sys.exit(main())
