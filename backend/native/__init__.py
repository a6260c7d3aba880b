"""Native NPU kernels: a C++ ORT custom-op library (``src/``) built at setup, and its loader.

See ``build`` (how the library is built and cached) and ``loader`` (when it is used), and
``zonnx.backend.runtime.ort_native`` (the ops and their exact formulas).
"""

from .build import (
    ABI_VERSION,
    LIB_NAME,
    BuildResult,
    NativeBuildError,
    build_library,
    library_path,
    native_dir,
)
from .loader import (
    ISA_ENV,
    KERNEL_CHOICES,
    KERNELS_ENV,
    NativeStatus,
    choose_kernels,
    conv_isa,
    native_status,
    register_library,
)

__all__ = [
    "ABI_VERSION",
    "LIB_NAME",
    "BuildResult",
    "NativeBuildError",
    "build_library",
    "library_path",
    "native_dir",
    "KERNEL_CHOICES",
    "KERNELS_ENV",
    "NativeStatus",
    "choose_kernels",
    "native_status",
    "register_library",
    "ISA_ENV",
    "conv_isa",
]
