"""``zonnx.compare.compare_models`` on the digits CNN: float, FixNeuron and compiled (dpu-b4096) forms paired."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import onnx
import pytest

from tests.backend.partition_models import quantize
from zonnx import zoo
from zonnx.backend.compile_api import compile_model
from zonnx.backend.golden import compare_layers
from zonnx.compare import compare_models, model_kind
from zonnx.errors import OptionError
from zonnx.zoo.digits import digits_data


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    d = tmp_path_factory.mktemp("compare")
    x, _ = digits_data("calib")
    fix = quantize(zoo.get("digits_cnn"), d / "fix.onnx", [{"input": x[i : i + 1]} for i in range(32)], "fix")
    onnx.save(compile_model(fix, "dpu-b4096").model, d / "compiled.onnx")
    test, _ = digits_data("test")
    return {"float": zoo.get("digits_cnn"), "fix": fix, "compiled": d / "compiled.onnx",
            "feeds": {"input": test[:16]}}  # fmt: skip


def test_model_kinds(models) -> None:
    kinds = [model_kind(onnx.load(models[k])) for k in ("float", "fix", "compiled")]
    assert kinds == ["float", "quantized", "compiled"]


def test_compiled_vs_fake_quant_is_exact(models) -> None:
    result = compare_models(models["compiled"], models["fix"], models["feeds"])
    assert result.mode == "NPU layers vs fake-quant (golden)" and len(result.rows) == 12
    assert [r.index for r in result.rows] == list(range(12))  # program order
    assert all(r.lsb == 0 and r.max_abs == 0 and r.sqnr_db == math.inf for r in result.rows)
    assert result.first_divergence is None


def test_float_vs_compiled_has_the_golden_numbers(models) -> None:
    result = compare_models(models["float"], models["compiled"], models["feeds"], tol_cos=0.9995)
    golden = compare_layers(models["compiled"], models["feeds"], float_model=models["float"])
    by_layer = {g.tensor: g for g in golden.rows}
    assert len(result.rows) == 12
    for r in result.rows:
        g = by_layer[r.other]
        assert (r.tensor, r.cosine, r.sqnr_db) == (g.float_tensor, g.cos_float, g.sqnr_db)
        assert 0 < r.max_abs == g.max_abs_float
    order = {o: k for k, n in enumerate(onnx.load(models["float"]).graph.node) for o in n.output}
    assert [order[r.tensor] for r in result.rows] == sorted(order[r.tensor] for r in result.rows)
    first = result.first_divergence
    assert first is not None and first.cosine < 0.9995
    assert all(r.cosine >= 0.9995 for r in result.rows[: result.rows.index(first)])


def test_two_compiled_models_pair_by_name(models) -> None:
    result = compare_models(models["compiled"], models["compiled"], models["feeds"])
    assert len(result.rows) == 12 and all(r.cosine == pytest.approx(1.0) for r in result.rows)


def test_refuses_a_tolerance_outside_the_cosine_range(models) -> None:
    with pytest.raises(OptionError, match="a cosine lies in"):
        compare_models(models["float"], models["fix"], models["feeds"], tol_cos=1.5)


def test_json_has_no_infinity(models, tmp_path: Path) -> None:
    data = compare_models(models["compiled"], models["fix"], models["feeds"]).to_dict()
    assert data["tensors"][0]["sqnr_db"] == "inf" and np.isfinite(data["tensors"][0]["cosine"])
