"""Quantize a float ONNX model with NNCF's post-training quantization (a peer for bench_accuracy_peers).

Runs inside the benchmark's own virtualenv (``bench/.peers-venv``), never in zonnx's: it imports
neither zonnx nor anything of the benchmark, only numpy, onnx and nncf.

    python nncf_quantize.py FLOAT.onnx CALIB.npz OUT.onnx [--model-type transformer] [--smooth-quant-matmul A]

The calibration file holds one feed per sample, keyed ``"<index>.<input name>"`` (index 0, 1, ... with
no gaps; every sample has the same inputs). Samples may have different shapes: NNCF gets one sample per
item (batch size 1), so its statistics never stack tensors of different widths. ``subset_size`` is the
number of samples, so NNCF sees all of them and no more.

Prints one JSON line on stdout: ``{"seconds": quantize call, "nncf": version, "samples": n, ...}``.
Bad arguments exit 2 with one line on stderr before nncf is imported.
"""

from __future__ import annotations

__all__ = ["parse_args", "main"]

import argparse
import json
import logging
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from calib_feeds import CalibFileError, load_feeds

logger = logging.getLogger(__name__)

MODEL_TYPES = ("default", "transformer")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse and check the arguments: existing input files, an .onnx output that is not the input, alphas."""
    parser = argparse.ArgumentParser(prog="nncf_quantize.py", description=__doc__.splitlines()[0])
    parser.add_argument("input", type=Path, help="float ONNX model")
    parser.add_argument("calib", type=Path, help="calibration feeds (.npz, keys '<index>.<input name>')")
    parser.add_argument("output", type=Path, help="where to write the quantized ONNX model")
    parser.add_argument("--model-type", choices=MODEL_TYPES, default="default", help="nncf.ModelType")
    parser.add_argument(
        "--smooth-quant-matmul",
        type=float,
        default=None,
        help="SmoothQuant alpha for MatMul (NNCF default 0.95, applied with --model-type transformer only; "
        "negative switches it off)",
    )
    parser.add_argument(
        "--smooth-quant-conv",
        type=float,
        default=None,
        help="SmoothQuant alpha for Conv (NNCF default -1: off; transformer only)",
    )
    args = parser.parse_args(argv)
    if not args.input.is_file():
        parser.error(f"input model {args.input} does not exist: give the float .onnx file.")
    if args.input.suffix != ".onnx":
        parser.error(f"input model {args.input} is not an .onnx file.")
    if not args.calib.is_file() or args.calib.suffix != ".npz":
        parser.error(f"calibration file {args.calib} is not an existing .npz file.")
    if args.output.suffix != ".onnx":
        parser.error(f"output {args.output} must end in .onnx.")
    if args.output.resolve() == args.input.resolve():
        parser.error(f"output {args.output} is the input model: give another path.")
    if not args.output.parent.is_dir():
        parser.error(f"output folder {args.output.parent} does not exist.")
    sq_given = args.smooth_quant_matmul is not None or args.smooth_quant_conv is not None
    if sq_given and args.model_type != "transformer":
        parser.error(
            "--smooth-quant-* apply with --model-type transformer only (NNCF runs SmoothQuant there)."
        )
    for flag in ("smooth_quant_matmul", "smooth_quant_conv"):
        alpha = getattr(args, flag)
        if alpha is not None and alpha > 1:
            parser.error(f"--{flag.replace('_', '-')} {alpha}: alpha must be <= 1 (negative turns it off).")
    try:
        args.feeds = load_feeds(args.calib)
    except (CalibFileError, OSError, ValueError) as e:
        parser.error(str(e))
    return args


def _quantize(args: argparse.Namespace) -> dict[str, Any]:
    import nncf
    import onnx
    from nncf.quantization.advanced_parameters import (
        AdvancedQuantizationParameters,
        AdvancedSmoothQuantParameters,
    )

    model = onnx.load(str(args.input))
    kwargs: dict[str, Any] = {"subset_size": len(args.feeds)}
    smooth_quant = None
    if args.model_type == "transformer":
        kwargs["model_type"] = nncf.ModelType.TRANSFORMER
        sq = AdvancedSmoothQuantParameters()
        if args.smooth_quant_matmul is not None:
            sq.matmul = args.smooth_quant_matmul
        if args.smooth_quant_conv is not None:
            sq.convolution = args.smooth_quant_conv
        kwargs["advanced_parameters"] = AdvancedQuantizationParameters(smooth_quant_alphas=sq)
        smooth_quant = {"matmul": sq.matmul, "conv": sq.convolution}
    start = time.perf_counter()
    quantized = nncf.quantize(model, nncf.Dataset(args.feeds), **kwargs)
    seconds = time.perf_counter() - start
    onnx.save(quantized, str(args.output))
    return {
        "seconds": seconds,
        "nncf": nncf.__version__,
        "samples": len(args.feeds),
        "model_type": args.model_type,
        "smooth_quant": smooth_quant,
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Check the arguments, quantize with NNCF, write the model and print the JSON summary line."""
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    print(json.dumps(_quantize(args)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
