"""``python -m zonnx.tools.build_native``: build the native NPU kernel library (setup calls it).

Prints the library path and the build time; on failure prints one line (no compiler, download or
compile error with the log's path) and exits 0 unless ``--strict``: the NPU then runs on the
pure-ONNX lowering.
"""

from __future__ import annotations

__all__ = ["main"]

import argparse
import sys

from zonnx.backend.native import NativeBuildError, build_library


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m zonnx.tools.build_native", description=__doc__)
    ap.add_argument("--force", action="store_true", help="rebuild even when the cached library is current")
    ap.add_argument("--sanitize", action="store_true", help="build the UBSan variant (tests)")
    ap.add_argument("--strict", action="store_true", help="exit 1 when the build fails")
    args = ap.parse_args(argv)
    try:
        res = build_library(force=args.force, sanitize=args.sanitize)
    except NativeBuildError as e:
        print(f"zonnx native kernels: not built: {e}", file=sys.stderr)
        return 1 if args.strict else 0
    how = f"built in {res.seconds:.1f} s" if res.built else "up to date"
    print(f"zonnx native kernels: {res.path} ({how})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
