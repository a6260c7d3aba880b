"""Models with external data through every command, with the 2 GiB limit lowered (``ZONNX_PROTO_LIMIT``)
so a 1.5 MB MatMul chain takes the paths a model past 2 GiB takes; the real >2 GiB run is
``python -m bench.runner large_model``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import zonnx
from tests.helpers import assert_one_line_error, run_cli
from zonnx.ir.io import load_proto
from zonnx.ir.large import is_large, model_digest, ort_session

D, LAYERS = 256, 6


def chain(path: Path, d: int = D, layers: int = LAYERS) -> Path:
    """MatMul -> Relu chain with d x d float weights, saved with external data beside ``path``."""
    rng = np.random.default_rng(0)
    nodes, inits, x = [], [], "x"
    for i in range(layers):
        inits.append(
            numpy_helper.from_array((rng.standard_normal((d, d)) / np.sqrt(d)).astype(np.float32), f"w{i}")
        )
        nodes += [
            helper.make_node("MatMul", [x, f"w{i}"], [f"h{i}"]),
            helper.make_node("Relu", [f"h{i}"], [f"r{i}"]),
        ]
        x = f"r{i}"
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, d])],
                              [helper.make_tensor_value_info(x, TensorProto.FLOAT, [1, d])], inits)  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.save_model(
        model, str(path), save_as_external_data=True, location=path.name + ".data", size_threshold=1024
    )
    return path


@pytest.fixture
def small_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ZONNX_PROTO_LIMIT", "100000")  # 100 kB: the chain (1.5 MB) counts as large


def test_ort_session_and_digest_without_one_protobuf(tmp_path: Path, small_limit: None) -> None:
    src = chain(tmp_path / "m.onnx")
    proto = load_proto(src)
    assert is_large(proto)
    x = np.random.default_rng(1).standard_normal((1, D)).astype(np.float32)
    want = ort.InferenceSession(str(src)).run(None, {"x": x})[0]
    got = ort_session(proto).run(None, {"x": x})[0]
    assert np.array_equal(want, got)
    d_path, d_proto = model_digest(src), model_digest(proto)
    data = tmp_path / "m.onnx.data"
    raw = bytearray(data.read_bytes())
    raw[100] ^= 1
    data.write_bytes(bytes(raw))
    assert model_digest(src) != d_path  # the digest of a path covers its external data
    assert model_digest(load_proto(src)) != d_proto


def test_ort_session_weights_as_values_below_the_limit(tmp_path: Path) -> None:
    proto = load_proto(chain(tmp_path / "m.onnx"))
    assert not is_large(proto)
    x = np.random.default_rng(2).standard_normal((1, D)).astype(np.float32)
    want = ort.InferenceSession(proto.SerializeToString()).run(None, {"x": x})[0]
    sess = ort_session(proto, weights_as_values=True)
    assert len(sess._zonnx_weights) == LAYERS  # every weight went in as an OrtValue
    assert np.array_equal(want, sess.run(None, {"x": x})[0])
    assert len(proto.graph.initializer) == LAYERS and proto.graph.initializer[0].raw_data  # input untouched


def test_every_command_keeps_external_data(tmp_path: Path, small_limit: None) -> None:
    src = chain(tmp_path / "m.onnx")
    np.savez(tmp_path / "calib.npz", x=np.random.default_rng(0).standard_normal((8, D)).astype(np.float32))
    assert run_cli("inspect", str(src), check=True).returncode == 0
    run_cli("optimize", str(src), str(tmp_path / "o.onnx"), "--verify", check=True)
    q = tmp_path / "q.onnx"
    run_cli("quantize", str(tmp_path / "o.onnx"), str(q), "--calib", str(tmp_path / "calib.npz"),
            "--target", "bm1684x", check=True)  # fmt: skip
    run_cli("compile", str(q), "--target", "bm1684x", "-o", str(tmp_path / "c.onnx"), check=True)
    for name in ("o.onnx", "q.onnx", "c.onnx"):  # weights stay beside the model, not inside it
        assert (tmp_path / f"{name}.data").stat().st_size > (tmp_path / name).stat().st_size
    x = np.random.default_rng(2).standard_normal((1, D)).astype(np.float32)
    np.savez(tmp_path / "in.npz", x=x)
    run_cli(
        "run",
        str(tmp_path / "c.onnx"),
        "--inputs",
        str(tmp_path / "in.npz"),
        "-o",
        str(tmp_path / "out.npz"),
        check=True,
    )
    npu = next(iter(np.load(tmp_path / "out.npz").values()))
    ref = ort.InferenceSession(str(q)).run(None, {"x": x})[0]
    cos = float((npu * ref).sum() / np.linalg.norm(npu) / np.linalg.norm(ref))
    assert cos > 0.999, cos


def test_quantize_static_api_writes_external_data(tmp_path: Path, small_limit: None) -> None:
    from zonnx.quantization.calibration.readers import ListReader

    src = chain(tmp_path / "m.onnx")
    feeds = [{"x": np.random.default_rng(i).standard_normal((1, D)).astype(np.float32)} for i in range(4)]
    res = zonnx.quantize_static(src, tmp_path / "q.onnx", ListReader(feeds), per_channel=True)
    assert (tmp_path / "q.onnx.data").is_file() and res.report is not None  # the per-layer report ran too
    m = onnx.load(str(tmp_path / "q.onnx"), load_external_data=False)
    assert any(t.data_location == TensorProto.EXTERNAL for t in m.graph.initializer)


def test_quantize_maps_weights_past_the_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Past the limit the source's weights stay in their file (onnx-ir ExternalTensors, mapped when read):
    the quantized model is the one the in-memory path writes, and is whole (no reference to the source)."""
    import onnx_ir as ir

    from zonnx.ir.large import load_mapped
    from zonnx.quantization.calibration.readers import ListReader

    src = chain(tmp_path / "m.onnx")
    feeds = [{"x": np.random.default_rng(i).standard_normal((1, D)).astype(np.float32)} for i in range(4)]
    assert load_mapped(src) is None  # under the 2 GiB limit: loaded whole, as before
    zonnx.quantize_static(src, tmp_path / "a.onnx", ListReader(feeds), per_channel=True)
    monkeypatch.setenv("ZONNX_PROTO_LIMIT", "100000")
    lazy = load_mapped(src)
    assert lazy is not None and all(
        isinstance(v.const_value, ir.ExternalTensor) for v in lazy.graph.initializers.values()
    )
    zonnx.quantize_static(src, tmp_path / "b.onnx", ListReader(feeds), per_channel=True)
    skeleton = onnx.load(str(tmp_path / "b.onnx"), load_external_data=False)
    assert {e.value for t in skeleton.graph.initializer for e in t.external_data if e.key == "location"} == {
        "b.onnx.data"
    }
    want = {t.name: numpy_helper.to_array(t) for t in load_proto(tmp_path / "a.onnx").graph.initializer}
    got = {t.name: numpy_helper.to_array(t) for t in load_proto(tmp_path / "b.onnx").graph.initializer}
    assert want.keys() == got.keys()
    for name, value in want.items():  # weight codes equal; scales equal to float rounding
        np.testing.assert_allclose(got[name], value, rtol=1e-6, atol=0 if value.dtype.kind in "iu" else 1e-9)
    x = feeds[0]["x"]
    a = ort.InferenceSession(str(tmp_path / "a.onnx")).run(None, {"x": x})[0]
    b = ort.InferenceSession(str(tmp_path / "b.onnx")).run(None, {"x": x})[0]
    np.testing.assert_allclose(b, a, atol=1e-5)


