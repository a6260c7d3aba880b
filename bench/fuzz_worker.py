"""A long-lived process that runs ``zonnx`` CLI cases in-process for the fuzzer, one JSON line each way.

Reads ``{"args": [...], "cwd": "..."}`` lines on stdin and answers ``{"exit": N, "traceback": str | null,
"stderr": "..."}`` on its own stdout. The rule it applies is the CLI's: a ``ZonnxError`` is one line
and its exit code (what ``zonnx.tools.main.main`` does), typer's usage errors are exit 2, and any other
exception escaping the command is a traceback the user would have seen. Running in-process keeps
the fuzzer at hundreds of cases a minute; the parent kills and restarts this worker on a hang.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import sys
import traceback
from pathlib import Path

from zonnx.errors import ZonnxError
from zonnx.tools.main import app


def _python_api(args: list[str]) -> None:
    """The Python entry points a user calls with the same files: ``@session MODEL TARGET FEEDS`` runs
    ``zonnx.InferenceSession`` with the NPU provider; ``@quantize_static MODEL OUT CALIB`` quantizes."""
    import zonnx
    from zonnx.quantization.calibration.readers import ListReader, load_arrays

    if args[0] == "@session":
        model, target, feeds = args[1:]
        session = zonnx.InferenceSession(
            model,
            providers=["ZonnxNPUExecutionProvider", "CPUExecutionProvider"],
            provider_options=[{"target": target}, {}],
        )
        session.run(None, load_arrays(Path(feeds)))
    else:
        model, out, calib = args[1:]
        arrays = load_arrays(Path(calib))
        feeds = [{name: value[i : i + 1] for name, value in arrays.items()} for i in range(2)]
        zonnx.quantize_static(model, out, ListReader(feeds))


def run_case(args: list[str], cwd: str) -> dict[str, object]:
    """Run one CLI invocation (or a ``@``-named Python API call) in ``cwd``; return its exit code,
    captured stderr and any traceback. In the API a ``ZonnxError`` or ``ValueError`` is the clean
    refusal (exit 2 here), anything else a traceback."""
    out, err = io.StringIO(), io.StringIO()
    code, trace = 0, None
    previous = os.getcwd()
    os.chdir(cwd)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                if args[0].startswith("@"):
                    try:
                        _python_api(args)
                    except ValueError as e:  # ZonnxError subclasses that are not ValueErrors fall below
                        raise SystemExit(2) from e
                else:
                    app(args, prog_name="zonnx")
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            except ZonnxError as e:
                code = e.exit_code
                print(f"error: {e}", file=sys.stderr)
            except Exception:  # noqa: BLE001 - the point: any other exception is a user-visible traceback
                code, trace = 1, traceback.format_exc()
    finally:
        os.chdir(previous)
        logging.getLogger().handlers.clear()
    return {"exit": code, "traceback": trace, "stderr": err.getvalue()[-2000:]}


def main() -> None:
    """Serve cases from stdin until it closes."""
    reply = sys.stdout
    for line in sys.stdin:
        case = json.loads(line)
        reply.write(json.dumps(run_case(case["args"], case["cwd"])) + "\n")
        reply.flush()


if __name__ == "__main__":
    main()
