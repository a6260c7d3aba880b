"""The wheel installs custom_ops/, backend/, converters/ and tools/ under the zonnx namespace only."""

from __future__ import annotations

import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAPPED = {
    "zonnx": "zonnx",
    "custom_ops": "zonnx.custom_ops",
    "backend": "zonnx.backend",
    "converters": "zonnx.converters",
    "tools": "zonnx.tools",
}


def _declared_packages() -> set[str]:
    return set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])


def test_every_package_folder_is_declared() -> None:
    found = set()
    for folder, package in MAPPED.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder)
            found.add(".".join([package, *rel.parts]))
    missing = found - _declared_packages()
    assert not missing, f"add these to [tool.setuptools] packages in pyproject.toml: {sorted(missing)}"


def test_wheel_has_no_bare_top_level_packages(tmp_path: Path) -> None:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
    )
    wheel = next(tmp_path.glob("zonnx-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names if not n.split("/")[0].endswith((".dist-info", ".data"))}
    assert top == {"zonnx"}
    for package in ("custom_ops", "backend", "converters", "tools"):
        assert f"zonnx/{package}/__init__.py" in names
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert "zonnx = zonnx.tools.main:main" in zipfile.ZipFile(wheel).read(entry_points).decode()
