"""Tests of zonnx.backend."""
