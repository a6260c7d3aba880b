"""``zonnx build build.toml``: the whole deployment from one config file, with a stage cache and reports.

``load_build_config`` reads and checks the file (``config``), ``run_config`` runs the stages
(``stages``: source, optimize, quantize, compile, evaluate; then the report) and skips each one whose
inputs' content hashes and config section are unchanged (``cache``); evaluation runs in batches here
or as Ray tasks (``evaluate``; its ``RayExecutor`` also runs calibration shards and the budget
search's sensitivity tasks), on datasets and metrics that are plugins (``data``); ``report_html``
writes the self-contained HTML page.
"""

from zonnx.deploy.config import EXAMPLE, BuildConfig, config_from_dict, load_build_config
from zonnx.deploy.evaluate import RayExecutor
from zonnx.deploy.pipeline import STAGE_NAMES, BuildRun, run_config, summary_lines

__all__ = [
    "EXAMPLE",
    "BuildConfig",
    "BuildRun",
    "RayExecutor",
    "STAGE_NAMES",
    "config_from_dict",
    "load_build_config",
    "run_config",
    "summary_lines",
]
