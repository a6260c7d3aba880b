"""The benchmark runner: timing and memory helpers, ratio/target math, table, markdown and JSON output."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from bench import runner
from bench.runner import HIGHER, LOWER, BenchContext, Benchmark, Measurement
from zonnx.errors import OptionError

A = np.random.default_rng(0).standard_normal((48, 48)).astype(np.float32)


def _loop_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The peer: a row-by-row matmul, much slower than one BLAS call."""
    return np.stack([row @ b for row in a])


def bench_matmul(ctx: BenchContext) -> list[Measurement]:
    """A real tiny benchmark: numpy's matmul (ours) against a per-row loop (peer), both timed here."""
    ours = ctx.time(lambda: A @ A).median
    peer = ctx.time(lambda: _loop_matmul(A, A)).median
    np.testing.assert_allclose(A @ A, _loop_matmul(A, A), rtol=1e-4, atol=1e-4)
    return [
        Measurement(
            "matmul time", ours * 1e6, "us", LOWER, peer="row loop", peer_value=peer * 1e6, target=1.0
        ),
        Measurement("matmul speed-up", peer / ours, "x", HIGHER, target=1e9),  # no peer: target on value
    ]


def bench_broken(ctx: BenchContext) -> list[Measurement]:
    raise ValueError("no such device")


REGISTRY = {
    "matmul": Benchmark("matmul", bench_matmul, "numpy matmul vs row loop"),
    "broken": Benchmark("broken", bench_broken),
}


def _allocate(mib: int) -> None:
    block = np.ones((mib, 1024, 1024), dtype=np.uint8)  # touched, so resident
    assert int(block[-1, -1, -1]) == 1


def test_ratio_and_verdict_follow_the_direction():
    faster = Measurement("t", 2.0, "ms", LOWER, peer="p", peer_value=8.0, target=0.5)
    assert faster.ratio == 0.25 and faster.passed is True
    slower = Measurement("t", 6.0, "ms", LOWER, peer="p", peer_value=8.0, target=0.5)
    assert slower.ratio == 0.75 and slower.passed is False
    throughput = Measurement("r", 300.0, "img/s", HIGHER, peer="p", peer_value=200.0, target=1.5)
    assert throughput.ratio == 1.5 and throughput.passed is True
    assert Measurement("r", 1.0, "x").passed is None and Measurement("r", 1.0, "x").ratio is None
    assert Measurement("acc", 0.96, "", HIGHER, target=0.97).passed is False  # no peer: value vs target
    with pytest.raises(OptionError, match="direction"):
        Measurement("r", 1.0, "x", "bigger")
    with pytest.raises(OptionError, match="peer_value"):
        Measurement("r", 1.0, "x", peer="p")


def test_time_call_counts_warmups_and_repeats():
    calls = []

    def fn():
        calls.append(1)
        time.sleep(0.002)

    stats = runner.time_call(fn, repeat=5, warmup=2)
    assert len(calls) == 7 and stats.repeat == 5
    assert 0.002 <= stats.min <= stats.median <= 0.2 and stats.mean >= stats.min
    with pytest.raises(OptionError):
        runner.time_call(fn, repeat=0)


def test_peak_rss_sees_a_child_allocation():
    _allocate(300)  # a parent peak above the child's: ru_maxrss would carry it into the spawned child
    big = runner.peak_rss(_allocate, 200)
    small = runner.peak_rss(_allocate, 1)
    assert big.delta >= 190 * 2**20 and big.peak > big.baseline > 10 * 2**20
    assert small.delta < 50 * 2**20
    with pytest.raises(RuntimeError, match="failed in the child"):
        runner.peak_rss(_allocate, -1)


def test_traced_peak_sees_numpy_allocations():
    mem = runner.traced_peak(_allocate, 16)
    assert 16 * 2**20 <= mem.delta < 20 * 2**20


def test_run_benchmarks_measures_and_keeps_going_after_a_failure():
    ctx = BenchContext(repeat=5, warmup=1, quick=True)
    results = runner.run_benchmarks(["matmul", "broken"], ctx, REGISTRY)
    matmul, broken = results
    time_m, speed = matmul.measurements
    assert time_m.ratio == pytest.approx(time_m.value / time_m.peer_value)
    assert time_m.ratio < 1.0 and time_m.passed is True  # BLAS beats the Python row loop
    assert speed.ratio is None and speed.passed is False and matmul.failed
    assert broken.error == "ValueError: no such device" and broken.measurements == []
    with pytest.raises(OptionError, match="Did you mean 'matmul'"):
        runner.run_benchmarks(["matmull"], ctx, REGISTRY)


