"""NPU constraint refinement passes driven by a target description.

Each module enforces one rule of ``zonnx.backend.targets.Target.quant`` on a quantized model (QDQ,
FixNeuron or Vitis Q/DQ; positions are read and written by ``positions.QuantGraph``):
``concat`` (align_concat), ``pool`` (align_pool), ``eltwise`` (shift_read/shift_write), ``shift_cut``,
``shift_bias``, ``leaky_relu`` (slope 26/256), ``avgpool`` (multiply+shift factor), ``sigmoid``
(input/output position limits). ``pipeline.refine_model`` runs them all.
"""
