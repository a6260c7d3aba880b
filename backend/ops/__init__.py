"""NPU op kinds, one module each (zonnx.backend.ops): formula, compile rule, reference, ORT lowering.

Each module's docstring holds its integer formula; its ``SPEC`` registers the compile rules (ONNX nodes
-> program ops), the numpy reference kernel, the exact ORT lowering with the native kernels it uses,
and its partition-time checks. ``registry`` collects them (the one list of op modules); ``spec`` defines
the parts. Shared machinery lives outside: ``compiler.values`` / ``params`` / ``linear`` (grids,
multipliers, compile values), ``runtime.ort_kernels`` / ``ort_native`` / ``ort_values`` (node builders,
exact requantization, native custom ops), ``runtime.ref_math`` (exact reference products).
"""
