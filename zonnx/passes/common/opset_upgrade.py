"""Upgrade the default-domain opset: onnx's version converter when its result checks out, else zonnx's adapters.

The rule, per model: run ``onnx.version_converter``; accept its result only when it passes every
check the original passes: ``onnx.checker`` (full check, i.e. strict shape inference, when the
original passes it), every function body at the target opset too, ORT loads and runs it, and its
outputs match the original's (ORT, or onnx's reference evaluator for op versions ORT lacks) on
generated inputs. Otherwise run zonnx's adapters (``opset_adapters``: attributes that became
inputs, Softmax's axis semantics, Upsample -> Resize, ...) on a copy and check their result the
same way. A model neither path can upgrade is left unchanged and the pass fails, naming the nodes
and the reasons; the misses say why the converter's result was rejected.
"""

from __future__ import annotations

__all__ = ["MIN_TARGET_OPSET", "MAX_TARGET_OPSET", "OpsetUpgradePass"]

import dataclasses
import logging

import numpy as np
import onnx
import onnx.reference
import onnx.version_converter
import onnx_ir as ir

from zonnx.errors import OptionError, PassFailedError, VerificationError, first_line
from zonnx.ir.io import MAX_IR_VERSION, default_opset, to_proto
from zonnx.ir.large import check_model
from zonnx.passes.base import Changes, ZonnxPass
from zonnx.passes.common.opset_adapters import Rewriter
from zonnx.verify import compare_outputs, make_inputs, ort_session, run_ort

logger = logging.getLogger(__name__)

#: Lowest target: per-channel quantization (DequantizeLinear ``axis``) needs opset 13.
MIN_TARGET_OPSET = 13
#: Highest target whose breaking changes the adapters know (checked against onnx's schemas).
MAX_TARGET_OPSET = 23


@dataclasses.dataclass
class _Baseline:
    """What the original model passes; a candidate must pass the same."""

    checker: int = 0  # 2: onnx.checker full check, 1: basic check, 0: neither
    feeds: dict[str, np.ndarray] | None = None
    expected: dict[str, np.ndarray] | None = None


def _min_ir_version(opset: int) -> int:
    """The IR version a model at ``opset`` must declare (onnx's release table), clamped for ORT."""
    needed = onnx.helper.find_min_ir_version_for([onnx.helper.make_opsetid("", opset)], True)
    return min(needed, MAX_IR_VERSION)


