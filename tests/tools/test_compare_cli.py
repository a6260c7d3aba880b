"""``zonnx compare``: float vs quantized digits CNN through the real CLI: table, first divergence, JSON, bad input."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import onnx.parser
import pytest

import zonnx
from tests.helpers import assert_one_line_error, run_cli
from zonnx import zoo
from zonnx.quantization.calibration.readers import ListReader
from zonnx.verify import cosine, run_ort
from zonnx.zoo.digits import digits_data


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("compare_cli")
    flt = d / "float.onnx"
    shutil.copy(zoo.get("digits_cnn"), flt)
    calib, _ = digits_data("calib")
    quant = d / "q.onnx"
    zonnx.quantize_static(str(flt), str(quant), ListReader([{"input": calib[i : i + 1]} for i in range(16)]))
    test, _ = digits_data("test")
    np.savez(d / "in.npz", input=test[:16])
    np.savez(d / "wrong.npz", image=test[:16])
    other = onnx.parser.parse_model(
        '<ir_version: 8, opset_import: ["" : 17]> g (float[N,1,8,8] input) => (float[N,1,8,8] y) '
        "{ y = Relu(input) }"
    )
    onnx.save(other, d / "other.onnx")
    return {
        "float": flt,
        "quant": quant,
        "in": d / "in.npz",
        "wrong": d / "wrong.npz",
        "other": d / "other.onnx",
    }


def test_float_vs_quantized_within_default_tolerance(files) -> None:
    proc = run_cli(
        "compare", str(files["float"]), str(files["quant"]), "--inputs", str(files["in"]), "--top", "3"
    )
    assert proc.returncode == 0, proc.stderr
    assert "worst 3 of 11 tensors (float vs quantized: traced tensors)" in proc.stdout
    assert "all 11 compared tensors have cosine >= 0.99" in proc.stdout
    assert "note:" not in proc.stderr and "Traceback" not in proc.stderr


def test_strict_tolerance_names_first_divergence_and_writes_json(files, tmp_path: Path) -> None:
    out = tmp_path / "cmp.json"
    proc = run_cli("compare", str(files["float"]), str(files["quant"]), "-i", str(files["in"]),
                   "--tolerance", "cos=0.99999", "--json", str(out))  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    assert "first divergence: tensor 1 '/stem/stem.2/Relu_output_0' (op Relu): cosine 0.9999" in proc.stdout
    assert "FIRST BELOW" in proc.stdout and f"wrote {out}" in proc.stdout
    data = json.loads(out.read_text())
    rows = data["tensors"]
    assert data["first_divergence"]["tensor"] == "/stem/stem.2/Relu_output_0" and data["tol_cos"] == 0.99999
    assert len(rows) == 11 and [r["index"] for r in rows] == list(range(11))
    # rows follow the float model's node order; everything before the first divergence is within tolerance
    order = {o: k for k, n in enumerate(onnx.load(files["float"]).graph.node) for o in n.output}
    assert [order.get(r["tensor"], -1) for r in rows] == sorted(order.get(r["tensor"], -1) for r in rows)
    assert rows[0]["tensor"] == "input" and rows[0]["cosine"] >= 0.99999 > rows[1]["cosine"]
    # the output row holds the numbers of the two models' outputs, computed here independently
    with np.load(files["in"]) as z:
        feeds = {"input": z["input"]}
    want = cosine(run_ort(files["float"], feeds)["logits"], run_ort(files["quant"], feeds)["logits"])
    logits = next(r for r in rows if r["tensor"] == "logits")
    assert logits["other"] == "logits" and logits["cosine"] == pytest.approx(want, rel=1e-9)
    assert data["inputs"] == {"input": {"shape": [16, 1, 8, 8], "dtype": "float32", "generated": False}}


def test_quantized_first_orders_by_its_own_graph(files) -> None:
    proc = run_cli("compare", str(files["quant"]), str(files["float"]), "-i", str(files["in"]),
                   "--tolerance", "cos=0.99999")  # fmt: skip
    assert proc.returncode == 1
    assert "first divergence: tensor 1 '/stem/stem.2/Relu_output_0_DequantizeLinear_Output'" in proc.stdout


def test_without_inputs_says_so(files) -> None:
    proc = run_cli("compare", str(files["float"]), str(files["float"]))
    assert proc.returncode == 0, proc.stderr
    assert "note: no --inputs: generated inputs (seed 0): input [1, 1, 8, 8]" in proc.stderr
    assert "all 20 compared tensors have cosine >= 0.99" in proc.stdout  # two float models: same names


def test_bad_input_is_one_line(files, tmp_path: Path) -> None:
    f, q = str(files["float"]), str(files["quant"])
    assert_one_line_error(
        run_cli("compare", f, q, "-i", str(tmp_path / "none.npz")), "none.npz: no such file"
    )
    assert_one_line_error(run_cli("compare", f, str(tmp_path / "none.onnx")), "none.onnx: no such file")
    assert_one_line_error(
        run_cli("compare", f, q, "-i", str(files["wrong"])), "array 'image' is not an input of the models"
    )
    assert_one_line_error(
        run_cli("compare", f, str(files["other"]), "-i", str(files["in"])), "share no tensor to compare"
    )
    assert_one_line_error(run_cli("compare", f, q, "--tolerance", "cosin=0.9"), "Did you mean 'cos'?")
    before = files["in"].read_bytes()
    assert_one_line_error(
        run_cli("compare", f, q, "-i", str(files["in"]), "--json", str(files["in"])), "--json", "--inputs"
    )
    assert files["in"].read_bytes() == before
