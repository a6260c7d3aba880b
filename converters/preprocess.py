"""Fold camera-image preprocessing into a model, so the deployed model takes raw images (TPU-MLIR's
``--mean/--scale/--pixel_format/--channel_format``, Compass's NPU-side preprocessing).

The rule. A raw image ``r`` (``layout`` nhwc or nchw, ``input_dtype`` uint8 or float32, channels in
``pixel_format`` order) becomes the model's float input ``x`` (NCHW, or NHWC for models whose input
is laid out so, e.g. TensorFlow's) by, written for NCHW,

    x[:, c] = (float(r)[:, src(c)] - mean[c]) * scale[c]

where ``src`` maps each model channel (in ``model_format`` order, RGB by default) to a raw channel
(``bgr`` reverses the three, ``gray`` repeats the single one). ``mean`` and ``scale`` are given per
model channel (ImageNet: ``mean 123.675,116.28,103.53`` and ``scale 0.0171,0.0175,0.0174``, RGB).
The folded nodes are Cast, Transpose (when the raw and model layouts differ), Gather on the channel
axis (reorder or repeat), then one Mul by ``scale`` and one Add of ``-mean * scale``; the input keeps
its name.
"""

from __future__ import annotations

__all__ = [
    "PIXEL_FORMATS",
    "LAYOUTS",
    "INPUT_DTYPES",
    "Preprocess",
    "fold_preprocessing",
    "reference_preprocess",
    "image_input_name",
    "check_preprocessing",
    "raw_images",
]

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir

from zonnx.converters.common import DEFAULT_MIN_COSINE, OutputCheck, check_against_source
from zonnx.errors import OptionError
from zonnx.ir.io import ModelLike, to_ir, to_proto
from zonnx.ir.large import copy_model
from zonnx.verify import DEFAULT_DIM, make_inputs, run_ort

logger = logging.getLogger(__name__)

PIXEL_FORMATS = ("rgb", "bgr", "gray")
LAYOUTS = ("nchw", "nhwc")
INPUT_DTYPES = ("float32", "uint8")


@dataclasses.dataclass(frozen=True)
class Preprocess:
    """What the raw input looks like and how to normalize it.

    Attributes:
        mean: per model channel, or one value for all (default 0).
        scale: per model channel, or one value for all (default 1).
        pixel_format: channel order of the raw images: rgb, bgr or gray (default rgb).
        layout: raw image layout, nchw or nhwc (default nchw).
        input_dtype: raw element type, float32 or uint8 (default float32).
        model_format: channel order the model expects, rgb or bgr (default rgb).
        model_layout: the model input's layout, nchw or nhwc (default None: nhwc when the last dim is
            1 or 3 and dim 1 is not, else nchw).
    """

    mean: tuple[float, ...] = (0.0,)
    scale: tuple[float, ...] = (1.0,)
    pixel_format: str = "rgb"
    layout: str = "nchw"
    input_dtype: str = "float32"
    model_format: str = "rgb"
    model_layout: str | None = None

    def __post_init__(self) -> None:
        for option, value, choices in (
            ("--pixel-format", self.pixel_format, PIXEL_FORMATS),
            ("--layout", self.layout, LAYOUTS),
            ("--input-dtype", self.input_dtype, INPUT_DTYPES),
            ("model_format", self.model_format, ("rgb", "bgr")),
            ("model_layout", self.model_layout or "nchw", LAYOUTS),
        ):
            if value not in choices:
                raise OptionError(f"{option} {value!r}: choose one of {', '.join(choices)}.")
        object.__setattr__(self, "mean", tuple(float(v) for v in self.mean))
        object.__setattr__(self, "scale", tuple(float(v) for v in self.scale))
        if not self.mean or not self.scale:
            raise OptionError("--mean/--scale: give one value per channel or one for all.")
        if any(s == 0 for s in self.scale):
            raise OptionError(f"--scale {','.join(map(str, self.scale))}: a scale of 0 erases the channel.")

    @property
    def raw_channels(self) -> int | None:
        return 1 if self.pixel_format == "gray" else None

    def channel_map(self, channels: int) -> list[int]:
        """For each model channel, the raw channel it is read from."""
        if self.pixel_format == "gray":
            return [0] * channels
        if channels != 3 and self.pixel_format != self.model_format:
            raise OptionError(
                f"--pixel-format {self.pixel_format}: reordering needs 3 channels, the model's "
                f"input has {channels}."
            )
        return [2, 1, 0] if self.pixel_format != self.model_format else list(range(channels))

    def per_channel(self, channels: int) -> tuple[np.ndarray, np.ndarray]:
        """mean and scale as float32 arrays of length ``channels``."""
        out = []
        for option, values in (("--mean", self.mean), ("--scale", self.scale)):
            if len(values) not in (1, channels):
                raise OptionError(
                    f"{option} has {len(values)} values; the model's input has {channels} channels: "
                    f"give {channels} values or one."
                )
            out.append(np.broadcast_to(np.asarray(values, np.float32), (channels,)).copy())
        return out[0], out[1]

    def model_layout_of(self, dims: Sequence[Any]) -> str:
        """The model input's layout: ``model_layout`` when set, else guessed from where 1 or 3 channels sit."""
        if self.model_layout:
            return self.model_layout
        return "nhwc" if len(dims) == 4 and dims[3] in (1, 3) and dims[1] not in (1, 3) else "nchw"


