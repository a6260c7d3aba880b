"""``zonnx run MODEL --inputs X.npz``: run on the NPU provider, print the outputs, dump and golden-compare every layer."""

from __future__ import annotations

__all__ = ["run"]

import hashlib
import io
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import typer
from rich.markup import escape
from rich.table import Table

from zonnx.backend.compiled import compiled_info, is_compiled
from zonnx.backend.dump import dump_layers, write_dump
from zonnx.backend.golden import DEFAULT_TOL_COS, DEFAULT_TOL_LSB, GoldenReport, compare_layers
from zonnx.backend.session import CPU_PROVIDER, NPU_PROVIDER, InferenceSession, summary_line
from zonnx.errors import ModelSaveError, OptionError, did_you_mean
from zonnx.inspection.render import PLAIN_BOX
from zonnx.ir.io import load_proto, write_bytes_atomic
from zonnx.paths import refuse_overwrites, target_file
from zonnx.tools.console import console, err_console
from zonnx.tools.options import load_feeds
from zonnx.verify import make_inputs

_COMPARE = ("golden",)


def _check_options(compare: str | None, paths: dict[str, Path | None], tol_cos: float, tol_lsb: int) -> None:
    if compare is not None and compare not in _COMPARE:
        raise OptionError(
            f"--compare {compare!r}: the only comparison is 'golden'.{did_you_mean(compare, _COMPARE)}"
        )
    for flag, value in paths.items():
        if value is not None and compare is None:
            raise OptionError(f"{flag} is used by --compare golden; add --compare golden.")
        if value is not None and flag != "--report" and not value.is_file():
            raise OptionError(f"{flag} {value}: no such file.")
    if not -1 <= tol_cos <= 1:
        raise OptionError(f"--tol-cos {tol_cos}: a cosine lies in [-1, 1]; 0.99 is the usual threshold.")
    if tol_lsb < 0:
        raise OptionError(f"--tol-lsb {tol_lsb}: give a number of codes >= 0 (0 asks for equal codes).")


def _check_feeds(feeds: dict[str, np.ndarray], sess: InferenceSession, where: Path) -> None:
    """Feed names must be the model's inputs: name the missing or extra array and the expected shape."""
    inputs = {i.name: i for i in sess.get_inputs()}
    expected = ", ".join(f"{n} {a.type} {a.shape}" for n, a in inputs.items())
    for name in feeds:
        if name not in inputs:
            raise OptionError(
                f"--inputs {where}: array {name!r} is not an input of the model.{did_you_mean(name, inputs)} "
                f"The model's inputs: {expected}."
            )
    for name, arg in inputs.items():
        if name not in feeds:
            raise OptionError(
                f"--inputs {where}: no array named {name!r} (expected {arg.type} {arg.shape}); "
                f"the file holds {', '.join(feeds) or 'no arrays'}."
            )


def _recorded(proto: onnx.ModelProto, key: str, notes: list[str]) -> Path | None:
    """A path the compiled model's metadata records (``zonnx.<key>``), if the file is there and unchanged."""
    info = compiled_info(proto)
    path = Path(info[key]) if info.get(key) else None
    if path is None or not path.is_file():
        return None
    digest = info.get("source_sha256") if key == "source" else None
    if digest and hashlib.sha256(path.read_bytes()).hexdigest() != digest:
        notes.append(f"{path} (recorded as the quantized source) changed since compiling; not used")
        return None
    notes.append(
        f"{'quantized' if key == 'source' else 'float'} model {path} (recorded in the compiled model)"
    )
    return path


def _golden_models(
    model: Path, proto: onnx.ModelProto, float_model: Path | None, qdq: Path | None, notes: list[str]
) -> tuple[Path | None, Path | None]:
    """(float model, quantized model): the options first, then MODEL itself when it is the quantized
    model, then the paths the compiled model's metadata records (``source``, ``float_source``)."""
    compiled = is_compiled(proto)
    if qdq is None:
        qdq = _recorded(proto, "source", notes) if compiled else model
    if float_model is None and compiled:
        float_model = _recorded(proto, "float_source", notes)
    if qdq is None and float_model is None:
        raise OptionError(
            f"{model}: --compare golden needs the quantized model this was compiled from (--qdq-model "
            "model_int8.onnx) and/or the float model (--float-model float.onnx); the compiled model's "
            "NpuSubgraph nodes cannot stand in for them."
        )
    return float_model, qdq