def test_markdown_json_and_table_output():
    ctx = BenchContext(repeat=3, warmup=0)
    m = Measurement("thr", 12345.6, "img/s", HIGHER, peer="ORT", peer_value=10000.0, target=1.2)
    results = [runner.BenchResult("demo", [m], 0.5), runner.BenchResult("bad", [], 0.1, "ValueError: x")]
    md = runner.to_markdown(results).splitlines()
    assert md[0].startswith("| benchmark | measurement | ours | peer | ratio (ours/peer)")
    assert md[2] == "| demo | thr | 12,346 img/s | ORT: 10,000 img/s | 1.235x | >= 1.2 | pass |"
    assert md[3].startswith("| bad | ERROR | ValueError: x |")
    data = json.loads(json.dumps(runner.to_json(results, ctx)))
    assert data["context"] == {"repeat": 3, "warmup": 0, "quick": False}
    got = data["benchmarks"][0]["measurements"][0]
    assert got["ratio"] == pytest.approx(1.23456) and got["passed"] is True and got["peer"] == "ORT"
    table = runner.render_table(results)
    assert table.row_count == 2 and len(table.columns) == 7
    noted = Measurement("acc", 0.5, "acc", HIGHER, note="float 0.9, 10 samples")
    md = runner.to_markdown([runner.BenchResult("demo", [m, noted], 0.5)]).splitlines()
    assert md[-2:] == ["", "- note on demo, acc: float 0.9, 10 samples"]  # notes follow the table


def test_cli_writes_json_and_markdown(tmp_path, capsys):
    out = tmp_path / "r.json"
    code = runner.main(["matmul", "--quick", "--markdown", "--json", str(out)], registry=REGISTRY)
    assert code == 0  # a missed target alone is not an error without --strict
    printed = capsys.readouterr().out
    assert "| matmul | matmul time |" in printed and "| FAIL |" in printed
    data = json.loads(out.read_text())
    assert data["context"]["quick"] is True and data["context"]["repeat"] == 3
    assert runner.main(["matmul", "--quick", "--strict", "--markdown"], registry=REGISTRY) == 1
    assert runner.main(["broken", "--markdown"], registry=REGISTRY) == 1
    assert runner.main(["nope"], registry=REGISTRY) == 2
    assert runner.main(["--list"], registry=REGISTRY) == 0
    assert "numpy matmul vs row loop" in capsys.readouterr().out


def test_registered_benchmarks_resolve():
    for bench in runner.REGISTRY.values():
        assert callable(bench.load()), bench.name


def test_time_pair_alternates_and_times_each_side():
    order = []
    ours, peer = runner.time_pair(
        lambda: order.append("a"), lambda: (order.append("b"), time.sleep(0.003)), 4, 1
    )
    assert order == ["a", "b"] * 5
    assert ours.repeat == peer.repeat == 4 and peer.min >= 0.003 > ours.median


def test_time_interleaved_runs_every_function_in_each_round() -> None:
    calls: list[str] = []
    stats = runner.time_interleaved({k: (lambda k=k: calls.append(k)) for k in "abc"}, repeat=3, warmup=1)
    assert calls == list("abc") * 4 and [s.repeat for s in stats.values()] == [3, 3, 3]


def _described(ctx: BenchContext) -> list[Measurement]:
    ctx.describe(["resnet18-random", "ppocr_rec"], {"calibration": 8}, {"calibration": 1})
    return [Measurement("x", 2.0, "s", LOWER, peer="p", peer_value=4.0)]


def test_markdown_header_names_host_versions_models_provenance_samples_seeds() -> None:
    ctx = BenchContext(repeat=1, warmup=0)
    results = runner.run_benchmarks(["d"], ctx, {"d": Benchmark("d", _described)})
    text = runner.to_markdown(results, ctx)
    from zonnx.hostcpu import host_int

    assert f"integer ISA {host_int().isa}" in text and "onnxruntime 1." in text
    assert "d: model resnet18-random [random weights]" in text
    assert "d: model ppocr_rec [pretrained third-party weights]" in text
    assert "d: samples calibration 8; seeds calibration 1" in text
    assert "| d | x | 2 s | p: 4 s | 0.5x |" in text