def image_input_name(model: ModelLike, input_name: str | None = None) -> str:
    """The name of the input preprocessing folds into: ``input_name``, or the model's only 4-D input."""
    return _image_input(to_ir(to_proto(model)), input_name).name


def _image_input(model: ir.Model, input_name: str | None) -> ir.Value:
    """The 4-D float NCHW input to fold into (the only input unless named)."""
    inputs = list(model.graph.inputs)
    if input_name is None:
        candidates = [v for v in inputs if v.shape is not None and len(v.shape) == 4]
        if len(candidates) != 1:
            raise OptionError(
                f"the model has inputs {[v.name for v in inputs]}; name the image input to fold "
                "preprocessing into (--preprocess-input NAME)."
            )
        return candidates[0]
    for v in inputs:
        if v.name == input_name:
            return v
    raise OptionError(
        f"--preprocess-input {input_name!r}: not an input of the model ({[v.name for v in inputs]})."
    )


def _layout(value: ir.Value, pre: Preprocess) -> tuple[str, int]:
    """(model layout, channel count) of a 4-D float image input."""
    shape = value.shape
    if shape is None or len(shape) != 4 or value.dtype not in (ir.DataType.FLOAT, ir.DataType.FLOAT16):
        raise OptionError(
            f"input {value.name!r}: preprocessing folds into a 4-D float image input; this one "
            f"is {value.dtype} with shape {shape}."
        )
    layout = pre.model_layout_of(list(shape))
    c = shape[1] if layout == "nchw" else shape[3]
    if not isinstance(c, int):
        raise OptionError(f"input {value.name!r}: its channel dim is {c}; fix it first (--input-shape).")
    return layout, c


def _const(graph: ir.Graph, name: str, array: np.ndarray) -> ir.Value:
    value = ir.Value(
        name=name,
        const_value=ir.tensor(array, name=name),
        shape=ir.Shape(array.shape),
        type=ir.TensorType(ir.DataType.from_numpy(array.dtype)),
    )
    graph.register_initializer(value)
    return value


def fold_preprocessing(
    model: ModelLike,
    *,
    mean: Sequence[float] = (0.0,),
    scale: Sequence[float] = (1.0,),
    pixel_format: str = "rgb",
    layout: str = "nchw",
    input_dtype: str = "float32",
    model_format: str = "rgb",
    model_layout: str | None = None,
    input_name: str | None = None,
) -> onnx.ModelProto:
    """Return a copy of ``model`` whose image input takes raw images (see the module docstring)."""
    pre = Preprocess(tuple(mean), tuple(scale), pixel_format, layout, input_dtype, model_format, model_layout)
    work = to_ir(copy_model(to_proto(model)))
    graph = work.graph
    old = _image_input(work, input_name)
    mlayout, channels = _layout(old, pre)
    name = old.name
    n, h, w = (old.shape[i] for i in ((0, 2, 3) if mlayout == "nchw" else (0, 1, 2)))
    axis, bshape = (1, (1, -1, 1, 1)) if mlayout == "nchw" else (3, (1, 1, 1, -1))
    raw_c = pre.raw_channels or channels
    raw_dims = [n, h, w, raw_c] if layout == "nhwc" else [n, raw_c, h, w]
    raw_dtype = ir.DataType.UINT8 if input_dtype == "uint8" else ir.DataType.FLOAT
    new = ir.Value(name=name + "__raw", type=ir.TensorType(raw_dtype), shape=ir.Shape(raw_dims))
    nodes: list[ir.Node] = []
    x = new

    def add(op: str, inputs: list[ir.Value], **attrs: object) -> ir.Value:
        node = ir.node(op, inputs, attrs or None, name=f"{name}/preprocess/{op}")
        nodes.append(node)
        return node.outputs[0]

    if raw_dtype != old.dtype:
        x = add("Cast", [x], to=old.dtype)
    if layout != mlayout:
        x = add("Transpose", [x], perm=[0, 3, 1, 2] if layout == "nhwc" else [0, 2, 3, 1])
    cmap = pre.channel_map(channels)
    if cmap != list(range(raw_c)):
        x = add(
            "Gather", [x, _const(graph, f"{name}/preprocess/channels", np.asarray(cmap, np.int64))], axis=axis
        )
    m, s = pre.per_channel(channels)
    dt = old.dtype.numpy()
    if (s != 1).any():
        x = add("Mul", [x, _const(graph, f"{name}/preprocess/scale", s.reshape(bshape).astype(dt))])
    if m.any():
        x = add("Add", [x, _const(graph, f"{name}/preprocess/bias", (-m * s).reshape(bshape).astype(dt))])
    if x is new:
        logger.info("preprocessing of %s is the identity; nothing folded", name)
        return to_proto(work)
    graph.insert_before(graph[0], nodes) if len(graph) else graph.extend(nodes)
    old.replace_all_uses_with(x, replace_graph_outputs=True)
    position = list(graph.inputs).index(old)
    graph.inputs[position] = new
    old.name = name + "__unused"
    x.name = name + "_preprocessed"
    new.name = name
    return to_proto(work)


