"""Turn a command-line calibration source into a reader: image folder, .npz/.npy, folder of arrays, or Python."""

from __future__ import annotations

__all__ = ["reader_from_source", "input_image_size"]

import importlib.util
from pathlib import Path
from typing import Any

import onnx

from zonnx.errors import OptionError
from zonnx.quantization.calibration.readers import NpzReader
from zonnx.quantization.image_reader import IMAGE_SUFFIXES, ImageFolderReader, Preprocess


def input_image_size(model: onnx.ModelProto, layout: str) -> tuple[int, int] | None:
    """(H, W) of the model's first input when both are fixed numbers, else None."""
    inits = {t.name for t in model.graph.initializer}
    inputs = [i for i in model.graph.input if i.name not in inits]
    if not inputs:
        return None
    dims = [
        d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None
        for d in inputs[0].type.tensor_type.shape.dim
    ]
    if len(dims) != 4:
        return None
    h, w = (dims[2], dims[3]) if layout == "nchw" else (dims[1], dims[2])
    return (h, w) if h and w else None


def _python_reader(spec: str) -> Any:
    file, _, name = spec.rpartition(":")
    path = Path(file)
    if not path.is_file():
        raise OptionError(f"--calib {spec}: {path} is not a Python file; write it as FILE.py:FUNCTION.")
    module_spec = importlib.util.spec_from_file_location(path.stem, path)
    assert module_spec is not None and module_spec.loader is not None
    module = importlib.util.module_from_spec(module_spec)
    try:
        module_spec.loader.exec_module(module)
    except Exception as e:  # the user's code: report its error in one line
        raise OptionError(f"--calib {spec}: importing {path} failed: {type(e).__name__}: {e}") from None
    factory = getattr(module, name, None)
    if factory is None:
        raise OptionError(f"--calib {spec}: {path} has no {name!r}.")
    reader = factory() if callable(factory) and not hasattr(factory, "get_next") else factory
    if not hasattr(reader, "get_next"):
        raise OptionError(f"--calib {spec}: {name} must be (or return) an object with get_next().")
    return reader


def reader_from_source(
    source: str, model: onnx.ModelProto, *, preprocess: dict[str, Any] | None = None, limit: int | None = None
) -> Any:
    """A CalibrationDataReader for ``source``; image preprocessing options come from ``preprocess``."""
    if source.endswith(".py") or ".py:" in source:
        return _python_reader(source if ":" in source else f"{source}:reader")
    path = Path(source)
    if not path.exists():
        raise OptionError(f"--calib {source}: no such file or folder.")
    if path.is_file():
        return NpzReader(path, limit=limit)
    files = [p for p in path.iterdir() if p.is_file()]
    if any(p.suffix in (".npz", ".npy") for p in files):
        return NpzReader(path, limit=limit)
    if not any(p.suffix.lower() in IMAGE_SUFFIXES for p in files):
        raise OptionError(
            f"--calib {source}: the folder holds no images ({', '.join(IMAGE_SUFFIXES)}) "
            "and no .npz/.npy files."
        )
    opts = dict(preprocess or {})
    layout = opts.get("layout") or "nchw"
    if opts.get("size") is None:
        opts["size"] = input_image_size(model, layout)
        if opts["size"] is None:
            raise OptionError("the model's input size is not fixed: give --size HEIGHT,WIDTH for the images.")
    opts = {k: v for k, v in opts.items() if v is not None}
    inits = {t.name for t in model.graph.initializer}
    input_name = next(i.name for i in model.graph.input if i.name not in inits)
    return ImageFolderReader(path, input_name, Preprocess(**opts), limit=limit)
