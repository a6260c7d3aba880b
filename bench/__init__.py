"""Benchmarks: each one measures ours against a peer in the same run; see bench/README.md."""
