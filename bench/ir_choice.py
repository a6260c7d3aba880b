"""One-off measurement behind the IR choice in docs/design.md: onnx-ir vs onnx-graphsurgeon load/save.

Run in a scratch environment that has both libraries:
    pip install onnx==1.23.2 onnx-ir==1.1.0 onnx-graphsurgeon && python bench/ir_choice.py
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable

import numpy as np
import onnx
from onnx import helper, numpy_helper


def _best(fn: Callable[[], object], repeat: int = 3) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def _big_model(path: str, layers: int = 25, width: int = 1024) -> None:
    rng = np.random.default_rng(0)
    nodes, inits, prev = [], [], "x"
    for i in range(layers):
        inits.append(numpy_helper.from_array(rng.random((width, width), dtype=np.float32), f"w{i}"))
        nodes.append(helper.make_node("MatMul", [prev, f"w{i}"], [f"h{i}"]))
        prev = f"h{i}"
    graph = helper.make_graph(
        nodes,
        "big",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, width])],
        [helper.make_tensor_value_info(prev, onnx.TensorProto.FLOAT, [1, width])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    onnx.save(model, path)


def main() -> None:
    import onnx_graphsurgeon as gs
    import onnx_ir as ir

    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "big.onnx")
        out = os.path.join(tmp, "out.onnx")
        _big_model(src)
        print(f"model: {os.path.getsize(src) / 1e6:.1f} MB")
        loaded_ir = ir.load(src)
        loaded_gs = gs.import_onnx(onnx.load(src))
        rows = [
            ("load", _best(lambda: ir.load(src)), _best(lambda: gs.import_onnx(onnx.load(src)))),
            (
                "save",
                _best(lambda: ir.save(loaded_ir, out)),
                _best(lambda: onnx.save(gs.export_onnx(loaded_gs), out)),
            ),
            (
                "load+save",
                _best(lambda: ir.save(ir.load(src), out)),
                _best(lambda: onnx.save(gs.export_onnx(gs.import_onnx(onnx.load(src))), out)),
            ),
        ]
    print(f"{'operation':12s} {'onnx-ir s':>10s} {'graphsurgeon s':>15s} {'ratio':>6s}")
    for name, a, b in rows:
        print(f"{name:12s} {a:10.3f} {b:15.3f} {a / b:6.2f}")


if __name__ == "__main__":
    main()
