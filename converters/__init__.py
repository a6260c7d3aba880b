"""Frontends from PyTorch, TensorFlow/Keras and TFLite to clean ONNX (zonnx.converters)."""
