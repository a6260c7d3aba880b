"""Numeric checks: generate inputs for a model, run it in ORT, compare outputs against a reference."""

from __future__ import annotations

__all__ = [
    "DEFAULT_DIM",
    "OutputDiff",
    "input_specs",
    "make_inputs",
    "ort_session",
    "exact_integer_form",
    "run_ort",
    "compare_outputs",
    "check_loadable",
    "cosine",
]

import dataclasses
import logging
import os
from collections.abc import Mapping

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort

from zonnx.errors import OptionError, VerificationError, first_line
from zonnx.ir.io import ModelLike, to_proto
from zonnx.ir.large import check_model

logger = logging.getLogger(__name__)

#: Size given to a symbolic dimension that is not the leading (batch) one.
DEFAULT_DIM = 64


@dataclasses.dataclass(frozen=True)
class InputSpec:
    """A graph input with concrete shape (symbolic dims resolved) and numpy dtype."""

    name: str
    shape: tuple[int, ...]
    dtype: np.dtype
    symbolic: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class OutputDiff:
    """How one output differs from its reference: errors are absolute and relative to the reference's range."""

    name: str
    max_abs: float
    ref_range: float
    cosine: float

    @property
    def relative(self) -> float:
        return self.max_abs / self.ref_range if self.ref_range > 0 else self.max_abs

    def within(self, rtol: float) -> bool:
        return self.relative <= rtol


def input_specs(
    model: onnx.ModelProto, shapes: Mapping[str, tuple[int, ...]] | None = None
) -> list[InputSpec]:
    """Resolve each real graph input's shape: given shapes first, then batch=1 and other symbols=DEFAULT_DIM."""
    shapes = dict(shapes or {})
    inits = {t.name for t in model.graph.initializer}
    specs = []
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        tt = vi.type.tensor_type
        if not vi.type.HasField("tensor_type"):
            raise OptionError(f"input {vi.name!r}: only tensor inputs can be generated; pass real inputs.")
        dtype = onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type)
        if vi.name in shapes:
            shape = tuple(int(d) for d in shapes.pop(vi.name))
            declared = [
                d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None for d in tt.shape.dim
            ]
            if tt.HasField("shape") and (
                len(shape) != len(declared) or any(d and d != s for d, s in zip(declared, shape, strict=True))
            ):
                wanted = ",".join(str(d) if d else "?" for d in declared)
                given = ",".join(map(str, shape))
                raise OptionError(
                    f"input shape {vi.name}:{given} does not fit the model's input {vi.name!r} [{wanted}]; "
                    "give one size per dimension and keep the fixed ones."
                )
            specs.append(InputSpec(vi.name, shape, np.dtype(dtype)))
            continue
        dims, symbolic = [], []
        for i, d in enumerate(tt.shape.dim):
            if d.HasField("dim_value") and d.dim_value > 0:
                dims.append(d.dim_value)
            else:
                dims.append(1 if i == 0 else DEFAULT_DIM)
                symbolic.append(f"{d.dim_param or '?'}={dims[-1]}")
        specs.append(InputSpec(vi.name, tuple(dims), np.dtype(dtype), tuple(symbolic)))
    if shapes:
        known = [s.name for s in specs]
        raise OptionError(f"input shape given for {sorted(shapes)} but the model's inputs are {known}.")
    return specs


def make_inputs(
    model: ModelLike, *, seed: int = 0, shapes: Mapping[str, tuple[int, ...]] | None = None
) -> dict[str, np.ndarray]:
    """Generate deterministic inputs: standard normal floats, small non-negative integers, random bools."""
    proto = to_proto(model)
    rng = np.random.default_rng(seed)
    feeds = {}
    for spec in input_specs(proto, shapes):
        if spec.dtype.kind == "f":
            feeds[spec.name] = rng.standard_normal(spec.shape).astype(spec.dtype)
        elif spec.dtype.kind in "iu":
            feeds[spec.name] = rng.integers(0, 10, spec.shape).astype(spec.dtype)
        elif spec.dtype.kind == "b":
            feeds[spec.name] = rng.integers(0, 2, spec.shape).astype(bool)
        else:
            raise OptionError(f"input {spec.name!r}: cannot generate dtype {spec.dtype}; pass real inputs.")
    return feeds


