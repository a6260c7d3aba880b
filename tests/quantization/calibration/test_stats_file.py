"""Statistics files: lossless round trip, refusal for another model, TPU-MLIR calibration tables."""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx
import pytest

from zonnx import zoo
from zonnx.quantization.calibration.collector import collect
from zonnx.quantization.calibration.methods import METHODS, compute_range
from zonnx.quantization.calibration.readers import CalibrationError
from zonnx.quantization.calibration.stats_file import (
    load_stats,
    model_fingerprint,
    read_calibration_table,
    save_stats,
    write_calibration_table,
)


@pytest.fixture(scope="module")
def collected():
    model = onnx.load(str(zoo.get("ppocr_cls")))
    names = [o for n in model.graph.node if n.op_type in ("Conv", "Add", "Clip", "Mul") for o in n.output][
        :40
    ]
    stats = collect(model, names, zoo.sample_inputs("ppocr_cls", 3), methods_needed=set(METHODS))
    return model, stats


def test_round_trip_keeps_every_field(tmp_path, collected) -> None:
    model, stats = collected
    path = save_stats(
        tmp_path / "cls_stats", stats, model, methods=["entropy", "minmax"], extra={"samples": 3}
    )
    assert path == tmp_path / "cls_stats"  # the name given, no suffix added (issue 17, item 5)
    back = load_stats(path, model)
    assert list(back) == list(stats)
    for t, a in stats.items():
        b = back[t]
        for f in dataclasses.fields(a):
            if f.name != "hist":
                assert getattr(a, f.name) == getattr(b, f.name) or (
                    np.isnan(getattr(a, f.name)) and np.isnan(getattr(b, f.name))
                ), (t, f.name)
        assert (a.hist.width, a.hist.offset, a.hist.nbins) == (b.hist.width, b.hist.offset, b.hist.nbins)
        assert np.array_equal(a.hist.counts, b.hist.counts)
        for m in METHODS:
            assert compute_range(a, m) == compute_range(b, m), (t, m)


def test_refuses_stats_of_another_model(tmp_path, collected) -> None:
    model, stats = collected
    path = save_stats(tmp_path / "s.npz", stats, model)
    other = onnx.ModelProto()
    other.CopyFrom(model)
    # PP-OCR keeps its weights in Constant nodes: change one value of the largest
    const = max(
        (n for n in other.graph.node if n.op_type == "Constant"), key=lambda n: n.attribute[0].t.ByteSize()
    )
    arr = onnx.numpy_helper.to_array(const.attribute[0].t).copy()
    arr.flat[0] += 1.0
    const.attribute[0].t.CopyFrom(onnx.numpy_helper.from_array(arr))
    assert model_fingerprint(other) != model_fingerprint(model)
    with pytest.raises(CalibrationError, match="collected on a different model"):
        load_stats(path, other)
    assert set(load_stats(path)) == set(stats)  # without a model nothing is checked
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    with pytest.raises(CalibrationError, match="not a zonnx calibration stats file"):
        load_stats(tmp_path / "junk.npz")


def test_tpu_mlir_table(tmp_path, collected) -> None:
    _, stats = collected
    path = write_calibration_table(tmp_path / "cali_table", stats, tune_number=5)
    lines = path.read_text().splitlines()
    assert lines[0].startswith("# generated time: ")
    assert lines[1:6] == [
        "# histogram number: 2048",
        "# sample number: 3",
        "# tune number: 5",
        "###",
        "# op_name    threshold      min      max",
    ]
    table = read_calibration_table(path)
    assert list(table) == list(stats)
    for t, row in table.items():
        assert row.threshold == pytest.approx(compute_range(stats[t], "kld")[1], abs=1e-6)
        assert (row.min, row.max) == (
            pytest.approx(stats[t].min, abs=1e-6),
            pytest.approx(stats[t].max, abs=1e-6),
        )
    name = next(iter(stats))
    write_calibration_table(tmp_path / "t2", {name: stats[name]}, thresholds={name: 1.5})
    assert read_calibration_table(tmp_path / "t2")[name].threshold == 1.5
    (tmp_path / "bad").write_text("# header\nconv1 1.0 oops 2.0\n")
    with pytest.raises(CalibrationError, match="bad:2: expected 'op_name threshold min max'"):
        read_calibration_table(tmp_path / "bad")


def test_fingerprint_covers_initializers_and_is_deterministic() -> None:
    from tests.helpers import parse

    text = (
        '<ir_version: 8, opset_import: ["" : 17]>\ng (float[N, 4] x) => (float[N, 4] y) { y = MatMul(x, w) }'
    )
    w = np.arange(16, dtype=np.float32).reshape(4, 4)
    a, b = parse(text, ("w", w)), parse(text, ("w", w))
    assert model_fingerprint(a) == model_fingerprint(b)
    w2 = w.copy()
    w2[3, 3] = -1.0
    assert model_fingerprint(parse(text, ("w", w2))) != model_fingerprint(a)
