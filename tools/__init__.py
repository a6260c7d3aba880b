"""The zonnx command line: one module per subcommand, thin over the Python API (zonnx.tools)."""
