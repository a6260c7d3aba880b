"""zonnx: an ONNX-centric NPU deployment toolchain (convert, optimize, quantize, compile, run)."""

__version__ = "0.1.0"
