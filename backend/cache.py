"""The compiled-model cache: ``<cache_dir>/<cache_key>/`` holds a compiled model and what it was made from.

An entry is a folder with ``compiled.onnx`` (the compiled model, see ``zonnx.backend.compiled``),
optionally ``executable.onnx`` with ``executable.data`` (its ORT-native lowering, so a warm session skips
lowering too: the light graph, and its weights at page-aligned offsets, which ORT maps from the file instead
of parsing them out of the protobuf) and ``entry.json``: the key, the sha256 of the source model bytes, the
target (name and sha256 of its file), the zonnx version, the program format version and the sha256 of each
stored file.

Rules. The default key is a hash of the source model bytes, the target file and the zonnx version (as
VOE's default key is the model's MD5). An entry is used only when every recorded field matches the
current request and every file matches its sha256; otherwise it is *stale or corrupt*: a warning names
the reason, the caller recompiles and the entry is overwritten. Writes go to a temporary file then
``os.replace``, so a reader never sees half a file. A folder that cannot be created or written turns
caching off for the session with a warning.

Trust (pip's and ccache's rules). The default folder is ``$ZONNX_CACHE_DIR``, else
``$XDG_CACHE_HOME/zonnx/npu``, else ``~/.cache/zonnx/npu``: the user's own cache home, not a shared
``/tmp`` (VOE's ``/tmp/<user>/vaip/.cache`` can be created beforehand by another user). A cache key must
be one path component (no separators, not ``.``/``..``), so an entry never lands outside the cache
folder. The cache folder and the entry folder must belong to the current user and must not be writable
by group or others; otherwise the cache is refused for the session with one warning line (nothing is read
from it or written to it), because whoever can write there could plant a program together with its
sha256. zonnx creates its folders with mode 0700. The source model is always identified by the sha256
of its bytes, never by path and modification time, so a model edited in place is never served an old
program.
"""

from __future__ import annotations

__all__ = [
    "EXECUTABLE",
    "EXECUTABLE_DATA",
    "ModelCache",
    "default_cache_dir",
    "default_key",
    "sha256_bytes",
    "sha256_soon",
    "target_digest",
    "check_cache_key",
    "untrusted_reason",
]

import hashlib
import json
import logging
import os
import stat
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import onnx

from zonnx import __version__
from zonnx.backend.compiled_store import split_executable
from zonnx.backend.compiler.program import FORMAT_VERSION
from zonnx.backend.targets import Target
from zonnx.errors import OptionError
from zonnx.ir.io import write_bytes_atomic

logger = logging.getLogger(__name__)

ENTRY = "entry.json"
COMPILED = "compiled.onnx"
EXECUTABLE = "executable.onnx"
EXECUTABLE_DATA = "executable.data"


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_soon(data: bytes) -> Callable[[], str]:
    """Start hashing ``data`` on a thread and return the function that waits for its hex digest.

    hashlib releases the GIL while it hashes a large buffer, so a session's other setup (the native
    library's check, the target file) runs meanwhile on another core; the digest is the same as
    ``sha256_bytes(data)``."""
    digest: list[str] = []
    worker = threading.Thread(target=lambda: digest.append(sha256_bytes(data)), daemon=True)
    worker.start()

    def wait() -> str:
        worker.join()
        return digest[0] if digest else sha256_bytes(data)  # the thread failed (MemoryError): hash here

    return wait


def sha256_file(path: Path) -> str:
    """sha256 of a file's bytes, read in chunks (no copy of the whole file)."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def target_digest(target: Target) -> str:
    """sha256 of the target's file (an edited target file invalidates its entries)."""
    if target.path is not None and Path(target.path).is_file():
        return sha256_bytes(Path(target.path).read_bytes())
    return sha256_bytes(repr(target).encode())


def default_key(model_sha256: str, target: Target) -> str:
    """Hash of model bytes + target file + zonnx version (32 hex digits)."""
    text = f"{model_sha256}|{target.name}|{target_digest(target)}|{__version__}|{FORMAT_VERSION}"
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def default_cache_dir() -> Path:
    """``$ZONNX_CACHE_DIR``, else ``$XDG_CACHE_HOME/zonnx/npu``, else ``~/.cache/zonnx/npu``."""
    env = os.environ.get("ZONNX_CACHE_DIR")
    if env:
        return Path(env)
    home = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(home) / "zonnx" / "npu"


