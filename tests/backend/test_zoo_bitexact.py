"""Whole zoo models through partition + compile: every NPU program lowered to ORT equals the numpy reference bit
for bit on every program tensor, and the NPU takes (nearly) all MACs. MobileNetV2 and PP-OCRv4 rec (fixed
1x3x48x160 input) on the three targets (QDQ int8 symmetric, QDQ u8/s8, FixNeuron).

The programs use the eltwise and selection op kinds (``ops.mul``, ``lincomb``, ``matmul2``, ``slice``, ...);
``ort_lowering`` lowers every kind through its op module (``ops.registry``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import zonnx
from bench.bench_npu_fidelity import FORMS, boundary_codes, codes_of, quantize_zoo, zoo_feeds
from tests.backend.native_support import (
    KERNEL_IDS,
    KERNELS,
    fused_qconvs,
    lowered_session,
    residual_conv_outputs,
)
from zonnx import zoo
from zonnx.backend.compile_api import CompiledModel, compile_model
from zonnx.backend.compiler.channels import fold_constant_channels
from zonnx.backend.compiler.requant import requantize
from zonnx.backend.runtime.ort_lowering import program_to_model
from zonnx.backend.runtime.reference import run_program
from zonnx.quantization.calibration.readers import ListReader

REC_SHAPE = (1, 3, 48, 160)  # narrow lines keep the test fast; the compiled graph is the same


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("zoo_bitexact")


def _quantized(folder: Path, name: str, target: str) -> Path:
    shape = REC_SHAPE if name == "ppocr_rec" else None
    return quantize_zoo(name, FORMS[target], folder, n_calib=2, shape=shape)


def assert_bit_exact(
    qpath: Path, cm: CompiledModel, feed: dict, native: bool = False
) -> tuple[int, set[str], int]:
    """Every program on the quantized model's own boundary codes: ORT lowering (the native kernels with
    ``native``) == reference on every tensor. With ``native`` a second lowering exposes every tensor but the
    conv outputs a residual add reads alone, so those adds run fused into their QConv (``ort_fuse``), and
    compares the rest again. Returns (tensors compared, op kinds seen, residual adds fused)."""
    values = boundary_codes(qpath, [i.name for p in cm.programs for i in p.inputs], feed)
    compared, kinds, fused = 0, set(), 0
    for prog in cm.programs:
        feeds = {i.name: codes_of(values[i.name], i).astype(i.dtype) for i in prog.inputs}
        ref = run_program(prog, feeds, debug=True)
        inner = [t for t in ref if t not in feeds]
        private = residual_conv_outputs(prog) if native else set()
        for expose in [inner] + ([[t for t in inner if t not in private]] if private else []):
            model = program_to_model(prog, name="p", expose=expose, native=native)
            fused += fused_qconvs(model)
            sess = lowered_session(model, native)
            got = sess.run(None, {f"p/{k}": v for k, v in feeds.items()})
            for out, value in zip(sess.get_outputs(), got, strict=True):
                name = out.name[2:]
                assert value.dtype == np.dtype(prog.tensors[name].dtype), name
                diff = int(np.sum(value.astype(np.int64) != ref[name]))
                assert diff == 0, (prog.target, name, diff, len(expose) < len(inner))
        compared += len(inner)
        kinds |= {op.kind for op in prog.ops}
    return compared, kinds, fused


@pytest.mark.parametrize("native", KERNELS, ids=KERNEL_IDS)
@pytest.mark.parametrize("target", ["bm1684x", "zhouyi-x2", "dpu-b4096"])
def test_mobilenetv2_one_subgraph_bit_exact(folder: Path, target: str, native: bool) -> None:
    qpath = _quantized(folder, "mobilenetv2-random", target)
    cm = compile_model(qpath, target)
    assert cm.partition.num_subgraphs == 1 and cm.partition.mac_share == 1.0  # measured: every op on the NPU
    assert cm.partition.npu_ops == cm.partition.total_ops
    compared, kinds, fused = assert_bit_exact(
        qpath, cm, zoo_feeds("mobilenetv2-random", 1, seed=7)[0], native
    )
    assert compared >= 66 and {"conv", "add", "avgpool", "matmul"} <= kinds
    assert fused == (10 if native else 0)  # every residual add fused into its projection QConv


#: target -> (lowest NPU MAC share, op kinds the programs must use, fewest tensors compared); measured shares
#: 1.0, 1.0 and 0.95 (the 6625-class FC exceeds the DPU's 4096 output channels and stays on the CPU). The
#: DPU programs hold fewer tensors (130): the quantizer fuses the hard-swish and affine blocks for it, and
#: each HardSwish runs in its convolution's group, a lookup on the convolution's codes.
_REC = {
    "bm1684x": (0.99, {"conv", "mul", "lincomb", "matmul2", "slice", "lut"}, 200),
    "zhouyi-x2": (0.99, {"conv", "mul", "lincomb", "matmul2", "slice", "lut"}, 200),
    "dpu-b4096": (0.93, {"conv", "mul", "lincomb", "slice", "matmul", "lut"}, 120),
}


#: The native kernels on one target only (the reference run of this model dominates: about 20 s per case).
@pytest.mark.parametrize(("target", "native"), [(t, False) for t in _REC] + [("bm1684x", True)])
def test_ppocr_rec_subgraphs_bit_exact(folder: Path, target: str, native: bool) -> None:
    qpath = _quantized(folder, "ppocr_rec", target)
    cm = compile_model(qpath, target)
    share, needed, fewest = _REC[target]
    part = cm.partition
    assert part.mac_share >= share and part.npu_ops >= 0.55 * part.total_ops  # measured 0.97, 0.66, 0.58
    assert "compile" not in part.rules.values()  # no subgraph fell back: capability and compiler agree
    compared, kinds, _ = assert_bit_exact(
        qpath, cm, zoo_feeds("ppocr_rec", 1, seed=7, shape=REC_SHAPE)[0], native
    )
    assert compared >= fewest and needed <= kinds, needed - kinds


@pytest.mark.parametrize("mode", ["half_up", "floor", "half_even"])
def test_constant_channels_fold_exactly(mode: str) -> None:
    """A near-zero-weight channel (PP-OCRv4 rec on bm1684x: scale ~1e-10, shift 59, bias ~2^30, which the
    ORT lowering could not requantize in int64) gives one value for every input and becomes bias-only;
    the other channels are untouched; the outputs are identical."""
    rng = np.random.default_rng(4)
    w = rng.integers(-127, 128, (4, 9))
    w[1], w[1, 0] = 0, 127
    w[3] = 0
    b_acc = np.array([100, 892610375, -5, 7])
    m, s = np.array([1 << 30, 1115990261, 3, 0]), np.array([31, 59, 2, 0])
    reach = np.abs(w).sum(axis=1) * 128
    w2, b2, m2, s2 = fold_constant_channels(w, b_acc, m, s, reach, mode)
    assert (s2 == [31, 0, 2, 0]).all() and not w2[1].any() and (w2[0] == w[0]).all() and b2[3] == 0
    x = np.concatenate([rng.integers(-128, 128, (500, 9)), -128 * np.sign(w), 127 * np.sign(w)])
    before = requantize(x @ w.T + b_acc, m, s, mode, zero_point=3, lo=-128, hi=127)
    after = requantize(x @ w2.T + b2, m2, s2, mode, zero_point=3, lo=-128, hi=127)
    assert np.array_equal(before, after) and len(np.unique(before[:, 1])) == 1


def test_resnet18_int16_native_bit_exact(folder: Path) -> None:
    """ResNet-18 with 16-bit activations on zhouyi-x2: the native lowering (QConv16 for every conv, MaxPoolI32
    for the stem pool) equals the numpy reference on every program tensor."""
    q = folder / "resnet18_int16.onnx"
    zonnx.quantize_static(
        str(zoo.get("resnet18-random")),
        str(q),
        ListReader(zoo.sample_inputs("resnet18-random", 2, seed=1)),
        activation_type="int16",
        weight_type="int8",
        extra_options={"Target": "zhouyi-x2"},
    )
    cm = compile_model(q, "zhouyi-x2")
    ops = {n.op_type for p in cm.programs for n in program_to_model(p, name="p", native=True).graph.node}
    assert {"QConv16", "MaxPoolI32"} <= ops and "Im2col" not in ops  # no conv left on the byte-plane path
    compared, kinds, fused = assert_bit_exact(q, cm, zoo_feeds("resnet18-random", 1, seed=7)[0], native=True)
    assert fused == 0  # 16-bit adds stay RequantI32 nodes
    assert compared >= 40 and {"conv", "maxpool", "add"} <= kinds
