"""The build config file (``build.toml``): sections, keys, defaults, validation and the commented example.

A config has one section per stage (``[model]``, ``[optimize]``, ``[quantize]``, ``[compile]``,
``[evaluate]``, ``[report]``); every key has a default, so a file needs only what differs. Unknown
sections and keys are refused with the closest known name. Relative paths are taken from the config
file's folder. A stage's cache key covers its own section (``section_digest``), so editing one section
re-runs that stage and what follows from its outputs, nothing before.
"""

from __future__ import annotations

__all__ = ["DEFAULTS", "EXAMPLE", "BuildConfig", "load_build_config", "config_from_dict", "section_digest"]

import copy
import dataclasses
import hashlib
import json
import logging
import tomllib
from pathlib import Path
from typing import Any

from zonnx.errors import OptionError, did_you_mean

logger = logging.getLogger(__name__)

#: Every section and key with its default ("" = not set). Tables under quantize are free-form.
DEFAULTS: dict[str, dict[str, Any]] = {
    "model": {"source": "digits_cnn", "input_shape": "", "input_names": [], "output_names": []},
    "optimize": {"opset": 17, "verify": True},
    "quantize": {
        "calib": "", "samples": 64, "method": "", "format": "", "per_channel": "", "activation_type": "",
        "weight_type": "", "accuracy_budget": "", "metric": "", "extra_options": {}, "nodes": {},
        "op_types": {}, "shards": 1, "measure_layers": 0,
    },
    "compile": {"target": "dpu-b4096", "min_nodes": 2},
    "evaluate": {"dataset": "", "samples": 0, "metric": "", "batch": 64, "backend": "local", "ray_address": ""},
    "report": {"html": True, "title": ""},
}  # fmt: skip
_FREE_TABLES = {("quantize", "extra_options"), ("quantize", "nodes"), ("quantize", "op_types")}
#: Keys that change how a stage runs, not what it computes (left out of its cache key).
_NOT_HASHED = {"evaluate": {"backend", "ray_address"}, "quantize": {"shards"}}

EXAMPLE = """\
# zonnx build config: `zonnx build build.toml` runs every stage below; a stage whose inputs and
# section did not change since the last run is skipped (its artifact in the output folder is reused).
out_dir = "out"                  # output folder (relative to this file)

[model]
source = "digits_cnn"            # zoo name (digits_cnn, resnet18, ppocr_rec, ...), model.onnx, model.pt,
                                 # model.py:Class (torch), model.keras / SavedModel folder, model.tflite
# input_shape = "input:1,1,8,8"  # fix dynamic dims while converting (NAME:d0,d1,...;NAME2:...); a torch
                                 # model's example input shape; or a table: {input = [1, 1, 8, 8]}
                                 # (text-lines samples are then resized/padded to the fixed width)
# input_names = ["input"]        # names of a torch model's exported inputs / outputs
# output_names = ["logits"]

[optimize]
opset = 17                       # opset the optimizer upgrades to
verify = true                    # compare outputs after every pass

[quantize]
# calib = "calib_images/"        # images folder, .npz/.npy, FILE.py:FUNC; default: the dataset's own
samples = 64                     # calibration samples taken from the dataset when calib is not set
# method = "minmse"              # override the target's recipe (minmax, entropy, percentile, mse, minmse...)
# per_channel = true
# activation_type = "int8"
# accuracy_budget = 1.0          # points of the evaluate metric: search mixed precision within it
# measure_layers = 8             # with a budget: layers whose sensitivity is measured one by one
                                 # (as parallel tasks on [evaluate] backend; on Ray the search's
                                 # trials too, one per CPU each round)
# shards = 4                     # calibration batches in 4 shards on [evaluate] backend (same numbers)
# [quantize.extra_options]       # any quantize_static extra_options key
# IncludeCLE = true
# [quantize.nodes."Conv_3"]      # per-layer overrides
# activation_type = "int16"

[compile]
target = "dpu-b4096"             # dpu-b4096, zhouyi-x2, bm1684x, or a target .toml
min_nodes = 2

[evaluate]
dataset = "digits"               # digits, zoo, text-lines, NPZ file or folder, images folder, FILE.py:NAME
samples = 450                    # 0: the whole dataset
metric = "accuracy"              # accuracy / accuracy-top5 (labels), top1, top5, cosine, sqnr, mean-iou,
                                 # box-f1 (detectors), char-accuracy, FILE.py:Class
batch = 64                       # samples per evaluation task
backend = "local"                # "ray": batches run as Ray tasks (a local Ray unless ray_address is set)
# ray_address = "ray://head:10001"

[report]
html = true                      # write report.html (self-contained, opens without network)
"""


