"""Seeded mutations of the files users hand to zonnx: models, calibration arrays and target files.

Each mutation takes the valid bytes of one file and a ``random.Random`` and returns new bytes plus a
short label naming what it did, so a failing case can be replayed from its seed and label alone.
Byte mutations (flip, truncate, splice, empty, random) apply to any file; field mutations parse the
file first (ONNX protobuf, ``.npz`` archive, TOML text) and break one field in a way a real broken
file would (wrong type, missing tensor, duplicate writer, cycle, absurd number, object array).
"""

from __future__ import annotations

__all__ = ["mutate", "MUTATORS"]

import io
import random
import zipfile
from collections.abc import Callable

import numpy as np
import onnx

Mutator = Callable[[bytes, random.Random], tuple[bytes, str]]

_ABSURD_NUMBERS = ["0", "-1", "-300", "nan", "inf", "-inf", "1e308", "4294967297", '"x"', "true", "[]"]
_OP_TYPES = ["Conv", "Relu", "Foo", "", "MatMul", "If", "Loop", "QuantizeLinear", "Reshape", "Gemm"]


def _flip(data: bytes, rng: random.Random) -> tuple[bytes, str]:
    """Flip 1-8 random bits."""
    buf = bytearray(data)
    count = rng.randint(1, 8)
    for _ in range(count):
        if buf:
            pos = rng.randrange(len(buf))
            buf[pos] ^= 1 << rng.randrange(8)
    return bytes(buf), f"flip{count}"


def _truncate(data: bytes, rng: random.Random) -> tuple[bytes, str]:
    """Keep a random prefix."""
    cut = rng.randrange(max(len(data), 1))
    return data[:cut], f"truncate@{cut}"


def _splice(data: bytes, rng: random.Random) -> tuple[bytes, str]:
    """Copy a random chunk over another place, or delete one."""
    if len(data) < 4:
        return data + data, "double"
    a, b = sorted(rng.sample(range(len(data)), 2))
    if rng.random() < 0.5:
        return data[:a] + data[b:], f"delete[{a}:{b}]"
    at = rng.randrange(len(data))
    return data[:at] + data[a:b] + data[at:], f"insert[{a}:{b}]@{at}"


def _empty(data: bytes, rng: random.Random) -> tuple[bytes, str]:
    """A zero-length file."""
    return b"", "empty"


def _noise(data: bytes, rng: random.Random) -> tuple[bytes, str]:
    """Random bytes of the same length."""
    return rng.randbytes(max(len(data), 1)), "random"


_BYTE_MUTATORS: list[Mutator] = [_flip, _truncate, _splice, _empty, _noise]


def _model_field(data: bytes, rng: random.Random) -> tuple[bytes, str]:
    """Break one field of a valid ONNX model: op type, names, dims, types, versions, writers, cycles."""
    model = onnx.ModelProto.FromString(data)
    graph = model.graph
    node = graph.node[rng.randrange(len(graph.node))]
    choice = rng.randrange(12)
    if choice == 0:
        node.op_type = rng.choice(_OP_TYPES)
        label = f"op_type={node.op_type!r}"
    elif choice == 1:
        graph.node.remove(node)
        label = f"remove node {node.name}"
    elif choice == 2 and graph.initializer:
        init = graph.initializer[rng.randrange(len(graph.initializer))]
        graph.initializer.remove(init)
        label = f"remove initializer {init.name}"
    elif choice == 3 and graph.initializer:
        init = graph.initializer[rng.randrange(len(graph.initializer))]
        init.dims.append(rng.choice([0, 3, 1 << 40]))
        label = f"dims of {init.name}"
    elif choice == 4 and graph.initializer:
        init = graph.initializer[rng.randrange(len(graph.initializer))]
        init.data_type = rng.choice([0, 2, 7, 8, 10, 16, 99])
        label = f"data_type of {init.name}"
    elif choice == 5 and node.input:
        node.input[rng.randrange(len(node.input))] = rng.choice(["missing", "", node.output[0]])
        label = "dangling or cyclic input"
    elif choice == 6:
        other = graph.node[rng.randrange(len(graph.node))]
        node.output[0] = other.output[0]
        label = "duplicate writer"
    elif choice == 7:
        model.opset_import[0].version = rng.choice([0, 1, 6, 99, -1])
        label = f"opset {model.opset_import[0].version}"
    elif choice == 8:
        model.ir_version = rng.choice([0, 1, 3, 99, -1])
        label = f"ir_version {model.ir_version}"
    elif choice == 9 and node.attribute:
        attr = node.attribute[rng.randrange(len(node.attribute))]
        attr.type = rng.choice(
            [
                onnx.AttributeProto.STRING,
                onnx.AttributeProto.TENSOR,
                onnx.AttributeProto.GRAPH,
                onnx.AttributeProto.INTS,
            ]
        )
        label = f"attribute type of {attr.name}"
    elif choice == 10:
        value = graph.input[0].type.tensor_type
        value.elem_type = rng.choice([0, 7, 9, 10, 11])
        label = f"input elem_type {value.elem_type}"
    else:
        dim = graph.input[0].type.tensor_type.shape.dim
        if dim:
            dim[rng.randrange(len(dim))].dim_value = rng.choice([0, 1 << 31, 7])
        label = "input dims"
    return model.SerializeToString(), label


