"""``InferenceSession``: onnxruntime's session API with the ``ZonnxNPUExecutionProvider`` in front of the CPU.

Creation: a model that is not compiled yet is partitioned and compiled for the target
(``compile_model``), through the cache ``cache_dir/cache_key`` (``zonnx.backend.cache``); a compiled
model is used as is. Execution: every ``NpuSubgraph`` node is replaced by its ORT-native integer ops
(``lower_program``, in ``compiled_store.lowered_model``) and ONE ``onnxruntime.InferenceSession`` runs the
whole model, CPU nodes included; a cache hit opens the entry's stored executable, whose weights ORT maps
from its data file.
``executor="reference"`` instead runs NPU programs with the numpy reference executor between ORT
sessions over the CPU parts (``zonnx.backend.runtime.staged``-like stages, for debugging and for checking
the lowering bit for bit). The session logs and keeps (``partition``) which nodes run where and why.

Provider options (ORT passes strings; VOE spellings ``cacheDir``, ``cacheKey``, ``configFile`` accepted):
``target`` ("dpu-b4096"), ``cache_dir`` ($ZONNX_CACHE_DIR, else $XDG_CACHE_HOME/zonnx/npu or
~/.cache/zonnx/npu; refused when another user owns it or others can write it), ``cache_key`` (one folder name)
(hash of model bytes + target + zonnx version), ``config_file`` (a JSON object of these options; keys
given directly win), ``executor`` ("auto": ORT-native when the lowering is available, else the reference),
``fallback`` ("none"; "cpu" runs an unquantized model on the CPU with a warning), ``min_nodes`` (2),
``min_macs`` (1000000), ``enable_cache`` ("1"; "0", like ``XLNX_ENABLE_CACHE=0``, recompiles and overwrites
the entry), ``strict`` ("0"; "1" raises ``LowCoverageError`` where a session would warn that the NPU gets no
node or under half the MACs), ``input_shapes`` (fixed input dims), ``ort_log_level`` ("3"), ``kernels`` ("auto": the native kernel
library when it is built and usable, else the pure-ONNX lowering; "native" | "onnx" force one;
``$ZONNX_NPU_KERNELS`` decides under "auto"; ``zonnx.backend.native``).

Noise and silence. ORT's own warnings are not printed: without ``sess_options`` (or with
``ort_log_level`` given) the session's ORT log severity is ``ort_log_level`` (3, errors only). Low NPU
coverage is always said (``zonnx.backend.partition.coverage``), for fresh compiles, cache hits and
compiled models alike. A compiled model keeps the target it was compiled for: opened with an explicit
other ``target`` it is refused (compile the quantized model again); without one, the log says which
target it runs as.
"""

from __future__ import annotations

__all__ = [
    "InferenceSession",
    "NPU_PROVIDER",
    "InvalidInputError",
    "NpuOptions",
    "parse_provider_options",
    "summary_line",
]

import json
import logging
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

from zonnx.backend.cache import (
    EXECUTABLE,
    ModelCache,
    default_cache_dir,
    default_key,
    sha256_soon,
    target_digest,
)
from zonnx.backend.compile_api import compile_model, not_quantized_message
from zonnx.backend.compiled import (
    CompiledModelError,
    compiled_info,
    is_compiled,
    partition_from_dict,
)
from zonnx.backend.compiled_store import EXECUTABLE_KEY, lowered_model, lowering_id, stored_executable
from zonnx.backend.native import NativeStatus, choose_kernels, register_library
from zonnx.backend.partition import Partition, check_coverage
from zonnx.backend.partition.report import summary_line
from zonnx.backend.provider_options import (
    CPU_PROVIDER,
    NPU_PROVIDER,
    NpuOptions,
    parse_provider_options,
    provider_table,
)
from zonnx.backend.session_io import InvalidInputError, check_feeds, node_args
from zonnx.backend.session_source import parse_source, read_source
from zonnx.backend.staged import StagedExecutor, open_executable, ort_cpu_session
from zonnx.backend.targets import load_target
from zonnx.errors import ModelLoadError, OptionError, UnsupportedModelError, ZonnxError
from zonnx.ir.io import external_data_locations, load_proto

logger = logging.getLogger(__name__)


def _lowering_id(native: NativeStatus | None = None) -> str:
    """Keys cached lowered models (``compiled_store.lowering_id``)."""
    return lowering_id(native)


