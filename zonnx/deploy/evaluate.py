"""Run the float, fake-quantized and NPU models on evaluation samples, in batches, here or on Ray; score them.

Samples are cut into batches of ``batch`` samples; one task runs one model on one batch and returns its
outputs (sample by sample, graph-output order). Tasks go through an executor's ``map`` (the interface of
``zonnx.quantization.search.executor``): ``LocalExecutor`` in process, ``RayExecutor`` as Ray tasks.
Workers open models from their paths (sessions are never pickled) and keep them open between tasks.
Outputs come back in sample order whatever ran them, and the metric runs here on them, so a Ray run
gives exactly the numbers of a local one.
"""

from __future__ import annotations

__all__ = ["run_batch", "RayExecutor", "make_executor", "evaluate_models"]

import logging
import os
import socket
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from zonnx.deploy.data import make_metric
from zonnx.errors import OptionError, VerificationError
from zonnx.metrics.protocol import as_number
from zonnx.quantization.search.executor import Executor, LocalExecutor

logger = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")
_SESSIONS: dict[tuple[str, int], Any] = {}


def _session(path: str) -> Any:
    """A session for ``path``, kept per process: NPU provider for compiled models, ORT as written else."""
    key = (path, os.stat(path).st_mtime_ns)
    if key not in _SESSIONS:
        import onnx

        from zonnx.backend.compiled import is_compiled

        if is_compiled(onnx.load(path, load_external_data=False)):
            from zonnx.backend.session import CPU_PROVIDER, NPU_PROVIDER, InferenceSession

            _SESSIONS[key] = InferenceSession(path, providers=[NPU_PROVIDER, CPU_PROVIDER])
        else:
            from zonnx.verify import ort_session

            _SESSIONS[key] = ort_session(path)
    return _SESSIONS[key]


def run_batch(task: tuple[str, list[dict[str, np.ndarray]]]) -> list[list[np.ndarray]]:
    """Outputs of the model at ``task[0]`` on each sample of ``task[1]`` (only its input arrays are fed)."""
    path, samples = task
    session = _session(path)
    names = [i.name for i in session.get_inputs()]
    out = []
    for sample in samples:
        try:
            out.append([np.asarray(o) for o in session.run(None, {n: sample[n] for n in names})])
        except Exception as e:  # ORT's exception classes share no public base
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise VerificationError(f"{Path(path).name}: failed on an evaluation sample ({first}).") from None
    return out


#: Seconds to wait for a Ray head to accept a TCP connection (Ray's own client retries for minutes).
CONNECT_TIMEOUT = 5.0


#: How a config build runs without Ray (the end of a Ray error line).
IN_PROCESS = 'set [evaluate] backend = "local" to evaluate in process'


def _check_answers(address: str, fallback: str = IN_PROCESS) -> None:
    """Refuse at once a ``host:port`` (or ``ray://host:port``) where nothing accepts a connection."""
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not port.isdigit():
        return  # "auto" and other forms Ray resolves itself
    try:
        socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT).close()
    except OSError as e:
        raise OptionError(
            f"ray_address {address}: no Ray answers there ({e.strerror or e}); start the cluster, fix the "
            f"address, or {fallback}."
        ) from None


class RayExecutor:
    """Tasks as Ray tasks: on the cluster at ``address``, or on a local Ray started here (``num_cpus``).

    Implements ``zonnx.quantization.search.executor.Executor``: evaluation batches, calibration shards
    (``calibration_executor`` of ``quantize_static``) and the budget search's sensitivity tasks run on it.
    A Ray already initialized in this process is used as it is (and left running by ``close``).
    ``fallback`` ends the error lines: how the caller runs without Ray. ``workers`` is the cluster's CPU
    count (how many tasks run at once; the budget search scores that many probes per round).
    """

    def __init__(self, address: str = "", num_cpus: int = 2, fallback: str = IN_PROCESS) -> None:
        try:
            import ray
        except ImportError:
            raise OptionError("backend ray: Ray is not installed; pip install 'zonnx[ray]'.") from None
        self.ray = ray
        self.started = not ray.is_initialized()
        if self.started and address:
            _check_answers(address, fallback)
        if self.started:
            os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
            try:
                if address:
                    ray.init(address=address, log_to_driver=False, logging_level=logging.WARNING)
                else:
                    ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=False,
                             logging_level=logging.WARNING)  # fmt: skip
            except (ConnectionError, RuntimeError, ValueError) as e:
                where = f"ray_address {address}" if address else "a local Ray"
                raise OptionError(
                    f"{where}: Ray did not start or answer ({' '.join(str(e).split())[:160]}); {fallback}."
                ) from None

    @property
    def workers(self) -> int:
        return max(1, int(self.ray.cluster_resources().get("CPU", 1)))

    def map(self, fn: Callable[[T], R], items: Iterable[T]) -> Iterator[R]:
        remote = self.ray.remote(fn)
        refs = [remote.remote(item) for item in items]
        for ref in refs:
            yield self.ray.get(ref)

    def close(self) -> None:
        if self.started:
            self.ray.shutdown()


def make_executor(backend: str, address: str = "") -> Executor:
    """``LocalExecutor`` for "local", ``RayExecutor`` for "ray"."""
    return RayExecutor(address) if backend == "ray" else LocalExecutor()


def evaluate_models(
    models: Mapping[str, Path],
    samples: Sequence[dict[str, np.ndarray]],
    metric: str,
    *,
    batch: int,
    executor: Executor,
    advance: Callable[[int], None] | None = None,
) -> dict[str, Any]:
    """Score each of ``models`` (the first is the float reference) on ``samples`` with ``metric``."""
    if batch < 1:
        raise OptionError(f"[evaluate] batch {batch}: give at least 1 sample per task.")
    chunks = [list(samples[i : i + batch]) for i in range(0, len(samples), batch)]
    outputs: dict[str, list[list[np.ndarray]]] = {}
    for kind, path in models.items():
        outputs[kind] = []
        for result in executor.map(run_batch, [(str(path), chunk) for chunk in chunks]):
            outputs[kind] += result
            if advance is not None:
                advance(len(result))
    reference_kind = next(iter(models))
    reference = outputs[reference_kind]
    scores = {}
    for kind, outs in outputs.items():
        m = make_metric(metric, str(models[reference_kind]))
        for ref, out, feed in zip(reference, outs, samples, strict=True):
            m.update(ref, out, feed)
        scores[kind] = as_number(m.result(), f"metric {metric}")
    return {"metric": metric, "samples": len(samples), "scores": scores}
