"""The compile cache cannot be steered outside its folder, trusts only folders of the current user, and
never serves an old program for a model edited in place (issue: reliability and security, items 13-15)."""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import stat
from pathlib import Path

import numpy as np
import onnx
import pytest

from tests.backend.test_session import _entry, _session, models  # noqa: F401  (module fixture)
from zonnx.backend.cache import ENTRY, default_cache_dir
from zonnx.errors import OptionError
from zonnx.zoo.digits import digits_data


def _tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


@pytest.mark.parametrize("key", ["../escape", "/tmp/abs_key", "a/b/../../../x", "..", ".", "a\\b", "k" * 201])
def test_cache_key_must_be_one_folder_name(models, tmp_path: Path, key: str) -> None:  # noqa: F811
    cache = tmp_path / "cache"
    before = _tree(tmp_path)
    with pytest.raises(OptionError, match="cache_key .*one folder name"):
        _session(models["fix"], "dpu-b4096", cache, cache_key=key)
    assert _tree(tmp_path) == before  # nothing written, inside or outside
    assert not Path("/tmp/abs_key").exists()


def test_shared_cache_folder_is_refused_and_its_entry_not_used(models, tmp_path: Path, caplog) -> None:  # noqa: F811
    x, _ = digits_data("test")
    cache = tmp_path / "cache"
    good = _session(models["fix"], "dpu-b4096", cache).run(None, {"input": x[:8]})[0]
    assert _session(models["fix"], "dpu-b4096", cache).from_cache
    assert stat.S_IMODE(cache.stat().st_mode) == 0o700  # created private, whatever the umask
    assert stat.S_IMODE(_entry(cache).stat().st_mode) == 0o700
    os.chmod(cache, 0o777)  # now anyone could have planted an entry with its sha256
    entry_bytes = (_entry(cache) / ENTRY).read_bytes()
    with caplog.at_level(logging.WARNING):
        sess = _session(models["fix"], "dpu-b4096", cache)
    assert not sess.from_cache
    assert "writable by others (mode 777)" in caplog.text and "not using it" in caplog.text
    assert np.array_equal(sess.run(None, {"input": x[:8]})[0], good)
    assert (_entry(cache) / ENTRY).read_bytes() == entry_bytes  # nothing written there either
    os.chmod(cache, 0o700)
    os.chmod(_entry(cache), 0o770)  # a group-writable entry folder is refused too
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        assert not _session(models["fix"], "dpu-b4096", cache).from_cache
    assert "writable by its group" in caplog.text


def test_folder_of_another_user_is_refused(models, tmp_path: Path, caplog) -> None:  # noqa: F811
    if os.geteuid() == 0:  # root (CI): make a folder that belongs to someone else
        foreign = tmp_path / "foreign"
        foreign.mkdir(mode=0o755)
        os.chown(foreign, 12345, 12345)
    else:  # anyone else: a system folder is another user's
        foreign = Path("/usr")
    with caplog.at_level(logging.WARNING):
        sess = _session(models["fix"], "dpu-b4096", foreign)
    assert not sess.from_cache and "not to you" in caplog.text and "not using it" in caplog.text
    if os.geteuid() == 0:
        assert not any(foreign.iterdir())


def test_model_edited_in_place_is_never_served_the_old_program(models, tmp_path: Path) -> None:  # noqa: F811
    """Same path, size, inode and mtime, one weight byte changed: the content hash sees it."""
    path = tmp_path / "m.onnx"
    shutil.copy(models["fix"], path)
    cache = tmp_path / "cache"
    for key in ({}, {"cache_key": "mine"}):
        data = bytearray(path.read_bytes())
        assert not _session(path, "dpu-b4096", cache, **key).from_cache
        assert _session(path, "dpu-b4096", cache, **key).from_cache
        model = onnx.load_from_string(bytes(data))
        weight = max(
            (t for t in model.graph.initializer if t.data_type == onnx.TensorProto.FLOAT and t.raw_data),
            key=lambda t: len(t.raw_data),
        )
        at = bytes(data).index(weight.raw_data)
        data[at] ^= 0x01  # lowest mantissa byte of one weight
        st = path.stat()
        with open(path, "r+b") as f:  # in place: same inode and size
            f.write(data)
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
        assert (path.stat().st_ino, path.stat().st_size, path.stat().st_mtime_ns) == (
            st.st_ino,
            st.st_size,
            st.st_mtime_ns,
        )
        sess = _session(path, "dpu-b4096", cache, **key)
        assert not sess.from_cache
        assert _session(path, "dpu-b4096", cache, **key).from_cache  # the new program, cached
        assert hashlib.sha256(path.read_bytes()).hexdigest() == hashlib.sha256(bytes(data)).hexdigest()


def test_default_cache_is_in_the_users_cache_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("ZONNX_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == tmp_path / "xdg" / "zonnx" / "npu"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert default_cache_dir() == Path.home() / ".cache" / "zonnx" / "npu"
    monkeypatch.setenv("ZONNX_CACHE_DIR", str(tmp_path / "mine"))
    assert default_cache_dir() == tmp_path / "mine"


def test_the_source_digest_hashed_on_a_thread_is_the_sha256_of_the_bytes() -> None:
    """A session hashes its source on a thread while it checks the native library: same key either way."""
    from zonnx.backend.cache import sha256_bytes, sha256_soon

    data = np.random.default_rng(0).integers(0, 256, 3_000_000, dtype=np.uint8).tobytes()
    wait = sha256_soon(data)
    assert wait() == sha256_bytes(data) == hashlib.sha256(data).hexdigest()
    assert wait() == sha256_bytes(data)  # waiting again gives the same digest
