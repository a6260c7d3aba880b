"""NPU program execution (zonnx.backend.runtime): the numpy reference executor."""

from .reference import ReferenceError, execute_op, run_program

__all__ = ["run_program", "execute_op", "ReferenceError"]
