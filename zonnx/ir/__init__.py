"""Model I/O and helpers shared by every part: load anything, save what ORT 1.31 loads, atomically."""

from zonnx.ir.io import (
    MAX_IR_VERSION,
    ModelLike,
    load_model,
    load_proto,
    save_model,
    to_ir,
    to_proto,
)

__all__ = ["MAX_IR_VERSION", "ModelLike", "load_model", "load_proto", "save_model", "to_ir", "to_proto"]
