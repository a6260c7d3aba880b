"""NPU constraint refinement passes driven by a target description."""