def _stats(outputs: dict[str, np.ndarray]) -> list[dict[str, Any]]:
    out = []
    for name, v in outputs.items():
        values = v.astype(np.float64) if v.size and v.dtype != bool else np.zeros(1)
        out.append({"name": name, "shape": list(v.shape), "dtype": str(v.dtype), "min": float(values.min()),
                    "max": float(values.max()), "mean": float(values.mean())})  # fmt: skip
    return out


def _outputs_table(stats: list[dict[str, Any]]) -> Table:
    table = Table(title="outputs", box=PLAIN_BOX, title_justify="left")
    for col in ("name", "shape", "dtype", "min", "max", "mean"):
        table.add_column(col, justify="right" if col in ("min", "max", "mean") else "left")
    for s in stats:
        table.add_row(
            escape(s["name"]), str(s["shape"]), s["dtype"], *(f"{s[k]:.5g}" for k in ("min", "max", "mean"))
        )
    return table


def _num(v: float | None, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def _golden_table(report: GoldenReport) -> Table:
    table = Table(title="NPU layers vs golden (program order)", box=PLAIN_BOX, title_justify="left")
    for col in (
        "#",
        "layer (tensor)",
        "op",
        "shape",
        "cos float",
        "SQNR dB",
        "LSB fq",
        "op LSB",
        "codes diff",
    ):
        table.add_column(col, justify="left" if col in ("layer (tensor)", "op") else "right")
    table.add_column("status")
    for r in report.rows:
        compared = r.cos_float is not None or r.max_lsb is not None
        table.add_row(
            str(r.index), escape(r.tensor), r.kind, "x".join(map(str, r.shape)), _num(r.cos_float, ".5f"),
            _num(r.sqnr_db, ".1f"), _num(r.max_lsb, "d"), _num(r.local_lsb, "d"),
            "-" if r.codes_diff is None else f"{r.codes_diff}/{r.size}",
            "DIVERGES" if r.diverged else ("ok" if compared else "-"),
            style="bold red" if r is report.first_divergence else ("yellow" if r.diverged else None),
        )  # fmt: skip
    return table


def _write(path: Path, data: bytes, flag: str) -> None:
    try:
        write_bytes_atomic(path, data)
    except OSError as e:
        raise ModelSaveError(f"{flag} {path}: cannot write it ({e.strerror or e}).") from None


def _print(data: dict[str, Any], golden: GoldenReport | None, output: Path | None) -> None:
    for note in data["notes"]:
        err_console.print(f"note: {escape(note)}", soft_wrap=True)
    console.print(_outputs_table(data["outputs"]))
    if output is not None:
        console.print(f"wrote {escape(str(output))}", soft_wrap=True)
    if "dump" in data:
        d = data["dump"]
        console.print(
            f"dumped {d['tensors']} NPU tensors to {escape(d['folder'])} (index {escape(d['index'])})",
            soft_wrap=True,
        )
    if golden is not None:
        console.print(_golden_table(golden))
        for note in golden.notes:
            console.print(f"note: {escape(note)}", soft_wrap=True)
        style = "bold red" if golden.first_divergence else "bold green"
        console.print(escape(golden.summary()), style=style, soft_wrap=True)


def run(
    model: Path = typer.Argument(
        ..., help="A compiled model, or a quantized one (compiled on the fly).", show_default=False
    ),
    inputs: Path = typer.Option(None, "--inputs", "-i", help="Feeds as .npz (one array per input name)."),
    target: str = typer.Option(None, "--target", "-t", help="Target when MODEL is not compiled yet."),
    output: Path = typer.Option(None, "--output", "-o", help="Write the outputs to this .npz file."),
    dump: Path = typer.Option(None, "--dump", help="Write every NPU layer's codes under this folder."),
    compare: str = typer.Option(
        None, "--compare", help="'golden': check every NPU layer (float, fake-quant)."
    ),
    float_model: Path = typer.Option(None, "--float-model", help="Float model for --compare golden."),
    qdq_model: Path = typer.Option(None, "--qdq-model", help="Quantized model for --compare golden."),
    tol_cos: float = typer.Option(DEFAULT_TOL_COS, "--tol-cos", help="Minimum cosine vs float."),
    tol_lsb: int = typer.Option(DEFAULT_TOL_LSB, "--tol-lsb", help="Maximum code difference vs fake-quant."),
    json_: bool = typer.Option(False, "--json", help="Print everything as JSON instead of tables."),
    report: Path = typer.Option(None, "--report", help="Also write the JSON to this file."),
    seed: int = typer.Option(0, "--seed", help="Seed of generated inputs (without --inputs)."),
    strict: bool = typer.Option(
        False, "--strict", help="Fail (exit 2) when the NPU gets no node or under half the MACs."
    ),
) -> None:
    """Run MODEL with ZonnxNPUExecutionProvider and print each output's shape, dtype and range.

    --dump DIR writes DIR/<subgraph>/<tensor>.npy for every NPU op output (the program's integer codes)
    and DIR/index.json (name, op, dtype, shape, scale, zero point). --compare golden compares each NPU
    layer with the float model (cosine, SQNR) and the fake-quantized model run by onnxruntime (codes
    that differ, in LSB) and names the first layer beyond --tol-cos / --tol-lsb; the exit code is then
    1. Bad input (missing file, wrong input name) exits with 2. `zonnx compare` runs the same layer
    comparison for a compiled model and one other model, and compares any two forms of a network.
    """
    paths = {"--float-model": float_model, "--qdq-model": qdq_model, "--report": report}
    _check_options(compare, paths, tol_cos, tol_lsb)
    refuse_overwrites(
        {"MODEL": model, "--inputs": inputs, "--float-model": float_model, "--qdq-model": qdq_model,
         "--target": target_file(target)},
        {"--output": output, "--report": report},
    )  # fmt: skip
    proto = load_proto(model)
    notes: list[str] = []
    fmodel, qmodel = _golden_models(model, proto, float_model, qdq_model, notes) if compare else (None, None)
    feeds = load_feeds(inputs) if inputs is not None else make_inputs(proto, seed=seed)
    options: dict[str, str] = {"target": target} if target else {}
    if strict:
        options["strict"] = "1"
    sess = InferenceSession(
        str(model), providers=[NPU_PROVIDER, CPU_PROVIDER], provider_options=[options, {}]
    )
    if sess.partition is not None:
        notes.append(f"{sess.partition.target}: {summary_line(sess.partition)}")
    if inputs is None:
        shapes = ", ".join(f"{k} {list(v.shape)}" for k, v in feeds.items())
        notes.insert(0, f"no --inputs: generated inputs (seed {seed}): {shapes}")
    else:
        _check_feeds(feeds, sess, inputs)
    names = [o.name for o in sess.get_outputs()]
    outputs = dict(zip(names, sess.run(names, feeds), strict=True))
    if output is not None:
        buf = io.BytesIO()
        np.savez(buf, **outputs)
        _write(output, buf.getvalue(), "-o")
    data: dict[str, Any] = {
        "model": str(model),
        "executor": sess.executor,
        "inputs": {
            k: {"shape": list(v.shape), "dtype": str(v.dtype), "generated": inputs is None}
            for k, v in feeds.items()
        },  # fmt: skip
        "outputs": _stats(outputs),
        "notes": notes,
    }
    golden = None
    if dump is not None or compare is not None:
        layers = dump_layers(sess.compiled_model, feeds)
        if dump is not None:
            index = write_dump(layers, dump)
            data["dump"] = {"folder": str(dump), "index": str(index), "tensors": len(layers.layers)}
        if compare is not None:
            golden = compare_layers(sess.compiled_model, feeds, float_model=fmodel, qdq_model=qmodel,
                                    tol_cos=tol_cos, tol_lsb=tol_lsb, dump=layers)  # fmt: skip
            data["golden"] = {**golden.to_dict(), "summary": golden.summary()}
    if report is not None:
        _write(report, json.dumps(data, indent=1).encode(), "--report")
    if json_:
        sys.stdout.write(json.dumps(data, indent=1) + "\n")
    else:
        _print(data, golden, output)
    if golden is not None and golden.first_divergence is not None:
        raise typer.Exit(1)