@dataclasses.dataclass(frozen=True)
class BuildConfig:
    """A validated build config: ``sections`` (every key filled in), its folder, output folder and text."""

    sections: dict[str, dict[str, Any]]
    base_dir: Path
    out_dir: Path
    text: str = ""

    def get(self, section: str, key: str) -> Any:
        return self.sections[section][key]

    def path(self, section: str, key: str, keywords: tuple[str, ...] = ()) -> str:
        """A path value resolved against the config's folder; ``keywords`` and "" are kept as given.

        ``FILE.py:NAME`` resolves its file part."""
        value = str(self.sections[section][key])
        if not value or value in keywords:
            return value
        file, sep, name = value.partition(".py:")
        if sep:
            return str(self.base_dir / f"{file}.py") + ":" + name
        return str(self.base_dir / value)


def _check_keys(data: dict[str, Any], where: str) -> None:
    for section, body in data.items():
        if section == "out_dir":
            continue
        if section not in DEFAULTS:
            raise OptionError(
                f"{where}: unknown section [{section}].{did_you_mean(section, DEFAULTS)} "
                f"Known sections: {', '.join(DEFAULTS)}."
            )
        if not isinstance(body, dict):
            raise OptionError(f"{where}: {section} must be a [{section}] table, not a value.")
        for key in body:
            if key not in DEFAULTS[section]:
                raise OptionError(
                    f"{where}: [{section}] unknown key {key!r}.{did_you_mean(key, DEFAULTS[section])} "
                    f"Known keys: {', '.join(DEFAULTS[section])}."
                )
            if (section, key) in _FREE_TABLES and not isinstance(body[key], dict):
                raise OptionError(f"{where}: [{section}] {key} must be a table ([{section}.{key}]).")


def config_from_dict(
    data: dict[str, Any], base_dir: Path, *, where: str = "config", text: str = ""
) -> BuildConfig:
    """Validate ``data`` (a parsed config) and fill in every default."""
    _check_keys(data, where)
    sections = copy.deepcopy(DEFAULTS)
    for section, body in data.items():
        if section != "out_dir":
            sections[section].update(body)
    if not sections["evaluate"]["metric"]:
        sections["evaluate"]["metric"] = (
            "accuracy" if sections["evaluate"]["dataset"] == "digits" else "cosine"
        )
    if sections["evaluate"]["backend"] not in ("local", "ray"):
        raise OptionError(
            f"{where}: [evaluate] backend {sections['evaluate']['backend']!r}: use local or ray."
        )
    out = Path(str(data.get("out_dir", "out")))
    return BuildConfig(sections, base_dir, out if out.is_absolute() else (base_dir / out).resolve(), text)


def load_build_config(path: str | Path) -> BuildConfig:
    """Read and validate a build config file; OptionError names the file and the bad key."""
    p = Path(path)
    if not p.is_file():
        raise OptionError(f"{p}: config file not found (write an example with zonnx build --init {p}).")
    text = p.read_text()
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise OptionError(f"{p}: not valid TOML ({e}).") from None
    if "model" not in data:
        raise OptionError(f'{p}: no [model] section; add one with source = "model.onnx" (or a zoo name).')
    return config_from_dict(data, p.resolve().parent, where=str(p), text=text)


def section_digest(config: BuildConfig, section: str) -> str:
    """SHA-256 of a section's values (sorted JSON), without the keys that do not change results."""
    body = {k: v for k, v in config.sections[section].items() if k not in _NOT_HASHED.get(section, ())}
    return hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()