def reference_preprocess(
    images: np.ndarray,
    *,
    mean: Sequence[float] = (0.0,),
    scale: Sequence[float] = (1.0,),
    pixel_format: str = "rgb",
    layout: str = "nchw",
    model_format: str = "rgb",
    model_layout: str = "nchw",
    channels: int = 3,
) -> np.ndarray:
    """numpy version of the folded preprocessing: raw images -> the model's float32 input (``model_layout``)."""
    pre = Preprocess(tuple(mean), tuple(scale), pixel_format, layout, "float32", model_format, model_layout)
    x = np.asarray(images).astype(np.float32)
    if layout == "nhwc":
        x = x.transpose(0, 3, 1, 2)
    x = x[:, pre.channel_map(channels)]
    m, s = pre.per_channel(channels)
    x = (x - m.reshape(1, -1, 1, 1)) * s.reshape(1, -1, 1, 1)
    return (x.transpose(0, 2, 3, 1) if model_layout == "nhwc" else x).astype(np.float32)


def raw_images(
    model: onnx.ModelProto, input_name: str, dtype: str, n: int = 2, seed: int = 0
) -> list[np.ndarray]:
    """Random raw images for the folded input (uint8 0..255, or floats in 0..255), symbolic dims 1 / 64."""
    vi = next(v for v in model.graph.input if v.name == input_name)
    dims = [
        d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else (1 if i == 0 else DEFAULT_DIM)
        for i, d in enumerate(vi.type.tensor_type.shape.dim)
    ]
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, dims).astype(np.uint8 if dtype == "uint8" else np.float32) for _ in range(n)]


def check_preprocessing(
    original: ModelLike,
    folded: onnx.ModelProto,
    pre: Preprocess,
    *,
    input_name: str,
    images: Sequence[np.ndarray] | None = None,
    min_cosine: float = DEFAULT_MIN_COSINE,
) -> list[OutputCheck]:
    """Compare ``folded(raw)`` with ``original(reference_preprocess(raw))`` in ORT on each raw image batch."""
    original = to_proto(original)
    value = next(v for v in to_ir(original).graph.inputs if v.name == input_name)
    mlayout, channels = _layout(value, pre)
    feeds_list: list[Mapping[str, np.ndarray]] = []
    for i, raw in enumerate(images or raw_images(folded, input_name, pre.input_dtype)):
        others = {
            k: v
            for k, v in make_inputs(folded, seed=i, shapes={input_name: raw.shape}).items()
            if k != input_name
        }
        feeds_list.append({input_name: raw, **others})

    def source(feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        x = reference_preprocess(
            feeds[input_name],
            mean=pre.mean,
            scale=pre.scale,
            pixel_format=pre.pixel_format,
            layout=pre.layout,
            model_format=pre.model_format,
            model_layout=mlayout,
            channels=channels,
        )
        return run_ort(original, {**feeds, input_name: x})

    return check_against_source(folded, source, feeds_list, min_cosine=min_cosine)
