"""The op registry (zonnx.backend.ops): one module per op kind, every kind complete, and no import cycle
in the backend, counting imports inside functions too."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from zonnx.backend.ops import registry

BACKEND = Path(registry.__file__).resolve().parents[1]
#: Every program op kind the compiler emits (program format 1).
KINDS = {
    "conv", "matmul", "matmul2", "mul", "lincomb", "add", "rescale", "avgpool", "maxpool", "concat", "lut",
    "prelu", "clamp", "copy", "reshape", "flatten", "transpose", "squeeze", "unsqueeze", "resize_nearest",
    "slice", "gather", "pad",
}  # fmt: skip
#: The modules that drive the op modules (they may import zonnx.backend.ops; machinery may not).
DRIVERS = {
    "zonnx.backend.compiler.lower",
    "zonnx.backend.runtime.reference",
    "zonnx.backend.runtime.ort_lowering",
    "zonnx.backend.partition.lowerable",
}


def test_every_kind_registered_once_with_reference_and_lowering() -> None:
    assert set(registry.KINDS) == KINDS
    for name, kind in registry.KINDS.items():
        assert kind.name == name and callable(kind.reference) and callable(kind.ort)
        assert kind.layout in ("program", "input") or callable(kind.layout), name
    sources = "".join(f.read_text() for f in (BACKEND / "native" / "src").glob("*.cpp"))
    native = {n for kind in registry.KINDS.values() for n in kind.native}
    assert {"QConv", "DwConv", "RequantU8"} <= native
    assert all(f'"{n}"' in sources for n in native), native  # each named kernel is a custom op of the library
    modules = [spec.module for spec in registry.MODULES]
    assert len(modules) == len(set(modules)) and all(m.startswith("zonnx.backend.ops.") for m in modules)


def test_pending_rules_pick_the_specific_kind_first() -> None:
    """MatMul of two activations before the weight matmul; Add with a constant and Mul by a float
    scalar as lincomb; the claim-free rule last."""
    order = {
        op: [r.lower.__module__.rsplit(".", 1)[1] for r in registry.pending_rules(op)]
        for op in registry.PENDING_OPS
    }
    assert order["MatMul"] == ["matmul2", "matmul"]
    assert order["Add"] == ["lincomb", "add"]
    assert order["Mul"] == ["mul", "lincomb"]
    assert all(registry.pending_rules(op)[-1].claims is None for op in registry.PENDING_OPS)
    assert registry.lowerable_op_types() >= {"Conv", "Slice", "Split", "Relu", "Sigmoid", "PRelu"}
    assert registry.constant_input_indices("Slice") == (1, 2, 3, 4)
    assert registry.constant_input_indices("MatMul") == ()


def _modules() -> dict[str, Path]:
    out = {}
    for f in BACKEND.rglob("*.py"):
        parts = ["zonnx", "backend", *f.relative_to(BACKEND).with_suffix("").parts]
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    return out


def _imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """Backend modules ``name`` imports anywhere in its file (a dotted import also runs its packages)."""
    pkg = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            found |= {base} | {f"{base}.{a.name}" for a in node.names}
    out = set()
    for dotted in found:
        parts = dotted.split(".")
        for i in range(2, len(parts) + 1):
            p = ".".join(parts[:i])
            if p in known and p != name and not name.startswith(p + "."):  # own packages are importing
                out.add(p)
    return out


def test_backend_has_no_import_cycle() -> None:
    known = _modules()
    graph = {m: _imports(m, f, known) for m, f in known.items()}
    state: dict[str, int] = {}  # 1 on the stack, 2 done

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for d in sorted(graph[m]):
            if state.get(d) == 1:
                pytest.fail(f"import cycle: {' -> '.join([*path[path.index(d) :], d])}")
            if d not in state:
                visit(d, [*path, d])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    users = {m for m, deps in graph.items() if any(d.startswith("zonnx.backend.ops") for d in deps)}
    assert users - DRIVERS <= {m for m in known if m.startswith("zonnx.backend.ops.")}  # machinery never


@pytest.mark.parametrize(
    "module", ["zonnx.backend.ops.conv", "zonnx.backend.compiler.params", "zonnx.backend.runtime.ort_native"]
)
def test_first_import_of_a_module_works(module: str) -> None:
    """A fresh interpreter importing an op or machinery module first (a cycle would fail here)."""
    code = f"import {module}, zonnx.backend.ops.registry as r; print(len(r.KINDS))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == str(len(KINDS))