class OpsetUpgradePass(ZonnxPass):
    """Upgrades the default-domain opset to ``target_opset``; outputs stay numerically the same.

    Options:
        target_opset: the opset to reach, 13..23 (default 17). A model already at or above it is
            left unchanged (the pass never downgrades).
        use_converter: try ``onnx.version_converter`` first (default True); False uses only
            zonnx's adapters.
        verify: compare ORT outputs of the original and the candidate on generated inputs before
            accepting a candidate (default True).
        shapes: concrete input shapes for that comparison (default: batch 1, other symbols 64).
        rtol: bound on max-abs error over the output's range for that comparison (default 1e-5).
    """

    name = "opset-upgrade"

    def __init__(
        self,
        target_opset: int = 17,
        *,
        use_converter: bool = True,
        verify: bool = True,
        shapes: dict[str, tuple[int, ...]] | None = None,
        rtol: float = 1e-5,
    ) -> None:
        super().__init__()
        if not isinstance(target_opset, int) or not MIN_TARGET_OPSET <= target_opset <= MAX_TARGET_OPSET:
            raise OptionError(
                f"opset-upgrade: target_opset={target_opset!r} is out of range; give an opset from "
                f"{MIN_TARGET_OPSET} to {MAX_TARGET_OPSET} (the pass never downgrades a model)."
            )
        self.target_opset = target_opset
        self.use_converter = use_converter
        self.verify = verify
        self.shapes = shapes
        self.rtol = rtol

    def __repr__(self) -> str:
        return f"{type(self).__name__}(target_opset={self.target_opset})"

    def apply(self, model: ir.Model) -> Changes:
        changes = Changes()
        src, dst = default_opset(model), self.target_opset
        if src == 0:
            changes.miss("model imports no default-domain opset; nothing to upgrade")
            return changes
        if src > dst:
            changes.miss(f"model is at opset {src}, above the target {dst}; left unchanged (no downgrade)")
            return changes
        if src == dst:
            return changes
        proto = to_proto(model)
        base = self._baseline(proto, changes)
        reasons: list[str] = []
        candidate: onnx.ModelProto | None = None
        if self.use_converter:
            candidate, why = self._convert(proto, dst, base)
            if candidate is None:
                reasons.append(f"onnx version converter: {why}")
        if candidate is not None:
            added = len(candidate.graph.node) - len(proto.graph.node)
            changes.add("nodes added by onnx version converter", max(added, 0))
        else:
            candidate = self._adapt(proto, src, dst, base, reasons, changes)
        new = ir.serde.deserialize_model(candidate)
        model.graph = new.graph
        model.functions.clear()
        model.functions.update(new.functions)
        model.ir_version = new.ir_version
        changes.add(f"opset {src} -> {dst}")
        logger.info("upgraded opset %d -> %d", src, dst)
        return changes

    def _baseline(self, proto: onnx.ModelProto, changes: Changes) -> _Baseline:
        """What the original passes: the strongest onnx.checker level, and its outputs on generated inputs.

        Outputs come from ORT, or from onnx's reference evaluator when ORT cannot load the
        original (old op versions). A candidate must pass everything the original passes.
        """
        base = _Baseline()
        for level, full in ((2, True), (1, False)):
            try:
                check_model(proto, full_check=full)
                base.checker = level
                break
            except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as e:
                if level == 1:
                    changes.miss(f"the original model fails onnx.checker ({first_line(e)})")
        if not self.verify:
            return base
        try:
            base.feeds = make_inputs(proto, shapes=self.shapes)
        except OptionError as e:
            if self.shapes:
                raise OptionError(f"opset-upgrade: {e}") from None
            changes.miss(f"outputs not compared: {e}")
            return base
        try:
            ort_session(proto)
        except VerificationError as e:
            try:
                outputs = onnx.reference.ReferenceEvaluator(proto).run(None, base.feeds)
                base.expected = dict(zip([o.name for o in proto.graph.output], outputs, strict=True))
            except Exception as ref_error:  # the evaluator raises whatever its op kernels raise
                changes.miss(
                    f"outputs not compared: the original runs neither in ORT ({e}) nor in onnx's "
                    f"reference evaluator ({first_line(ref_error)})"
                )
            return base
        try:
            base.expected = run_ort(proto, base.feeds)
        except VerificationError as e:
            changes.miss(f"outputs not compared: the original fails on generated inputs ({e})")
            base.feeds = None
        return base

    def _convert(
        self, proto: onnx.ModelProto, dst: int, base: _Baseline
    ) -> tuple[onnx.ModelProto | None, str]:
        try:
            converted = onnx.version_converter.convert_version(proto, dst)
        except Exception as e:  # the converter raises RuntimeError, ValueError or C++ errors
            return None, f"failed ({first_line(e)})"
        converted.ir_version = max(min(converted.ir_version, MAX_IR_VERSION), _min_ir_version(dst))
        why = self._check(converted, dst, base)
        return (None, why) if why else (converted, "")

    def _adapt(self, proto, src: int, dst: int, base: _Baseline, reasons: list[str], changes: Changes):
        """Run zonnx's adapters on a copy; raise PassFailedError (model untouched) when they cannot."""
        failed = (
            f"opset-upgrade: cannot upgrade opset {src} -> {dst}: {'; '.join(reasons) or 'converter off'}"
        )
        work = ir.serde.deserialize_model(onnx.ModelProto.FromString(proto.SerializeToString()))
        rewriter = Rewriter(work, dst)
        rewriter.run()
        if rewriter.refused:
            for r in rewriter.refused:
                changes.miss(r)
            shown = "; ".join(rewriter.refused[:8]) + (" ..." if len(rewriter.refused) > 8 else "")
            raise PassFailedError(
                f"{failed}; zonnx's adapters refuse {len(rewriter.refused)} node(s): {shown}. "
                "Re-export the model at the target opset or skip the pass with --skip opset-upgrade."
            )
        work.ir_version = max(min(work.ir_version, MAX_IR_VERSION), _min_ir_version(dst))
        candidate = to_proto(work)
        why = self._check(candidate, dst, base)
        if why:
            raise PassFailedError(
                f"{failed}; zonnx's adapters gave a model that fails its check ({why}). "
                "Skip the pass with --skip opset-upgrade and report the model."
            )
        adapted = ", ".join(f"{k} x{n}" for k, n in sorted(rewriter.changes.counts.items()))
        for reason in reasons:
            changes.miss(f"{reason}; used zonnx's adapters instead ({adapted or 'version bumps only'})")
        changes.merge(rewriter.changes)
        return candidate

    def _check(self, proto: onnx.ModelProto, dst: int, base: _Baseline) -> str | None:
        """Why ``proto`` is not an acceptable upgrade, or None when it is."""
        if base.checker:
            try:
                check_model(proto, full_check=base.checker == 2)
            except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as e:
                return f"onnx.checker rejects its result ({first_line(e)})"
        for func in proto.functions:
            version = default_opset(onnx.ModelProto(opset_import=func.opset_import))
            if version and version != dst:
                return f"function {func.domain}.{func.name} is left at opset {version}"
        try:
            if base.feeds is None:
                ort_session(proto)
                return None
            actual = run_ort(proto, base.feeds)
            if base.expected is None:
                return None
            diffs = compare_outputs(base.expected, actual)
        except VerificationError as e:
            return str(e)
        for d in diffs:
            if not d.within(self.rtol):
                return f"output {d.name!r} differs from the original by {d.relative:.3g} of its range"
        return None
