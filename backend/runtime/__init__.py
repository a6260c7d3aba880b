"""NPU program execution (zonnx.backend.runtime): the numpy reference executor and the ORT lowering.

``reference.run_program`` / ``execute_op`` run a program through the op modules of
``zonnx.backend.ops``, which import this package's machinery (``ort_kernels``, ``ort_native``,
``ort_values``, ``ref_math``); so this package exports only ``ReferenceError`` and never imports the
drivers.
"""

from .ref_math import ReferenceError

__all__ = ["ReferenceError"]
