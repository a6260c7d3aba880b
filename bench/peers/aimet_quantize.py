"""Quantize a float ONNX model with AIMET-ONNX's QuantizationSimModel (a peer for bench_accuracy_peers).

Runs inside the benchmark's own virtualenv (``bench/.peers-venv/aimet``), never in zonnx's: it imports
neither zonnx nor anything of the benchmark, only numpy, onnx and aimet_onnx.

    python aimet_quantize.py FLOAT.onnx CALIB.npz OUT.onnx [--quant-scheme min_max|tf_enhanced]

AIMET's defaults otherwise: int8 weights and activations, the "default" config (per-channel weights),
calibration by running every sample through the sim (``compute_encodings``), exported as standard
QuantizeLinear/DequantizeLinear with ``to_onnx_qdq()`` (unsigned activations, AIMET's export default).
The calibration file is the one nncf_quantize.py reads (keys "<index>.<input name>"); the first sample
is AIMET's ``dummy_input`` for models with symbolic shapes.

Prints one JSON line on stdout: ``{"seconds": quantize call, "aimet_onnx": version, "samples": n, ...}``.
Bad arguments exit 2 with one line on stderr before aimet_onnx is imported.
"""

from __future__ import annotations

__all__ = ["parse_args", "main"]

import argparse
import json
import logging
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from calib_feeds import CalibFileError, load_feeds

logger = logging.getLogger(__name__)

SCHEMES = ("min_max", "tf_enhanced")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse and check the arguments: existing input files, an .onnx output that is not the input."""
    parser = argparse.ArgumentParser(prog="aimet_quantize.py", description=__doc__.splitlines()[0])
    parser.add_argument("input", type=Path, help="float ONNX model")
    parser.add_argument("calib", type=Path, help="calibration feeds (.npz, keys '<index>.<input name>')")
    parser.add_argument("output", type=Path, help="where to write the quantized ONNX model")
    parser.add_argument("--quant-scheme", choices=SCHEMES, default="min_max", help="AIMET QuantScheme")
    args = parser.parse_args(argv)
    if not args.input.is_file() or args.input.suffix != ".onnx":
        parser.error(f"input model {args.input} is not an existing .onnx file.")
    if not args.calib.is_file() or args.calib.suffix != ".npz":
        parser.error(f"calibration file {args.calib} is not an existing .npz file.")
    if args.output.suffix != ".onnx":
        parser.error(f"output {args.output} must end in .onnx.")
    if args.output.resolve() == args.input.resolve():
        parser.error(f"output {args.output} is the input model: give another path.")
    if not args.output.parent.is_dir():
        parser.error(f"output folder {args.output.parent} does not exist.")
    try:
        args.feeds = load_feeds(args.calib)
    except (CalibFileError, OSError, ValueError) as e:
        parser.error(str(e))
    return args


def _quantize(args: argparse.Namespace) -> dict[str, Any]:
    import aimet_onnx
    import onnx
    from aimet_onnx.quantsim import QuantizationSimModel

    model = onnx.load(str(args.input))
    with tempfile.TemporaryDirectory(prefix="aimet-") as tmp:
        start = time.perf_counter()
        sim = QuantizationSimModel(
            model,
            quant_scheme=args.quant_scheme,
            dummy_input=args.feeds[0],
            providers=["CPUExecutionProvider"],
            path=tmp,
        )
        sim.compute_encodings(args.feeds)
        quantized = sim.to_onnx_qdq()
        seconds = time.perf_counter() - start
    onnx.save(quantized, str(args.output))
    return {
        "seconds": seconds,
        "aimet_onnx": aimet_onnx.__version__,
        "samples": len(args.feeds),
        "quant_scheme": args.quant_scheme,
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Check the arguments, quantize with AIMET, write the model and print the JSON summary line."""
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    print(json.dumps(_quantize(args)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