def check_cache_key(key: str) -> str:
    """``key`` when it is one folder name; else an OptionError naming it (an entry stays inside cache_dir)."""
    seps = {"/", "\\", "\0"} | ({os.altsep} if os.altsep else set())
    if (
        not key
        or key in (".", "..")
        or any(c in key for c in seps)
        or len(key.encode("utf-8", "replace")) > 200
    ):
        raise OptionError(
            f"cache_key {key!r}: must be one folder name (no '/', '\\', '.' or '..', at most 200 bytes); "
            "the entry is written to cache_dir/cache_key."
        )
    return key


def untrusted_reason(folder: Path) -> str | None:
    """Why an existing cache folder may not be trusted (another user's, or writable by group or others),
    or None. A folder that does not exist yet is trusted: zonnx creates it with mode 0700."""
    try:
        st = folder.stat()
    except (FileNotFoundError, NotADirectoryError):  # not there yet (or cannot be): nothing to trust
        return None
    except OSError as e:
        return f"cannot be inspected ({e.strerror or e})"
    if not stat.S_ISDIR(st.st_mode):
        return "is not a folder"
    if hasattr(os, "geteuid") and st.st_uid != os.geteuid():
        return f"belongs to uid {st.st_uid}, not to you (uid {os.geteuid()})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        who = "others" if st.st_mode & stat.S_IWOTH else "its group"
        return f"is writable by {who} (mode {st.st_mode & 0o777:o})"
    return None


def _make_private(folder: Path) -> None:
    """Create ``folder`` and its missing parents with mode 0700, whatever the umask."""
    missing = []
    for p in [folder, *folder.parents]:
        if p.exists():
            break
        missing.append(p)
    for p in reversed(missing):
        p.mkdir(mode=0o700, exist_ok=True)
        os.chmod(p, 0o700)


