"""Load torch sources: a ``model.py:Name`` entry built with its constructor arguments, a TorchScript
``.pt`` or a ``torch.export`` ``.pt2`` file. Every failure is one line naming the file and what to do."""

from __future__ import annotations

__all__ = ["load_python_entry", "load_torch_file", "split_entry"]

import importlib.util
import inspect
import json
import logging
import sys
import zipfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from zonnx.converters.common import ConversionError
from zonnx.errors import ModelLoadError, OptionError, did_you_mean, first_line


def split_entry(spec: str) -> tuple[Path, str | None]:
    """``path.py:Name`` -> (path, Name); other paths -> (path, None)."""
    head, sep, tail = spec.rpartition(":")
    if sep and head.endswith(".py") and tail.isidentifier():
        return Path(head), tail
    return Path(spec), None


def load_python_entry(spec: str, init_args: Mapping[str, Any] | None = None) -> Any:
    """Import ``file.py`` and build ``Name`` (a class or factory) with ``init_args``; without ``:Name`` the
    file's only nn.Module subclass is used. Every failure is one line naming the file and what to do."""
    import torch

    path, name = split_entry(spec)
    mod_name = f"zonnx_user_model_{abs(hash(path.resolve()))}"
    loader_spec = importlib.util.spec_from_file_location(mod_name, path)
    if loader_spec is None or loader_spec.loader is None:
        raise ModelLoadError(f"{path}: cannot be imported as a Python file.")
    module = importlib.util.module_from_spec(loader_spec)
    sys.path.insert(0, str(path.resolve().parent))
    try:
        loader_spec.loader.exec_module(module)
    except SyntaxError as e:
        raise ModelLoadError(f"{path}:{e.lineno}: syntax error ({e.msg}); fix the file.") from None
    except Exception as e:
        raise ModelLoadError(f"{path}: importing it failed ({type(e).__name__}: {first_line(e)}).") from None
    finally:
        sys.path.remove(str(path.resolve().parent))
    defined = {k: v for k, v in vars(module).items() if getattr(v, "__module__", None) == mod_name}
    if name is None:
        classes = [k for k, v in defined.items() if inspect.isclass(v) and issubclass(v, torch.nn.Module)]
        if len(classes) != 1:
            raise OptionError(
                f"{path}: name the model to build as {path}:Name (the file defines "
                f"{', '.join(classes) or 'no nn.Module class'})."
            )
        name = classes[0]
    factory = getattr(module, name, None)
    if not callable(factory):
        raise OptionError(
            f"{path} has no class or function {name!r}.{did_you_mean(name, defined)} "
            f"It defines: {', '.join(sorted(defined)) or 'nothing callable'}."
        )
    _check_init_args(path, name, factory, dict(init_args or {}))
    try:
        model = factory(**dict(init_args or {}))
    except Exception as e:
        raise ConversionError(f"{path}:{name}(...) failed: {type(e).__name__}: {first_line(e)}.") from None
    if not isinstance(model, torch.nn.Module):
        raise ConversionError(f"{path}:{name} returned a {type(model).__name__}, not a torch nn.Module.")
    return model


def _check_init_args(path: Path, name: str, factory: Callable, given: dict[str, Any]) -> None:
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return
    plain = [p for p in params.values() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    missing = [p.name for p in plain if p.default is p.empty and p.name not in given]
    if missing:
        example = json.dumps({m: "..." for m in missing})
        raise OptionError(
            f"{path}:{name} needs constructor argument(s) {', '.join(missing)}; pass them as JSON: "
            f"--init-args '{example}' (from Python: build the module yourself)."
        )
    if not any(p.kind == p.VAR_KEYWORD for p in params.values()):
        for key in given:
            if key not in params:
                raise OptionError(
                    f"--init-args: {path}:{name} takes no argument {key!r}."
                    f"{did_you_mean(key, params)} It takes: {', '.join(params) or 'nothing'}."
                )


def _is_pickle_not_script(path: Path) -> bool:
    """A torch.save zip (state_dict or pickled module) has data.pkl but no TorchScript code/ folder."""
    try:
        with zipfile.ZipFile(path) as z:
            names = z.namelist()
    except (OSError, zipfile.BadZipFile):
        return False
    return any(n.endswith("data.pkl") for n in names) and not any("/code/" in n for n in names)


def _program_dynamic_axes(program: Any) -> dict[str, dict[int, str]]:
    """Dims a torch.export program keeps symbolic, by user input: axis 0 is ``batch``, others
    ``<input>_d<axis>``; dims sharing one symbol share the first name given to it."""
    names: dict[str, str] = {}
    axes: dict[str, dict[int, str]] = {}
    user = set(program.graph_signature.user_inputs)
    for node in program.graph.nodes:
        val = node.meta.get("val") if node.op == "placeholder" and node.name in user else None
        for axis, dim in enumerate(getattr(val, "shape", ())):
            if not isinstance(dim, int):
                key = str(dim)
                names.setdefault(key, "batch" if axis == 0 else f"{node.name}_d{axis}")
                axes.setdefault(node.name, {})[axis] = names[key]
    return axes


def load_torch_file(path: Path) -> tuple[Any, tuple | None, dict[str, dict[int, str]]]:
    """A TorchScript ``.pt`` (torch.jit.load) or ``.pt2`` (torch.export.load(...).module()).

    Returns (module, the example args saved in a .pt2 or None, the .pt2's symbolic dims by input).
    """
    import torch

    if path.suffix == ".pt2":
        if not zipfile.is_zipfile(path):
            raise ModelLoadError(
                f"{path}: not a torch.export program (not a zip archive: corrupt or another "
                "format); save one with torch.export.save(torch.export.export(model, args), path)."
            )
        export_log = logging.getLogger("torch.export")
        level = export_log.level
        export_log.setLevel(logging.CRITICAL)  # torch logs a traceback before raising
        try:
            program = torch.export.load(str(path))
        except Exception as e:  # torch raises many types for a bad archive
            raise ModelLoadError(
                f"{path}: not a torch.export program ({_first_sentence(e)}); save one with "
                "torch.export.save(torch.export.export(model, args), path)."
            ) from None
        finally:
            export_log.setLevel(level)
        args = tuple(program.example_inputs[0]) if program.example_inputs else None
        return program.module(), args, _program_dynamic_axes(program)
    if _is_pickle_not_script(path):
        raise ModelLoadError(
            f"{path}: holds pickled weights or a pickled module (torch.save), not a TorchScript "
            "model: convert model.py:ClassName instead (build the model and load the weights "
            "there), or save it with torch.jit.script(model).save(path)."
        )
    try:
        return torch.jit.load(str(path), map_location="cpu"), None, {}
    except Exception as e:
        raise ModelLoadError(
            f"{path}: not a TorchScript model ({_first_sentence(e)}); save the model with "
            "torch.jit.script(model).save(path)."
        ) from None


def _first_sentence(e: BaseException) -> str:
    return first_line(e).split(". ")[0].rstrip(".")
