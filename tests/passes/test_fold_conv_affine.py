"""Tests for fold-conv-affine: scale/offset after and before a Conv, padded Conv, refusals, PP-OCRv4."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort

from tests.helpers import op_types, parse, run_pass_and_compare
from zonnx import zoo
from zonnx.ir.io import to_ir, to_proto
from zonnx.passes.fusion.conv_affine import FoldConvAffinePass

RNG = np.random.default_rng(0)


def _conv_model(pads: str, group: int, chain: str, *consts: tuple[str, np.ndarray]) -> str:
    c_in = 4
    return (
        '<ir_version: 8, opset_import: ["" : 17]>\n'
        "g (float[1, 4, 6, 6] x) => (float[1, 4, ?, ?] y) {\n"
        f"{chain}\n"
        "}",
        ("w", RNG.normal(size=(4, c_in // group, 3, 3)).astype(np.float32)),
        ("b", RNG.normal(size=4).astype(np.float32)),
        *consts,
    )


def _run(text_and_inits, **kw):
    text, *inits = text_and_inits
    return run_pass_and_compare(FoldConvAffinePass(), parse(text, *inits), **kw)


def test_scale_and_offset_after_conv_fold_into_weight_and_bias() -> None:
    chain = "c = Conv <pads = [1, 1, 1, 1]> (x, w, b)\nm = Mul (a, c)\ny = Add (m, d)"
    a = np.array([1.7], np.float32)
    d = RNG.normal(size=(4, 1, 1)).astype(np.float32)
    model, result = _run(_conv_model("", 1, chain, ("a", a), ("d", d)))
    assert op_types(model) == ["Conv"]
    assert result.changes.counts == {"folded Mul after Conv": 1, "folded Add after Conv": 1}


def test_scale_before_padded_depthwise_conv_is_exact() -> None:
    chain = "m = Mul (x, a)\ny = Conv <pads = [1, 1, 1, 1], group = 4> (m, w, b)"
    a = RNG.uniform(0.5, 2.0, size=(1, 4, 1, 1)).astype(np.float32)
    model, result = _run(_conv_model("", 4, chain, ("a", a)))
    assert op_types(model) == ["Conv"]
    assert result.changes.counts == {"folded Mul before Conv": 1}


def test_offset_before_unpadded_conv_goes_into_bias() -> None:
    chain = "m = Add (x, d)\ny = Conv (m, w, b)"
    d = RNG.normal(size=(4, 1, 1)).astype(np.float32)
    model, result = _run(_conv_model("", 1, chain, ("d", d)))
    assert op_types(model) == ["Conv"]
    assert result.changes.counts == {"folded Add before Conv": 1}


def test_affine_before_padded_conv_keeps_one_add() -> None:
    """a x + d before a padded Conv: the border must still see 0, so x + d / a stays and a moves into W."""
    chain = "m = Mul (x, a)\nn = Add (m, d)\ny = Conv <pads = [1, 1, 1, 1]> (n, w, b)"
    a = np.array(0.8, np.float32)
    d = np.array(-0.3, np.float32)
    model, result = _run(_conv_model("", 1, chain, ("a", a), ("d", d)))
    assert op_types(model) == ["Add", "Conv"]
    assert result.changes.counts == {"moved Mul before padded Conv into its weight": 1}


def test_offset_before_padded_conv_without_scale_is_left_alone() -> None:
    chain = "m = Add (x, d)\ny = Conv <pads = [1, 1, 1, 1]> (m, w, b)"
    model, result = _run(_conv_model("", 1, chain, ("d", np.array(0.5, np.float32))))
    assert op_types(model) == ["Add", "Conv"]
    assert result.changes.total == 0


def test_intermediate_read_elsewhere_is_a_miss() -> None:
    text = (
        '<ir_version: 8, opset_import: ["" : 17]>\n'
        "g (float[1, 4, 6, 6] x) => (float[1, 4, ?, ?] y, float[1, 4, ?, ?] c) {\n"
        "c = Conv (x, w, b)\n"
        "y = Mul (c, a)\n"
        "}"
    )
    inits = [("w", RNG.normal(size=(4, 4, 1, 1)).astype(np.float32)), ("b", np.zeros(4, np.float32)),
             ("a", np.array([2.0], np.float32))]  # fmt: skip
    model, result = run_pass_and_compare(FoldConvAffinePass(), parse(text, *inits))
    assert op_types(model) == ["Conv", "Mul"]
    assert result.changes.total == 0
    assert any("also a graph output" in m for m in result.changes.misses)


def test_ppocr_rec_learnable_affine_blocks_fold_and_outputs_match() -> None:
    """PP-LCNetV3's learnable affine blocks: every scale folds, each padded depthwise conv keeps one Add."""
    import onnx

    from zonnx.optimization import OptimizeOptions, optimize_with_report

    src = onnx.load(zoo.get("ppocr_rec"))
    base = optimize_with_report(src, OptimizeOptions(skip=("fold-conv-affine", "fuse-hardswish")))
    model = to_ir(base.model)
    changes = FoldConvAffinePass()(model).changes
    assert changes.counts == {
        "folded Mul after Conv": 28,
        "folded Add after Conv": 28,
        "folded Mul before Conv": 12,
        "folded Add before Conv": 12,
        "moved Mul before padded Conv into its weight": 13,
    }
    feeds = zoo.sample_inputs("ppocr_rec", 1, seed=3)[0]
    want = ort.InferenceSession(src.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[
        0
    ]
    got = ort.InferenceSession(to_proto(model).SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, feeds
    )[0]
    assert np.abs(want - got).max() < 1e-5
