"""Calibration data readers (ORT's ``get_next()`` protocol, .npz/.npy files, lists) and feed validation."""

from __future__ import annotations

__all__ = [
    "CalibrationError",
    "CalibrationDataReader",
    "InputSpec",
    "ListReader",
    "NpzReader",
    "input_specs",
    "iter_feeds",
    "validated",
]

import logging
import zipfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from os import PathLike
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import onnx
from onnx import helper
from onnxruntime.quantization import CalibrationDataReader

from zonnx.errors import ZonnxError, did_you_mean

logger = logging.getLogger(__name__)

Feed = dict[str, np.ndarray]


class CalibrationError(ZonnxError):
    """Calibration data or collected statistics are unusable (wrong inputs, NaN, empty set, stale file)."""


def load_arrays(path: Path, *, mmap: bool = False) -> dict[str, np.ndarray]:
    """The arrays of an ``.npz`` (by name) or ``.npy`` (under ``""``) file; a truncated, garbage or
    object-dtype (pickled) file is a CalibrationError naming it, never a traceback."""
    try:
        if path.suffix == ".npy":
            return {"": np.load(path, mmap_mode="r" if mmap else None, allow_pickle=False)}
        with np.load(path, allow_pickle=False) as z:
            return {k: z[k] for k in z.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:
        raise CalibrationError(
            f"{path}: not a readable {path.suffix or 'array'} file ({type(e).__name__}: {e}); "
            "save plain numeric arrays with numpy.savez."
        ) from None


# ``CalibrationDataReader`` is ORT's own class, re-exported: ``get_next()`` returns one feed dict, then
# None (or an empty dict) at the end; any object with a ``get_next`` method counts as one.


class ListReader:
    """A reader over a list of feed dicts (``{input_name: array}``), one batch each."""

    def __init__(self, feeds: Sequence[Mapping[str, np.ndarray]]) -> None:
        self.feeds = list(feeds)
        self._it = iter(self.feeds)

    def get_next(self) -> Feed | None:
        return dict(next(self._it, None) or {}) or None

    def rewind(self) -> None:
        self._it = iter(self.feeds)

    def __len__(self) -> int:
        return len(self.feeds)


class NpzReader:
    """A reader over samples stored in numpy files.

    ``path`` is one of: an ``.npz`` holding one array per input name whose first axis indexes samples;
    an ``.npy`` holding the samples of a single-input model (first axis = samples); or a folder (or a
    list of files) of ``.npz``/``.npy`` files holding one sample each, as TPU-MLIR's ``--dataset``
    (this form allows inputs whose shape differs between samples).

    With stacked arrays, sample ``i`` is ``a[i:i+batch_size]`` when the array has the rank of the model
    input (its first axis is the model's batch axis), or ``a[i]`` when it has one more axis. The rank is
    resolved against the model by ``validated``; until then the first form is assumed.
    Options: ``batch_size`` (default 1, stacked arrays only); ``limit`` (max samples, default all).
    """

    def __init__(
        self,
        path: str | PathLike[str] | Sequence[str | PathLike[str]],
        *,
        batch_size: int = 1,
        limit: int | None = None,
    ) -> None:
        if batch_size < 1:
            raise CalibrationError(f"NpzReader: batch_size must be >= 1, got {batch_size}.")
        self.batch_size = batch_size
        self.limit = limit
        self._ranks: dict[str, int] = {}
        self._files: list[Path] | None = None
        self._arrays: dict[str, np.ndarray] | None = None
        paths = [Path(p) for p in path] if isinstance(path, (list, tuple)) else [Path(path)]
        for p in paths:
            if not p.exists():
                raise CalibrationError(f"NpzReader: {p} does not exist.")
        if len(paths) == 1 and paths[0].is_dir():
            files = sorted(q for q in paths[0].iterdir() if q.suffix in (".npz", ".npy"))
            if not files:
                raise CalibrationError(f"NpzReader: folder {paths[0]} holds no .npz or .npy file.")
            self._files = files
        elif len(paths) == 1:
            self._arrays = self._load_stacked(paths[0])
        else:
            self._files = paths
        self._index = 0

    @staticmethod
    def _load_stacked(p: Path) -> dict[str, np.ndarray]:
        if p.suffix not in (".npy", ".npz"):
            raise CalibrationError(f"NpzReader: {p} is neither .npz nor .npy.")
        return load_arrays(p, mmap=True)

    def bind(self, ranks: Mapping[str, int]) -> None:
        """Tell the reader the model's input ranks (``validated`` calls this) so stacking is resolved."""
        self._ranks = dict(ranks)
        if self._arrays is not None and "" in self._arrays:
            if len(ranks) != 1:
                raise CalibrationError(
                    f"NpzReader: an .npy file holds one input but the model has {len(ranks)} "
                    f"({', '.join(ranks)}); store them in an .npz keyed by input name."
                )
            self._arrays = {next(iter(ranks)): self._arrays.pop("")}

    def _num_samples(self) -> int:
        assert self._arrays is not None
        counts = {}
        for k, a in self._arrays.items():
            stacked = self._ranks.get(k, a.ndim) < a.ndim
            counts[k] = a.shape[0] if stacked else -(-a.shape[0] // self.batch_size)
        if len(set(counts.values())) > 1:
            raise CalibrationError(f"NpzReader: inputs hold different numbers of samples: {counts}.")
        return next(iter(counts.values()), 0)

    def get_next(self) -> Feed | None:
        i = self._index
        if self.limit is not None and i >= self.limit:
            return None
        if self._files is not None:
            if i >= len(self._files):
                return None
            self._index += 1
            f = self._files[i]
            arrays = load_arrays(f)
            if f.suffix == ".npy":
                return {next(iter(self._ranks), ""): arrays[""]}
            return arrays
        if i >= self._num_samples():
            return None
        self._index += 1
        feed = {}
        for k, a in self._arrays.items():
            if self._ranks.get(k, a.ndim) < a.ndim:
                feed[k] = np.array(
                    a[i]
                )  # a copy that keeps 0-d samples 0-d (ascontiguousarray makes them 1-d)
            else:
                feed[k] = np.ascontiguousarray(a[i * self.batch_size : (i + 1) * self.batch_size])
        return feed

    def rewind(self) -> None:
        self._index = 0


class InputSpec(NamedTuple):
    """A model input: name, numpy dtype, and dims (an int for a fixed dim, None for a symbolic one)."""

    name: str
    dtype: np.dtype
    dims: tuple[int | None, ...] | None


def input_specs(model: onnx.ModelProto) -> dict[str, InputSpec]:
    """The model's real inputs (graph inputs that are not initializers)."""
    inits = {i.name for i in model.graph.initializer}
    specs = {}
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        tt = vi.type.tensor_type
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(tt.elem_type)) if tt.elem_type else None
        dims = None
        if tt.HasField("shape"):
            dims = tuple(
                d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None for d in tt.shape.dim
            )
        specs[vi.name] = InputSpec(vi.name, dtype, dims)
    return specs


def iter_feeds(reader: Any) -> Iterator[Mapping[str, Any]]:
    """Feeds from an object with ``get_next()`` (until None or empty) or from an iterable of dicts."""
    if hasattr(reader, "get_next") and callable(reader.get_next):
        while True:
            feed = reader.get_next()
            if feed is None or (isinstance(feed, Mapping) and not feed):
                return
            yield feed
    elif isinstance(reader, Iterable) and not isinstance(reader, (str, bytes, Mapping)):
        for feed in reader:
            if feed is None:
                return
            yield feed
    else:
        raise CalibrationError(
            f"calibration reader of type {type(reader).__name__} has no get_next() method; pass an "
            "onnxruntime CalibrationDataReader, a zonnx NpzReader/ListReader, or a list of input dicts."
        )


def _check_array(spec: InputSpec, value: Any, index: int) -> np.ndarray:
    where = f"calibration sample {index}, input {spec.name!r}"
    if not isinstance(value, np.ndarray):
        try:
            value = np.asarray(value)
        except Exception as e:  # noqa: BLE001 - anything non-convertible is a user error here
            raise CalibrationError(
                f"{where}: expected a numpy array, got {type(value).__name__} ({e})."
            ) from e
    if spec.dtype is not None and value.dtype != spec.dtype:
        raise CalibrationError(
            f"{where}: dtype {value.dtype} but the model expects {spec.dtype}; "
            f"convert it with .astype(np.{spec.dtype.name})."
        )
    if spec.dims is not None:
        want = "x".join("?" if d is None else str(d) for d in spec.dims)
        if value.ndim != len(spec.dims):
            raise CalibrationError(
                f"{where}: shape {value.shape} has rank {value.ndim} but the model expects rank "
                f"{len(spec.dims)} ({want})."
            )
        for axis, (got, d) in enumerate(zip(value.shape, spec.dims, strict=True)):
            if d is not None and got != d:
                raise CalibrationError(
                    f"{where}: shape {value.shape} differs from the model's {want} at axis {axis} "
                    f"({got} != {d})."
                )
    if value.dtype.kind in "fc" and value.size and not np.isfinite(value).all():
        bad = np.argwhere(~np.isfinite(value))[0]
        kind = "NaN" if np.isnan(value[tuple(bad)]) else "Inf"
        raise CalibrationError(
            f"{where}: holds {kind} (first at index {tuple(int(b) for b in bad)}); calibration needs finite "
            "inputs: fix the preprocessing or drop this sample."
        )
    return value


def validated(reader: Any, model: onnx.ModelProto) -> Iterator[Feed]:
    """Yield the reader's feeds after checking each against ``model``'s inputs.

    A ``CalibrationError`` names the sample index and input for: an unknown input name (with a
    did-you-mean), a missing input, a wrong dtype, a wrong rank or fixed-dim mismatch, NaN or Inf, and
    an empty calibration set. Inputs whose symbolic dims differ between samples are accepted.
    """
    specs = input_specs(model)
    if hasattr(reader, "bind"):
        reader.bind({k: len(s.dims) for k, s in specs.items() if s.dims is not None})
    index = -1
    for index, raw in enumerate(iter_feeds(reader)):
        if not isinstance(raw, Mapping):
            raise CalibrationError(
                f"calibration sample {index}: the reader returned {type(raw).__name__}, expected a dict "
                "{input_name: numpy array}."
            )
        unknown = [k for k in raw if k not in specs]
        if unknown:
            k = unknown[0]
            raise CalibrationError(
                f"calibration sample {index}: input {k!r} is not an input of the model."
                f"{did_you_mean(str(k), specs)} Model inputs: {', '.join(specs)}."
            )
        missing = [k for k in specs if k not in raw]
        if missing:
            raise CalibrationError(
                f"calibration sample {index}: no value for model input {missing[0]!r} "
                f"(the feed has {', '.join(map(repr, raw)) or 'nothing'})."
            )
        yield {k: _check_array(specs[k], v, index) for k, v in raw.items()}
    if index < 0:
        raise CalibrationError(
            "the calibration reader produced no samples (get_next() returned None at once); if it was "
            "used before, rewind or recreate it."
        )
