"""Custom quantized ops as ONNX model-local functions, each with a numpy reference kernel (zonnx.custom_ops)."""
