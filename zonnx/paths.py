"""The path rule every command follows: no output path may name one of the command's inputs.

Every output path is compared with every input path after resolving links (``os.path.realpath``) and,
when both exist, by identity (``os.path.samefile``: hard links too). An ONNX input also brings the
external-data files it references. A match is an ``OptionError`` naming both options and the path, raised
before any work, so nothing is written.
"""

from __future__ import annotations

__all__ = ["refuse_overwrites", "external_data_files"]

import os
from collections.abc import Iterable, Mapping
from pathlib import Path

from zonnx.errors import OptionError

PathLike = str | os.PathLike[str]


def external_data_files(model_path: PathLike) -> list[Path]:
    """The external-data files an ONNX file references (none when it cannot be read: loading says why)."""
    path = Path(model_path)
    if path.suffix.lower() != ".onnx" or not path.is_file():
        return []
    try:
        import onnx

        model = onnx.load(str(path), load_external_data=False)
    except Exception:  # noqa: BLE001 - an unreadable model is reported by the command's own loader
        return []
    tensors = list(model.graph.initializer) + [
        a.t for n in model.graph.node for a in n.attribute if a.type == onnx.AttributeProto.TENSOR
    ]
    files = set()
    for tensor in tensors:
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            for entry in tensor.external_data:
                if entry.key == "location" and entry.value:
                    files.add(path.parent / entry.value)
    return sorted(files)


def _same(a: Path, b: Path) -> bool:
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    try:
        return a.exists() and b.exists() and os.path.samefile(a, b)
    except OSError:
        return False


def refuse_overwrites(
    inputs: Mapping[str, PathLike | Iterable[PathLike] | None],
    outputs: Mapping[str, PathLike | None],
) -> None:
    """Raise OptionError when an output path is one of the inputs (module docstring); else return."""
    named: list[tuple[str, Path]] = []
    for option, value in inputs.items():
        if value is None or value == "":
            continue
        values = [value] if isinstance(value, str | os.PathLike) else list(value)
        for v in values:
            p = Path(v)
            named.append((option, p))
            named += [(f"{option} (external data)", d) for d in external_data_files(p)]
    for out_option, out in outputs.items():
        if out is None or out == "":
            continue
        for in_option, p in named:
            if _same(Path(out), p):
                raise OptionError(
                    f"{out_option} {out} is the same file as {in_option} {p}: writing it would destroy an "
                    "input; choose another output path."
                )