def _npz_field(data: bytes, rng: random.Random) -> tuple[bytes, str]:
    """Rewrite one array of a valid ``.npz``: object, wrong dtype or shape, NaN, renamed key, empty archive."""
    with np.load(io.BytesIO(data)) as archive:
        arrays = {key: archive[key] for key in archive.files}
    key = rng.choice(sorted(arrays))
    choice = rng.randrange(7)
    if choice == 0:
        arrays[key] = np.array([{"a": 1}, None], dtype=object)
        label = "object array"
    elif choice == 1:
        arrays[key] = arrays[key].astype(rng.choice([np.int64, np.float16, np.complex64, np.bool_]))
        label = f"dtype {arrays[key].dtype}"
    elif choice == 2:
        arrays[key] = arrays[key].reshape(-1)[: rng.randrange(1, 50)]
        label = "shape"
    elif choice == 3:
        arrays[key] = np.full_like(arrays[key], rng.choice([np.nan, np.inf, 1e38]))
        label = "non-finite values"
    elif choice == 4:
        arrays["renamed"] = arrays.pop(key)
        label = "renamed key"
    elif choice == 5:
        arrays = {}
        label = "empty archive"
    else:
        arrays[key] = np.zeros((0,) + arrays[key].shape[1:], arrays[key].dtype)
        label = "zero samples"
    out = io.BytesIO()
    if choice == 0:
        with zipfile.ZipFile(out, "w") as zf, zf.open(f"{key}.npy", "w") as f:
            np.save(f, arrays[key], allow_pickle=True)
    else:
        np.savez(out, **arrays)
    return out.getvalue(), label


def _toml_field(data: bytes, rng: random.Random) -> tuple[bytes, str]:
    """Set one ``key = number`` line of a target file to an absurd value, or delete/duplicate a line."""
    lines = data.decode().splitlines()
    numbered = [
        i for i, line in enumerate(lines) if "=" in line and line.split("=", 1)[1].strip()[:1].isdigit()
    ]
    choice = rng.randrange(3)
    if choice == 0 and numbered:
        i = rng.choice(numbered)
        value = rng.choice(_ABSURD_NUMBERS)
        lines[i] = f"{lines[i].split('=', 1)[0]}= {value}"
        label = f"{lines[i].split('=', 1)[0].strip()} = {value}"
    elif choice == 1 and lines:
        i = rng.randrange(len(lines))
        label = f"delete line {i}"
        del lines[i]
    else:
        i = rng.randrange(len(lines))
        lines.insert(i, lines[i])
        label = f"duplicate line {i}"
    return ("\n".join(lines) + "\n").encode(), label


MUTATORS: dict[str, list[Mutator]] = {
    "onnx": _BYTE_MUTATORS + [_model_field] * 5,
    "npz": _BYTE_MUTATORS + [_npz_field] * 5,
    "toml": _BYTE_MUTATORS + [_toml_field] * 5,
}


def mutate(kind: str, data: bytes, rng: random.Random) -> tuple[bytes, str]:
    """One seeded mutation of a file of ``kind`` ("onnx", "npz" or "toml"); field mutations weigh 50%."""
    return rng.choice(MUTATORS[kind])(data, rng)