def exact_integer_form(proto: onnx.ModelProto) -> onnx.ModelProto:
    """``proto`` in a form whose integer ops ORT computes exactly on this host (the same numbers).

    On hosts whose integer path is u8 x u8 (``zonnx.hostcpu``: no VNNI, so ORT's u8 x s8 kernels
    saturate), int8 weights of QOperator / integer ops become uint8 + 128 (``exact-int-weights`` pass);
    elsewhere, and for models without such ops, ``proto`` itself.
    """
    from zonnx.hostcpu import host_int

    if host_int().path != "u8u8":
        return proto
    from zonnx.passes.common.exact_int_weights import ExactIntWeightsPass, has_integer_weight_ops

    if not has_integer_weight_ops(proto):
        return proto
    model = ir.serde.deserialize_model(proto)
    if not ExactIntWeightsPass().apply(model).total:
        return proto  # nothing to re-encode: no round trip through the serializer
    _say_once(f"ORT runs integer ops here with u8 x u8 weights, exact ({host_int().isa} host)")
    return ir.serde.serialize_model(model)


_SAID: set[str] = set()


def _say_once(message: str) -> None:
    if message not in _SAID:
        _SAID.add(message)
        logger.info(message)


def ort_session(model: ModelLike, *, optimize: bool = False) -> ort.InferenceSession:
    """Create a CPU session; graph optimizations are off by default so the graph runs as written.

    Integer ops (and QDQ groups ORT would fuse into them) run exactly on every host (``exact_integer_form``).
    """
    proto = exact_integer_form(to_proto(model))
    opts = ort.SessionOptions()
    opts.log_severity_level = 4  # failures reach the user as VerificationError, not log lines
    opts.intra_op_num_threads = int(os.environ.get("ZONNX_THREADS", "0"))
    if not optimize:
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    try:
        from zonnx.ir.large import ort_session

        return ort_session(proto, opts, ["CPUExecutionProvider"])  # never one 2 GiB protobuf
    except Exception as e:  # ORT raises its own exception classes without a common public base
        raise VerificationError(f"onnxruntime cannot load the model: {first_line(e)}") from None


def run_ort(model: ModelLike, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Run the model once and return outputs by name."""
    sess = ort_session(model)
    names = [o.name for o in sess.get_outputs()]
    try:
        outs = sess.run(names, dict(feeds))
    except Exception as e:
        raise VerificationError(f"onnxruntime failed to run the model: {first_line(e)}") from None
    return dict(zip(names, outs, strict=True))


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    """Cosine similarity in float64; two all-zero tensors are identical (1.0), one all-zero is 0.0."""
    a64, b64 = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    na, nb = np.linalg.norm(a64), np.linalg.norm(b64)
    if na == 0 and nb == 0:
        return 1.0
    if na == 0 or nb == 0:
        return 0.0
    return float(np.dot(a64, b64) / (na * nb))


def compare_outputs(
    reference: Mapping[str, np.ndarray], actual: Mapping[str, np.ndarray]
) -> list[OutputDiff]:
    """Compare outputs by name; a missing output or a shape change is a VerificationError."""
    diffs = []
    for name, ref in reference.items():
        if name not in actual:
            raise VerificationError(f"output {name!r} is missing after the rewrite.")
        got = actual[name]
        if ref.shape != got.shape:
            raise VerificationError(f"output {name!r}: shape changed from {ref.shape} to {got.shape}.")
        if ref.size == 0:
            diffs.append(OutputDiff(name, 0.0, 0.0, 1.0))
            continue
        r64, g64 = ref.astype(np.float64), got.astype(np.float64)
        finite = np.isfinite(r64)
        if not np.array_equal(finite, np.isfinite(g64)):
            raise VerificationError(f"output {name!r}: NaN/Inf positions differ after the rewrite.")
        err = float(np.max(np.abs(r64[finite] - g64[finite]))) if finite.any() else 0.0
        rng = float(r64[finite].max() - r64[finite].min()) if finite.any() else 0.0
        diffs.append(OutputDiff(name, err, rng, cosine(np.where(finite, ref, 0), np.where(finite, got, 0))))
    return diffs


def check_loadable(model: ModelLike, *, full_check: bool = True) -> None:
    """Raise VerificationError unless onnx.checker accepts the model and ORT can create a session."""
    proto = to_proto(model)
    try:
        check_model(proto, full_check=full_check)  # never one 2 GiB protobuf
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as e:
        raise VerificationError(f"onnx.checker rejects the model: {first_line(e)}") from None
    ort_session(proto)
