"""Test-wide fixtures: every test runs in its own temporary working directory, so libraries that write
scratch files into the current directory (ORT's symbolic shape inference does) never touch the checkout."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def _isolated_cwd(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    cwd = tmp_path_factory.mktemp("cwd")
    monkeypatch.chdir(cwd)
    return cwd


def pytest_report_header(config: pytest.Config) -> str:
    from zonnx.hostcpu import host_int

    return f"zonnx host: {host_int().describe()}"


_CONFIG: list[pytest.Config] = []


def pytest_configure(config: pytest.Config) -> None:
    _CONFIG[:] = [config]


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Exactness tests print the instruction set and integer path they ran on (one line each)."""
    if report.when != "call" or "exactness" not in report.keywords or not _CONFIG:
        return
    from zonnx.hostcpu import host_int

    reporter = _CONFIG[0].pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        host = host_int()
        reporter.ensure_newline()
        reporter.write_line(
            f"{report.nodeid}: {report.outcome} on {host.isa} (host integer path {host.path})"
        )
