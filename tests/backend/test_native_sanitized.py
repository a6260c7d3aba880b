"""The native kernels built with UndefinedBehaviorSanitizer (abort on the first report) run zoo programs
bit-exactly: no overflow, bad shift or out-of-bounds index hides behind a right answer.

The sanitized library is cached beside the normal one (its own source key), so only the first run builds
it (about 20 s on 2 cores)."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from tests.backend.test_compiler import _compile, digits  # noqa: F401  (module fixture)
from zonnx.backend.native import build_library
from zonnx.backend.runtime.ort_lowering import program_to_model
from zonnx.backend.runtime.reference import run_program
from zonnx.zoo.digits import digits_data

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("target", ["bm1684x", "zhouyi-x2"])
def test_zoo_programs_under_ubsan(digits: dict, target: str) -> None:  # noqa: F811
    lib = build_library(sanitize=True).path
    prog, ins, _ = _compile(digits["qdq"], target)
    info = prog.inputs[0]
    x, _ = digits_data("test")
    q = np.clip(np.rint(x[:32] / info.scale[0]) + info.zero_point[0], info.qmin, info.qmax).astype(info.dtype)
    ref = run_program(prog, {ins[0]: q}, debug=True)
    inner = [t for t in ref if t != ins[0]]
    model = program_to_model(prog, name="p", expose=inner, native=True)
    assert any(n.domain == "zonnx.native" for n in model.graph.node)
    so = ort.SessionOptions()
    so.register_custom_ops_library(str(lib))
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    outs = sess.run(None, {f"p/{ins[0]}": q})
    for o, v in zip(sess.get_outputs(), outs, strict=True):
        assert np.array_equal(v.astype(np.int64), ref[o.name[2:]]), o.name
