"""Stage cache: a stage is skipped when the content hashes of its inputs and its config section are unchanged.

Key of a stage = SHA-256 over its name, its config section's digest and the SHA-256 of each input file's
bytes (a folder: every file's relative path and bytes, in sorted order; a name that is not a file, such as
a zoo model or a dataset keyword, by itself). Each run records ``{key, result, artifacts}`` per stage in
``OUT/.zonnx-build/STAGE.json``; a stage is fresh when its recorded key equals the new one and every
artifact it recorded still exists with the recorded hash.

A compiled model enters the evaluate stage's key through ``compiled_digest``: its bytes without the
metadata that records how it was made (the partition report with ``min_nodes``/``min_macs`` and the CPU
nodes' reasons, source paths, cache key). Those never change what the model computes (the placement of
every node is in the graph itself), so a compile edit that yields the same graph and programs does not
re-run the evaluation.
"""

from __future__ import annotations

__all__ = ["PROVENANCE_KEYS", "file_digest", "compiled_digest", "stage_key", "StageCache"]

import hashlib
import json
import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from zonnx.ir.io import write_bytes_atomic

logger = logging.getLogger(__name__)

_CHUNK = 1 << 20


def file_digest(path: str | Path) -> str:
    """SHA-256 of a file's bytes, of a folder's files (paths and bytes), or of the text of a non-path."""
    p = Path(path)
    h = hashlib.sha256()
    if p.is_file():
        with p.open("rb") as f:
            while chunk := f.read(_CHUNK):
                h.update(chunk)
        data = p.with_name(p.name + ".data")  # external weights live beside the model
        if p.suffix == ".onnx" and data.is_file():
            h.update(file_digest(data).encode())
    elif p.is_dir():
        for child in sorted(q for q in p.rglob("*") if q.is_file()):
            h.update(str(child.relative_to(p)).encode() + b"\0" + file_digest(child).encode())
    else:
        h.update(b"name:" + str(path).encode())
    return h.hexdigest()


#: Metadata keys of a compiled model that record its provenance, not its computation.
PROVENANCE_KEYS = ("zonnx.partition", "zonnx.source", "zonnx.float_source", "zonnx.cache_key")


def compiled_digest(path: str | Path) -> str:
    """SHA-256 of a compiled model without its provenance metadata (``PROVENANCE_KEYS``); a path that is
    not a file hashes as ``file_digest`` does."""
    import onnx

    p = Path(path)
    if not p.is_file():
        return file_digest(p)
    model = onnx.load(p, load_external_data=False)
    kept = [e for e in model.metadata_props if e.key not in PROVENANCE_KEYS]
    del model.metadata_props[:]
    model.metadata_props.extend(kept)
    h = hashlib.sha256(model.SerializeToString(deterministic=True))
    data = p.with_name(p.name + ".data")
    if data.is_file():
        h.update(file_digest(data).encode())
    return h.hexdigest()


def stage_key(stage: str, section_digests: Iterable[str], inputs: Iterable[str | Path]) -> str:
    """The cache key of ``stage`` from its sections' digests and its inputs' contents."""
    h = hashlib.sha256(stage.encode())
    for digest in section_digests:
        h.update(digest.encode())
    for item in inputs:
        h.update(file_digest(item).encode())
    return h.hexdigest()


class StageCache:
    """The per-stage records of one output folder."""

    def __init__(self, out_dir: Path) -> None:
        self.dir = out_dir / ".zonnx-build"

    def _file(self, stage: str) -> Path:
        return self.dir / f"{stage}.json"

    def load(self, stage: str) -> dict[str, Any] | None:
        try:
            return json.loads(self._file(stage).read_text())
        except (OSError, json.JSONDecodeError):
            return None

    def fresh(self, stage: str, key: str) -> dict[str, Any] | None:
        """The recorded result when ``key`` matches and every recorded artifact is intact, else None."""
        record = self.load(stage)
        if record is None or record.get("key") != key:
            return None
        for path, digest in record.get("artifacts", {}).items():
            if not Path(path).is_file() or file_digest(path) != digest:
                logger.info("stage %s: artifact %s changed or is missing; running it again", stage, path)
                return None
        return record["result"]

    def store(self, stage: str, key: str, result: dict[str, Any], artifacts: Iterable[Path]) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        record = {"key": key, "result": result, "artifacts": {str(p): file_digest(p) for p in artifacts}}
        write_bytes_atomic(self._file(stage), json.dumps(record, indent=1, default=str).encode())

    def forget(self, stage: str) -> None:
        self._file(stage).unlink(missing_ok=True)
