"""Retarget already-quantized models: import their grids, re-express them in a target's rules."""

from zonnx.quantization.prequant.detect import quantized_form
from zonnx.quantization.prequant.grids import Grid
from zonnx.quantization.prequant.importer import ImportedModel, import_prequantized

__all__ = ["Grid", "ImportedModel", "import_prequantized", "quantized_form"]
