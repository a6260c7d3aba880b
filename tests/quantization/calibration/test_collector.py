"""The streaming collector on real models against statistics computed directly from every activation."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from tests.helpers import parse
from zonnx import zoo
from zonnx.quantization.calibration.collector import collect
from zonnx.quantization.calibration.methods import compute_range
from zonnx.quantization.calibration.readers import CalibrationError, ListReader
from zonnx.quantization.calibration.stats import TensorStats


def _activations(model: onnx.ModelProto) -> list[str]:
    skip = {"Constant", "Shape"}
    return list(dict.fromkeys(o for n in model.graph.node if n.op_type not in skip for o in n.output if o))


def _direct(model: onnx.ModelProto, names: list[str], feeds: list[dict]) -> dict[str, TensorStats]:
    """Every tensor as a graph output, every value through TensorStats.update (the reference)."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    del m.graph.output[:]
    m.graph.output.extend(onnx.ValueInfoProto(name=t) for t in names)
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    sess = ort.InferenceSession(m.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    out = {t: TensorStats(t) for t in names}
    for f in feeds:
        for t, v in zip(names, sess.run(names, f), strict=True):
            out[t].update(v.astype(np.float32))
    return out


@pytest.fixture(scope="module")
def cls():
    model = onnx.load(str(zoo.get("ppocr_cls")))
    feeds = zoo.sample_inputs("ppocr_cls", 6)
    names = _activations(model)
    return model, feeds, names, _direct(model, names, feeds)


def test_exact_mode_matches_direct_statistics(cls) -> None:
    model, feeds, names, ref = cls
    seen = []
    st = collect(
        model,
        names,
        ListReader(feeds),
        methods_needed={"percentile", "nstd"},
        hist_sample=None,
        progress=seen.append,
    )
    assert seen == list(range(len(feeds)))
    assert list(st) == names
    for t in names:
        a, b = st[t], ref[t]
        assert (a.count, a.batches) == (b.count, b.batches), t
        assert a.min == pytest.approx(b.min, rel=1e-6, abs=1e-6) and a.max == pytest.approx(
            b.max, rel=1e-6, abs=1e-6
        ), t
        assert a.mean == pytest.approx(b.mean, rel=1e-4, abs=1e-5), t
        assert a.std == pytest.approx(b.std, rel=1e-3, abs=1e-5), t
        assert a.hist.total == a.count, t  # every value counted, none lost in re-binning
        lo, hi = compute_range(a, "percentile", percentile=99.9)
        rlo, rhi = compute_range(b, "percentile", percentile=99.9)
        assert abs(hi - rhi) <= 2 * max(a.hist.abs_histogram()[1], b.hist.abs_histogram()[1]) + 1e-6, t


def test_sampled_mode_counts_every_value_for_extrema(cls) -> None:
    model, feeds, names, ref = cls
    st = collect(model, names, feeds, methods_needed={"entropy"}, hist_sample=1000)
    big = [t for t in names if ref[t].count > 20 * 1000]
    assert big
    for t in names:
        a, b = st[t], ref[t]
        assert (a.count, a.min, a.max) == (
            b.count,
            pytest.approx(b.min, abs=1e-6),
            pytest.approx(b.max, abs=1e-6),
        )
        assert 0 < a.hist.total <= a.count
    for t in big:  # the first batch counts every value, later ones about 1000
        per_batch = ref[t].count // len(feeds)
        assert st[t].hist.total <= per_batch + (len(feeds) - 1) * 1000
        lo, hi = compute_range(st[t], "entropy")
        assert ref[t].min <= lo <= hi <= ref[t].max


def test_variable_widths_with_histogram_methods_ppocr_rec(tmp_path) -> None:
    """ORT's Entropy/Percentile calibrators crash on inputs of different widths; streaming does not."""
    model = onnx.load(str(zoo.get("ppocr_rec")))
    feeds = zoo.sample_inputs("ppocr_rec", 3)
    assert len({f["x"].shape[3] for f in feeds}) > 1
    names = [t for t in _activations(model) if "Cast" not in t][:80]
    st = collect(model, names, feeds, methods_needed={"entropy", "percentile", "kld"})
    ref = _direct(model, names, feeds)
    for t in names:
        assert st[t].count == ref[t].count and st[t].max == pytest.approx(ref[t].max, abs=1e-5)
        for m in ("entropy", "percentile", "kld"):
            lo, hi = compute_range(st[t], m)
            assert np.isfinite([lo, hi]).all() and lo <= hi
            assert -st[t].abs_max - 1e-6 <= lo and hi <= st[t].abs_max + 1e-6

    from onnxruntime.quantization import CalibrationMethod, create_calibrator

    path = tmp_path / "rec.onnx"
    onnx.save(model, str(path))
    cal = create_calibrator(
        path, augmented_model_path=str(tmp_path / "aug.onnx"), calibrate_method=CalibrationMethod.Percentile
    )
    with pytest.raises(ValueError, match="inhomogeneous"):
        cal.collect_data(ListReader(feeds[:2]))


DERIVE = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[N, 8] x) => (float[N, 4, 4] out) {
    shape = Constant <value = int64[3] {-1, 4, 4}> ()
    w = Constant <value = float[8, 16] {%s}> ()
    h = MatMul(x, w)
    r = Relu(h)
    out = Reshape(r, shape)
}
"""


@pytest.fixture(scope="module")
def derive_model() -> onnx.ModelProto:
    w = np.random.default_rng(0).normal(size=128)
    return parse(DERIVE % ", ".join(f"{v:.6f}" for v in w))


def test_relu_and_reshape_outputs_are_derived_exactly(derive_model) -> None:
    rng = np.random.default_rng(1)
    feeds = [{"x": rng.normal(size=(n, 8)).astype(np.float32)} for n in (3, 7, 2, 9)]
    st = collect(derive_model, ["h", "r", "out"], feeds, methods_needed={"percentile"}, hist_sample=None)
    ref = _direct(derive_model, ["h", "r", "out"], feeds)
    for t in ("r", "out"):
        a, b = st[t], ref[t]
        assert (a.count, a.batches, a.min, a.max) == (b.count, b.batches, b.min, b.max)
        assert np.isclose(a.batch_max_sum, b.batch_max_sum) and np.isclose(a.ema_min, b.ema_min)
        assert a.hist.total == a.count
    assert st["r"].hist.width == st["h"].hist.width  # the Relu histogram is a fold of MatMul's
    assert np.array_equal(st["r"].hist.counts, st["out"].hist.counts)
    # with moments a Relu output is measured, not derived: mean and std must still be exact
    st = collect(derive_model, ["h", "r"], feeds, methods_needed={"nstd"})
    assert st["r"].mean == pytest.approx(ref["r"].mean, rel=1e-5) and st["r"].std == pytest.approx(
        ref["r"].std, rel=1e-4
    )


def test_errors_name_tensor_and_sample(derive_model) -> None:
    feeds = [{"x": np.ones((2, 8), np.float32)}]
    with pytest.raises(
        CalibrationError, match="tensor 'rr' .* not in the model's main graph.*Did you mean 'r'"
    ):
        collect(derive_model, ["rr"], feeds)
    with pytest.raises(CalibrationError, match="no tensor to calibrate"):
        collect(derive_model, [], feeds)
    bad = [{"x": np.ones((2, 8), np.float32)}, {"x": np.ones((1, 8), np.float64)}]
    with pytest.raises(CalibrationError, match="sample 1, input 'x': dtype float64"):
        collect(derive_model, ["r"], bad, methods_needed={"percentile"})
    add = parse(
        '<ir_version: 8, opset_import: ["" : 17]>\ng (float[N] a, float[N] b) => (float[N] c) { c = Add(a, b) }'
    )
    feeds = [
        {"a": np.ones(3, np.float32), "b": np.ones(3, np.float32)},
        {"a": np.ones(3, np.float32), "b": np.ones(4, np.float32)},
    ]
    with pytest.raises(CalibrationError, match="calibration sample 1: onnxruntime failed"):
        collect(add, ["c"], feeds)


def test_float16_and_integer_tensors() -> None:
    m = parse(
        """
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[N] x) => (float16[N] y, int64[N] k) {
            h = Cast <to = 10> (x)
            y = Relu(h)
            k = Cast <to = 7> (x)
        }
        """
    )
    feeds = [{"x": np.array([-3.0, 0.5, 2.25], np.float32)}, {"x": np.array([7.0, -1.0], np.float32)}]
    st = collect(m, ["h", "y", "k"], feeds, methods_needed={"minmax", "percentile"})
    assert (st["h"].min, st["h"].max, st["h"].count) == (-3.0, 7.0, 5)
    assert (st["y"].min, st["y"].max) == (0.0, 7.0)
    assert (st["k"].min, st["k"].max) == (-3.0, 7.0)


def test_initializer_weights_and_model_left_unchanged() -> None:
    """Large initializers reach ORT as external initializers; the caller's model is not modified."""
    rng = np.random.default_rng(2)
    w = rng.normal(size=(64, 64)).astype(np.float32)  # 16 KiB: handed over, not serialized
    b = rng.normal(size=(64,)).astype(np.float32)  # small: stays in the proto
    m = parse(
        """
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[N, 64] x) => (float[N, 64] y) {
            h = MatMul(x, w)
            y = Add(h, b)
        }
        """,
        ("w", w),
        ("b", b),
    )
    before = m.SerializeToString()
    feeds = [{"x": rng.normal(size=(n, 64)).astype(np.float32)} for n in (2, 5)]
    st = collect(m, ["h", "y", "w"], feeds, methods_needed={"minmax", "percentile"})
    assert m.SerializeToString() == before
    h = np.concatenate([f["x"] @ w for f in feeds])
    assert st["h"].min == pytest.approx(h.min(), rel=1e-5) and st["h"].max == pytest.approx(h.max(), rel=1e-5)
    assert st["y"].max == pytest.approx((h + b).max(), rel=1e-5) and st["y"].count == h.size
    assert (st["w"].min, st["w"].max, st["w"].batches) == (w.min(), w.max(), 2)


@pytest.mark.parametrize("margin, packed", [(-1, "1"), (0, "")])
def test_prepacking_off_exactly_past_the_limit(
    monkeypatch: pytest.MonkeyPatch, margin: int, packed: str
) -> None:
    """The weights' serialized size decides (found from raw byte counts, serialized only near the limit):
    one byte under their ByteSize sum turns ORT's packed weight copies off, exactly that sum keeps them."""
    from zonnx.quantization.calibration import augment
    from zonnx.quantization.calibration.collector import calibration_session
    from zonnx.quantization.calibration.methods import requirements

    proto = onnx.load(str(zoo.get("digits_cnn")))
    aug = augment.build(proto, [proto.graph.node[0].output[0]], requirements(["minmax"]), sample=False)
    size = sum(w.ByteSize() for w in aug.weights)
    assert size > 0
    monkeypatch.setenv("ZONNX_PROTO_LIMIT", str(size + margin))
    sess = calibration_session(aug, ["CPUExecutionProvider"], ort.GraphOptimizationLevel.ORT_ENABLE_ALL)
    opts = sess.get_session_options()
    try:
        entry = opts.get_session_config_entry("session.disable_prepacking")
    except RuntimeError:  # ORT raises for a key never set
        entry = ""
    assert entry == packed