def test_npu_cache_key_covers_external_data(tmp_path: Path, small_limit: None) -> None:
    from zonnx.build_npu import target_quantize_kwargs
    from zonnx.quantization.calibration.readers import ListReader

    src = chain(tmp_path / "m.onnx")
    feeds = [{"x": np.random.default_rng(i).standard_normal((1, D)).astype(np.float32)} for i in range(4)]
    q = tmp_path / "q.onnx"
    zonnx.quantize_static(src, q, ListReader(feeds), **target_quantize_kwargs("bm1684x"))

    def session() -> zonnx.InferenceSession:
        return zonnx.InferenceSession(str(q), providers=["ZonnxNPUExecutionProvider", "CPUExecutionProvider"],
                                      provider_options=[{"target": "bm1684x", "cache_dir": str(tmp_path / "cache")}, {}])  # fmt: skip

    assert not session().from_cache and session().from_cache
    data = tmp_path / "q.onnx.data"
    raw = bytearray(data.read_bytes())
    raw[-1] ^= 1  # one weight code changes; the .onnx file does not
    data.write_bytes(bytes(raw))
    assert not session().from_cache


def test_truncated_external_data_is_one_line(tmp_path: Path) -> None:
    src = chain(tmp_path / "m.onnx")
    data = tmp_path / "m.onnx.data"
    data.write_bytes(data.read_bytes()[:1000])
    proc = run_cli("optimize", str(src), str(tmp_path / "o.onnx"))
    assert_one_line_error(proc, "m.onnx.data is truncated", "'w0'")
    assert not (tmp_path / "o.onnx").exists()


