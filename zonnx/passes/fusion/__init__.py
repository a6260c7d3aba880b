"""Fusion rules: BatchNorm folding, LayerNorm/GELU fusion, Gemm canonicalization, Transpose/Reshape cancellation."""