def _quiet(sess_options: ort.SessionOptions | None, options: NpuOptions | None) -> ort.SessionOptions:
    """ORT's session options with its log severity at ``ort_log_level`` unless the user set their own."""
    level = options.ort_log_level if options is not None else 3
    if sess_options is None:
        sess_options = ort.SessionOptions()
    elif options is None or "ort_log_level" not in options.explicit:
        return sess_options
    sess_options.log_severity_level = level
    return sess_options


class InferenceSession:
    """onnxruntime.InferenceSession's API, with ``ZonnxNPUExecutionProvider`` (see the module docstring).

    Attributes besides ORT's methods: ``partition`` (None when nothing is compiled), ``compiled_model``
    (the compiled ModelProto or None), ``from_cache`` (the compiled model came from the cache),
    ``executor`` ("ort", "reference" or "cpu"), ``create_seconds``.
    """

    def __init__(
        self,
        path_or_bytes: str | os.PathLike[str] | bytes | onnx.ModelProto,
        sess_options: ort.SessionOptions | None = None,
        providers: Sequence[Any] | None = None,
        provider_options: Sequence[Mapping[str, Any]] | None = None,
        **kwargs: Any,
    ) -> None:
        start = time.perf_counter()
        chosen = provider_table(providers, provider_options)
        self._cpu_options = chosen.get(CPU_PROVIDER, {})
        self.options = parse_provider_options(chosen.get(NPU_PROVIDER)) if NPU_PROVIDER in chosen else None
        self._sess_options = _quiet(sess_options, self.options)
        self.partition: Partition | None = None
        self.from_cache = False
        self.kernels: NativeStatus | None = None  # the native kernel library in use (ORT executor), if any
        self._cache: ModelCache | None = None
        self._compiled_path = ""  # a compiled model opened from its stored executable (weights on disk)
        self.executable = "lowered"  # "stored": the executable saved with the compiled model (compiled_store)
        self._compiled: onnx.ModelProto | None = None
        # The source is always read and hashed, never trusted by path and mtime: a model edited in
        # place must not be served an old program (backend/cache.py).
        data, where = read_source(path_or_bytes)
        compiled = (
            parse_source(data, where)
            if any(k in data[-65536:] for k in (b"NpuSubgraph", b"zonnx.compiled", EXECUTABLE_KEY.encode()))
            else None
        )
        if compiled is not None and not is_compiled(compiled):
            compiled = None
        self._where = where
        if self.options is None:
            if compiled is not None:
                raise OptionError(
                    f"{where}: is a compiled NPU model; add {NPU_PROVIDER!r} to providers to run it."
                )
            self._run_on_cpu(data)
        else:
            self._create_npu(data, where, compiled)
        self.create_seconds = time.perf_counter() - start

    # -- creation -----------------------------------------------------------------------------------
    def _run_on_cpu(self, data: bytes) -> None:
        self.executor = "cpu"
        self._providers = [CPU_PROVIDER]
        self._ort = ort_cpu_session(data, self._sess_options)
        self._stages = None

    def _create_npu(self, data: bytes, where: str, compiled: onnx.ModelProto | None) -> None:
        opts = self.options
        assert opts is not None
        mode = opts.executor
        if mode == "auto":
            mode = "ort"
        self.executor = mode
        source_sha = sha256_soon(data) if compiled is None else None  # the cache key, hashed meanwhile
        self.kernels = choose_kernels(opts.kernels) if mode == "ort" else None
        exe_id = _lowering_id(self.kernels) if mode == "ort" else ""
        if compiled is not None:
            target_name = compiled_info(compiled).get("target", "")
            if "target" in opts.explicit and load_target(opts.target).name != target_name:
                raise OptionError(
                    f"{where}: was compiled for {target_name!r}, not {opts.target!r}; compile the "
                    f"quantized model again with --target {opts.target}, or drop the target option to run "
                    f"it on {target_name}."
                )
            if target_name != load_target(opts.target).name:
                logger.info(
                    "%s: compiled for %s; it runs on %s (no target option given)",
                    where,
                    target_name,
                    target_name,
                )
            if not self._open_stored(compiled, mode, where):
                if external_data_locations(compiled):  # the programs are in the data file: read them
                    compiled = load_proto(where)
                self._build(compiled, False, mode, where)
            self._check_coverage(where)
            return
        target = load_target(opts.target)
        assert source_sha is not None
        sha = source_sha()
        key = opts.cache_key or default_key(sha, target)
        expect = {"source_sha256": sha, "target": target.name, "target_sha256": target_digest(target)}
        meta = {**expect, "min_nodes": opts.min_nodes, "min_macs": opts.min_macs, "shapes": opts.input_shapes}
        cache = ModelCache(opts.cache_dir or default_cache_dir(), key, meta)
        enabled = opts.enable_cache and os.environ.get("XLNX_ENABLE_CACHE", "1") != "0"
        hit = cache.load(exe_id) if enabled else None
        self._cache = cache
        if hit is not None:
            try:
                self.from_cache = True
                lowered = self._build(hit[0], hit[1] is not None, mode, where)
                if lowered is not None:
                    cache.store(hit[0], lowered, exe_id)  # the entry gains this lowering
                self._check_coverage(where)
                return
            except CompiledModelError as e:
                logger.warning("cache entry %s: %s; recompiling", cache.folder, e)
                self.from_cache = False
        parsed = parse_source(data, where)
        if is_compiled(parsed):
            self._build(parsed, False, mode, where)
            self._check_coverage(where)
            return
        try:
            compiled = compile_model(
                parsed,
                target,
                min_nodes=opts.min_nodes,
                min_macs=opts.min_macs,
                input_shapes=opts.shapes() or None,
                cache_key=key,
                strict=opts.strict,
            ).model
        except UnsupportedModelError as e:
            if "not quantized" not in str(e):
                raise
            if opts.fallback != "cpu":
                raise UnsupportedModelError(not_quantized_message(where)) from None
            logger.warning("%s: not quantized; every node runs on the CPU (fallback='cpu')", where)
            self._run_on_cpu(data)
            return
        lowered = self._build(compiled, False, mode, where)
        cache.store(compiled, lowered, exe_id)

    def _open_stored(self, compiled: onnx.ModelProto, mode: str, where: str) -> bool:
        """Open the executable stored beside a compiled model saved with external data (``compiled_store``):
        ORT reads its light graph and maps its weights from the data file. False when there is none for
        this host (the caller lowers the programs)."""
        if mode != "ort" or not external_data_locations(compiled):
            return False
        native = self.kernels if self.kernels is not None and self.kernels.available else None
        folder = Path(where).parent
        exe = stored_executable(compiled, folder, native)
        if exe is None:
            return False
        so = register_library(self._sess_options, self.kernels) if native else self._sess_options
        so = so if so is not None else ort.SessionOptions()
        so.add_session_config_entry("session.model_external_initializers_file_folder_path", str(folder))
        try:
            self._ort = ort.InferenceSession(exe, so, providers=[CPU_PROVIDER])
        except Exception as e:  # ORT's own exception types: a short or altered data file
            raise ModelLoadError(
                f"{where}: ONNX Runtime cannot open its stored executable ({str(e).strip()[:300]}); copy the "
                "complete data file beside the model, or compile it again."
            ) from None
        self._stages, self._compiled_path, self.executable = None, where, "stored"
        text = compiled_info(compiled).get("partition")
        self.partition = partition_from_dict(json.loads(text)) if text else None
        self._providers = [NPU_PROVIDER, CPU_PROVIDER]
        if self.partition is not None:
            logger.info("%s: %s", where, summary_line(self.partition))
        return True

    def _build(
        self, compiled: onnx.ModelProto, cached: bool, mode: str, where: str
    ) -> onnx.ModelProto | None:
        """Set up the executor for a compiled model; ``cached``: the cache entry holds its executable (ORT mode).
        Returns the executable lowered now (for the cache), else None."""
        if compiled is not None:
            text = compiled_info(compiled).get("partition")
        else:
            text = self._cache.partition_json() if self._cache is not None else None
        partition = partition_from_dict(json.loads(text)) if text else None
        lowered = None
        if mode == "ort":
            try:  # KernelError (no exact lowering) or ORT refusing the lowered model
                native = self.kernels is not None and self.kernels.available
                so = register_library(self._sess_options, self.kernels) if native else self._sess_options
                if cached and self._cache is not None:  # ORT maps the weights from the entry's data file
                    self._ort = open_executable(str(self._cache.folder / EXECUTABLE), so)
                else:
                    lowered = lowered_model(compiled, self.kernels if native else None)
                    self._ort = open_executable(lowered.SerializeToString(), so)
                self._stages = None
            except ZonnxError as e:
                if self.options is None or self.options.executor != "auto":
                    raise
                logger.warning(
                    "%s: %s The NPU subgraphs run in the numpy reference executor instead (exact, slow).",
                    where,
                    e,
                )
                mode, lowered = "reference", None
                self.executor = mode
        if mode != "ort":
            if compiled is None and self._cache is not None:  # a cached executable ORT refused
                compiled = self._cache.load_compiled()
            if compiled is None:
                raise CompiledModelError(
                    f"{where}: the cache entry has no readable compiled model; recompile."
                )
            self._stages = StagedExecutor(compiled, self._sess_options)
            self._ort = next((r for k, r, _, _ in self._stages.stages if k == "cpu"), None)
        self._compiled, self.partition = compiled, partition
        self._providers = [NPU_PROVIDER, CPU_PROVIDER]
        if partition is not None:
            logger.info("%s: %s", where, summary_line(partition))
        return lowered

    @property
    def compiled_model(self) -> onnx.ModelProto | None:
        """The compiled model (read from the cache on first use when the session did not need it)."""
        if self._compiled is None and self.from_cache and self._cache is not None:
            self._compiled = self._cache.load_compiled()
        if self._compiled is None and self._compiled_path:  # opened from its stored executable
            self._compiled = load_proto(self._compiled_path)
        return self._compiled

    def _check_coverage(self, where: str) -> None:
        """Say (or, strict, refuse) low NPU coverage of a partition that was not compiled just now."""
        if self.partition is not None and self.options is not None:
            check_coverage(self.partition.advice, where, strict=self.options.strict)

    # -- ORT API ------------------------------------------------------------------------------------
    def get_inputs(self) -> list[Any]:
        if self._stages is not None:
            return node_args(self.compiled_model.graph.input)
        return self._ort.get_inputs()

    def get_outputs(self) -> list[Any]:
        if self._stages is not None:
            return node_args(self.compiled_model.graph.output)
        return self._ort.get_outputs()

    def get_overridable_initializers(self) -> list[Any]:
        return [] if self._stages is not None else self._ort.get_overridable_initializers()

    def get_providers(self) -> list[str]:
        return list(self._providers)

    def get_provider_options(self) -> dict[str, dict[str, str]]:
        out = {}
        if NPU_PROVIDER in self._providers and self.options is not None:
            out[NPU_PROVIDER] = self.options.as_strings()
        out[CPU_PROVIDER] = {k: str(v) for k, v in self._cpu_options.items()}
        return out

    def get_session_options(self) -> ort.SessionOptions:
        return self._sess_options or ort.SessionOptions()

    def get_modelmeta(self) -> Any:
        return self._ort.get_modelmeta() if self._ort is not None else None

    def end_profiling(self) -> str:
        return self._ort.end_profiling() if self._stages is None and self._ort is not None else ""

    def run(
        self, output_names: Sequence[str] | None, input_feed: Mapping[str, Any], run_options: Any = None
    ) -> list[np.ndarray]:
        """Run the model; ``output_names`` None means every output. Errors name the input."""
        feeds = check_feeds(self.get_inputs(), input_feed)
        names = list(output_names) if output_names else [o.name for o in self.get_outputs()]
        known = {o.name for o in self.get_outputs()}
        for n in names:
            if n not in known:
                raise InvalidInputError(
                    f"invalid output name {n!r}; the model's outputs: {', '.join(known)}."
                )
        if self._stages is not None:
            return self._stages.run(names, feeds)
        try:
            return self._ort.run(names, feeds, run_options)
        except Exception as e:  # ORT's own exception types
            raise ZonnxError(f"{self._where}: ONNX Runtime failed to run ({str(e).strip()[:400]}).") from None

    def run_with_ort_values(
        self,
        output_names: Sequence[str] | None,
        input_dict_ort_values: Mapping[str, Any],
        run_options: Any = None,
    ) -> list[Any]:
        """ORT's OrtValue interface (the reference executor converts through numpy)."""
        if self._stages is None:
            return self._ort.run_with_ort_values(output_names, input_dict_ort_values, run_options)
        feeds = {k: v.numpy() for k, v in input_dict_ort_values.items()}
        return [ort.OrtValue.ortvalue_from_numpy(a) for a in self.run(output_names, feeds, run_options)]
