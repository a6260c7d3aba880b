"""Export a torch module with the legacy (TorchScript) exporter; its errors become one-line ConversionErrors
that name the failing op and its node (module path, source line)."""

from __future__ import annotations

__all__ = ["TorchArgs", "export_torch"]

import contextlib
import io
import os
import re
import sys
import tempfile
import warnings
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import onnx
import torch

from zonnx.converters.common import ConversionError
from zonnx.errors import first_line

#: Newest opset the TorchScript exporter writes; the clean pipeline upgrades from there when asked.
_EXPORTER_MAX_OPSET = 20
#: Positional arguments for forward(), as the exporter and the check take them.
TorchArgs = tuple[Any, ...]


@contextlib.contextmanager
def _capture_output() -> Iterator[io.StringIO]:
    """Capture file descriptors 1 and 2: the exporter's C++ log dumps the TorchScript graph there on failure."""
    captured = io.StringIO()
    with tempfile.TemporaryFile(mode="w+b") as tmp:
        sys.stdout.flush()
        sys.stderr.flush()
        saved = [os.dup(1), os.dup(2)]
        os.dup2(tmp.fileno(), 1)
        os.dup2(tmp.fileno(), 2)
        try:
            yield captured
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            for fd, old in zip((1, 2), saved, strict=True):
                os.dup2(old, fd)
                os.close(old)
            tmp.seek(0)
            captured.write(tmp.read().decode(errors="replace"))


_KIND = re.compile(r"'((?:aten|prim|quantized|onnx)::\w+)'|kind '([\w:]+)'")


def _where(kind: str, graph_log: str) -> str:
    """' at node <module path>/<op> (file:line)' for the first node of ``kind`` in the exporter's graph dump."""
    for line in graph_log.splitlines():
        m = re.search(rf"= {re.escape(kind)}\(.*?\)(?:, scope: (\S+))?(?: # (\S+))?\s*$", line)
        if m:
            scope, loc = m.group(1) or "", m.group(2) or ""
            path = "/".join(
                part.split("::", 1)[1] for part in scope.split("/") if "::" in part and part.split("::", 1)[1]
            )
            where = f" at node /{path + '/' if path else ''}{kind.split('::')[-1]}"
            if loc.count(":") >= 2:
                file, line_no, _ = loc.rsplit(":", 2)
                where += f" ({Path(file).name}:{line_no})"
            return where
    return ""


def _short_export_error(e: Exception, graph_log: str, opset: int) -> ConversionError:
    """Shorten the exporter's error to the failing op and its node (module path, source line)."""
    text = str(e).strip()
    m = _KIND.search(text)
    kind = (m.group(1) or m.group(2)) if m else ""
    first = first_line(e).split("  [Caused by")[0].rstrip(". ")
    if not kind:
        return ConversionError(f"torch cannot export the model: {first}.")
    added = re.search(r"added in version (\d+)", text)
    if added:
        hint = f"it needs opset {added.group(1)}: pass --opset {added.group(1)}"
    elif "is not supported" in first:
        hint = "rewrite that part with supported ops or keep it out of the exported model"
    else:
        hint = f"{first}; rewrite that part or keep it out of the exported model"
    return ConversionError(
        f"torch cannot export operator {kind} to ONNX opset {opset}{_where(kind, graph_log)}: {hint}."
    )


def export_torch(
    module: torch.nn.Module,
    args: TorchArgs,
    *,
    input_names: Sequence[str],
    output_names: Sequence[str],
    dynamic_axes: Mapping[str, Any] | None = None,
    opset: int = 17,
) -> onnx.ModelProto:
    """Export with the legacy (TorchScript) exporter in eval mode; errors become one-line ConversionErrors."""
    with contextlib.suppress(NotImplementedError):  # torch.export modules refuse .eval()
        module.eval()
    export_opset = min(opset, _EXPORTER_MAX_OPSET)
    # to a file, not a buffer: past 2 GB the exporter puts the weights in external data beside it
    folder = tempfile.TemporaryDirectory(prefix="zonnx-export-")
    path = os.path.join(folder.name, "model.onnx")
    with folder, warnings.catch_warnings(), _capture_output() as log:
        warnings.simplefilter("ignore")
        try:
            torch.onnx.export(
                module,
                args,
                path,
                dynamo=False,
                opset_version=export_opset,
                input_names=list(input_names),
                output_names=list(output_names),
                dynamic_axes={k: v for k, v in (dynamic_axes or {}).items()},
                training=torch.onnx.TrainingMode.PRESERVE,
            )
            error = None
        except Exception as e:  # the exporter raises RuntimeError, OnnxExporterError, TypeError, ...
            error = e
        if error is None:
            model = onnx.load(path)  # external data, if any, read into the proto (never serialized whole)
    if error is not None:
        raise _short_export_error(error, log.getvalue(), export_opset) from None
    return model
