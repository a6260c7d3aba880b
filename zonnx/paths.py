"""The path rule every command follows: no output path may name one of the command's inputs.

Every output path is compared with every input path after resolving links (``os.path.realpath``) and,
when both exist, by identity (``os.path.samefile``: hard links too). An ONNX input also brings the
external-data files it references (read only when an output lies under the model's folder, where
its data files live). A match is an ``OptionError`` naming both options and the path, raised
before any work, so nothing is written.
"""

from __future__ import annotations

__all__ = ["refuse_overwrites", "external_data_files", "target_file"]

import os
from collections.abc import Iterable, Mapping
from pathlib import Path

from zonnx.errors import OptionError
from zonnx.ir.io import external_data_locations

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
    return sorted(path.parent / loc for loc in external_data_locations(model))


def target_file(target: str | None) -> Path | None:
    """The file behind a ``--target`` value when it names a ``.toml`` file (bundled names are not files)."""
    return Path(target) if target and target.endswith(".toml") else None


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
    out_paths = [Path(os.path.realpath(o)) for o in outputs.values() if o is not None and o != ""]
    named: list[tuple[str, Path]] = []
    for option, value in inputs.items():
        if value is None or value == "":
            continue
        values = [value] if isinstance(value, str | os.PathLike) else list(value)
        for v in values:
            p = Path(v)
            named.append((option, p))
            folder = Path(os.path.realpath(p.parent))
            if any(o.is_relative_to(folder) for o in out_paths):  # data files live under the model's folder
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