class ModelCache:
    """One cache entry: ``cache_dir/key``; ``load`` checks it, ``store`` writes it (never raises on I/O)."""

    def __init__(self, cache_dir: str | os.PathLike[str], key: str, expect: dict[str, Any]) -> None:
        self.root = Path(cache_dir).expanduser()
        self.folder = self.root / check_cache_key(key)
        self.key = key
        self.expect = {"key": key, "zonnx_version": __version__, "program_version": FORMAT_VERSION, **expect}
        self.enabled = True
        self.last_miss = ""
        for folder in (self.root, self.folder):
            reason = untrusted_reason(folder)
            if reason is not None:
                self.enabled = False
                self.last_miss = f"untrusted: {folder} {reason}"
                logger.warning(
                    "cache folder %s %s: not using it (anyone who can write there could plant a program); "
                    "give cache_dir a folder of your own, or run chmod go-w on it",
                    folder,
                    reason,
                )
                break

    def _miss(self, reason: str, warn: bool) -> None:
        self.last_miss = reason
        (logger.warning if warn else logger.info)("cache entry %s: %s", self.folder, reason)

    def load(self, executable_id: str = "") -> tuple[onnx.ModelProto | None, bytes | None] | None:
        """(compiled model or None, executable bytes or None) when the entry is valid, else None.

        With a valid executable the compiled model is not read (``load_compiled`` reads it on demand).

        The executable is returned only when it was stored with the same ``executable_id`` (the
        lowering's version): another lowering reuses the compiled model and lowers it again.
        """
        if not self.enabled:
            return None
        entry_path = self.folder / ENTRY
        if not entry_path.is_file():
            self._miss("no entry; compiling", warn=False)
            return None
        try:
            entry = json.loads(entry_path.read_text(encoding="utf-8"))
            files = entry["files"]
            for k, v in self.expect.items():
                if entry.get(k) != v:
                    self._miss(f"stale ({k} is {entry.get(k)!r}, expected {v!r}); recompiling", warn=True)
                    return None
            exe = None
            same = executable_id and entry.get("executable_id") == executable_id
            if same and {EXECUTABLE, EXECUTABLE_DATA} <= files.keys():
                exe = self._read_executable(files)
            model = None
            if exe is None:  # the compiled model is needed now; else read on demand (load_compiled)
                model = self.load_compiled()
                if model is None:
                    return None
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            self._miss(f"unreadable ({type(e).__name__}: {e}); recompiling", warn=True)
            return None
        except Exception as e:  # protobuf DecodeError
            self._miss(f"corrupted ({type(e).__name__}); recompiling", warn=True)
            return None
        logger.info("cache entry %s: hit", self.folder)
        return model, exe

    def _read_executable(self, files: dict[str, str]) -> bytes | None:
        """The stored executable's light graph when it and its data file match their sha256, else None
        (with a warning: the caller lowers the compiled model again)."""
        light_path, data_path = self.folder / EXECUTABLE, self.folder / EXECUTABLE_DATA
        if not (light_path.is_file() and data_path.is_file()):
            return None
        light = light_path.read_bytes()
        if sha256_bytes(light) != files[EXECUTABLE]:
            bad = EXECUTABLE
        elif sha256_file(data_path) != files[EXECUTABLE_DATA]:
            bad = EXECUTABLE_DATA
        else:
            return light
        logger.warning("cache entry %s: %s is corrupted; lowering again", self.folder, bad)
        return None

    def load_compiled(self) -> onnx.ModelProto | None:
        """The entry's compiled model after its sha256 check, or None (with the reason logged)."""
        try:
            entry = json.loads((self.folder / ENTRY).read_text(encoding="utf-8"))
            blob = (self.folder / COMPILED).read_bytes()
            if sha256_bytes(blob) != entry["files"][COMPILED]:
                self._miss(f"{COMPILED} does not match its sha256 (corrupted); recompiling", warn=True)
                return None
            model = onnx.ModelProto()
            model.ParseFromString(blob)
            return model
        except (OSError, ValueError, KeyError, TypeError) as e:
            self._miss(f"unreadable ({type(e).__name__}: {e}); recompiling", warn=True)
        except Exception as e:  # protobuf DecodeError
            self._miss(f"corrupted ({type(e).__name__}); recompiling", warn=True)
        return None

    def partition_json(self) -> str | None:
        try:
            return json.loads((self.folder / ENTRY).read_text(encoding="utf-8")).get("partition")
        except (OSError, ValueError):
            return None

    def store(
        self,
        compiled: onnx.ModelProto,
        executable: onnx.ModelProto | None = None,
        executable_id: str = "",
    ) -> bool:
        """Write the entry (the executable as its light graph and data file, ``split_executable``); on any OS
        error warn, turn caching off and return False."""
        if not self.enabled:
            return False
        try:
            _make_private(self.folder)
            blob = compiled.SerializeToString()
            files = {COMPILED: sha256_bytes(blob)}
            (self.folder / ENTRY).unlink(missing_ok=True)  # no valid entry while files change
            write_bytes_atomic(self.folder / COMPILED, blob)
            if executable is not None:
                light, data = split_executable(executable, EXECUTABLE_DATA)
                write_bytes_atomic(self.folder / EXECUTABLE_DATA, data)
                write_bytes_atomic(self.folder / EXECUTABLE, light)
                files[EXECUTABLE], files[EXECUTABLE_DATA] = sha256_bytes(light), sha256_bytes(data)
            entry = {**self.expect, "files": files, "executable_id": executable_id if executable else ""}
            info = {p.key: p.value for p in compiled.metadata_props}
            entry["partition"] = info.get("zonnx.partition")
            write_bytes_atomic(self.folder / ENTRY, json.dumps(entry, indent=1, sort_keys=True).encode())
        except OSError as e:
            self.enabled = False
            logger.warning(
                "cache folder %s is not writable (%s); running without caching (set cache_dir to a "
                "writable folder to cache the compiled model).",
                self.folder.parent,
                e.strerror or e,
            )
            return False
        logger.info("cache entry %s: stored", self.folder)
        return True