def test_load_whole_or_mapped_reads_the_file_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Under the limit the single read gives the model ``to_ir(path)`` gives (weights inline, equal);
    past it the weights stay mapped; a truncated data file still fails with the reader's message."""
    import onnx_ir as ir

    from zonnx.ir.io import to_ir
    from zonnx.ir.large import load_whole_or_mapped

    src = chain(tmp_path / "m.onnx")
    model, mapped = load_whole_or_mapped(src)
    assert not mapped and model is not None
    want = to_ir(src)
    assert [n.op_type for n in model.graph] == [n.op_type for n in want.graph]
    for name, value in want.graph.initializers.items():
        got = model.graph.initializers[name].const_value
        assert not isinstance(got, ir.ExternalTensor)
        np.testing.assert_array_equal(got.numpy(), value.const_value.numpy())
    monkeypatch.setenv("ZONNX_PROTO_LIMIT", "100000")
    model, mapped = load_whole_or_mapped(src)
    assert mapped and all(
        isinstance(v.const_value, ir.ExternalTensor) for v in model.graph.initializers.values()
    )
    monkeypatch.delenv("ZONNX_PROTO_LIMIT")
    data = tmp_path / "m.onnx.data"
    data.write_bytes(data.read_bytes()[:1000])
    with pytest.raises(zonnx.errors.ModelLoadError, match="m.onnx"):
        load_whole_or_mapped(src)


def test_checker_sees_a_mapped_model_without_its_weights(tmp_path: Path, small_limit: None) -> None:
    """onnx.checker on a model past the limit (it raised EncodeError past 2 GiB) or naming its files from
    the filesystem root: the graph is checked with the weights as typed inputs, and still refused when
    a node is wrong."""
    from zonnx.ir.large import check_model, load_mapped

    src = chain(tmp_path / "m.onnx")
    mapped = onnx_ir_serialize(load_mapped(src))
    with pytest.raises(onnx.checker.ValidationError):  # onnx's own check resolves 'tmp/...' from the cwd
        onnx.checker.check_model(mapped)
    check_model(mapped, full_check=True)
    whole = load_proto(src)
    assert is_large(whole)
    check_model(whole)
    assert len(whole.graph.initializer) == LAYERS and whole.graph.initializer[0].raw_data  # input untouched
    whole.graph.node[0].input.append("w1")  # MatMul with three inputs
    with pytest.raises(onnx.checker.ValidationError, match="input size 3"):
        check_model(whole)


def onnx_ir_serialize(model: object) -> onnx.ModelProto:
    import onnx_ir as ir

    assert isinstance(model, ir.Model)
    return ir.serde.serialize_model(model)


def test_build_and_convert_past_the_limit(tmp_path: Path, small_limit: None) -> None:
    """``zonnx build`` on a model past the limit (its optimize --verify and quantize keep the weights
    mapped) and ``zonnx convert`` of a torch model past it, without --external-data: every model written
    keeps its weights in NAME.onnx.data, and the compiled model runs close to the quantized one."""
    src = chain(tmp_path / "m.onnx")
    np.savez(tmp_path / "calib.npz", x=np.random.default_rng(0).standard_normal((8, D)).astype(np.float32))
    run_cli("build", str(src), "-o", str(tmp_path / "b"), "--calib", str(tmp_path / "calib.npz"),
            "--target", "bm1684x", check=True)  # fmt: skip
    opt = tmp_path / "b" / "m.opt.onnx"
    assert (tmp_path / "b" / "m.opt.onnx.data").stat().st_size >= LAYERS * D * D * 4
    x = np.random.default_rng(3).standard_normal((1, D)).astype(np.float32)
    np.testing.assert_allclose(
        ort.InferenceSession(str(opt)).run(None, {"x": x})[0],
        ort.InferenceSession(str(src)).run(None, {"x": x})[0],
        atol=1e-6,
    )
    quant, compiled = tmp_path / "b" / "m.bm1684x.q.onnx", tmp_path / "b" / "m.bm1684x.q.bm1684x.onnx"
    for path in (quant, compiled):
        assert Path(f"{path}.data").stat().st_size > path.stat().st_size, path
    npu = zonnx.InferenceSession(str(compiled)).run(None, {"x": x})[0]
    ref = ort.InferenceSession(str(quant)).run(None, {"x": x})[0]
    assert float((npu * ref).sum() / np.linalg.norm(npu) / np.linalg.norm(ref)) > 0.999

    (tmp_path / "mlp.py").write_text(
        "import torch\nfrom torch import nn\n\n\nclass Mlp(nn.Module):\n    def __init__(self):\n"
        "        super().__init__()\n        torch.manual_seed(0)\n"
        "        self.a, self.b = nn.Linear(256, 256), nn.Linear(256, 256)\n\n"
        "    def forward(self, x):\n        return self.b(torch.relu(self.a(x)))\n"
    )
    out = tmp_path / "mlp.onnx"
    run_cli(
        "convert", "mlp.py:Mlp", "-o", str(out), "--input-shape", "x:1,256", cwd=str(tmp_path), check=True
    )
    assert Path(f"{out}.data").stat().st_size >= 2 * 256 * 256 * 4
    assert ort.InferenceSession(str(out)).run(None, {"x": x})[0].shape == (1, 256)
