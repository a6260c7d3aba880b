"""The pass contract and the pipeline runner: change counts, fixed point, verification naming the culprit."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest

from tests.helpers import parse
from zonnx.errors import OptionError, PassFailedError, VerificationError
from zonnx.ir.io import to_ir
from zonnx.passes import Changes, Pipeline, VerifyOptions, ZonnxPass, resolve_pass_names

CHAIN = """
<ir_version: 8, opset_import: ["" : 17]>
chain (float[2, 3] x) => (float[2, 3] y) {
    a = Identity(x)
    b = Relu(a)
    c = Identity(b)
    y = Neg(c)
}
"""


class _DropOneIdentity(ZonnxPass):
    """Removes the first Identity node it finds (one per call, so a fixed point takes several rounds)."""

    name = "drop-one-identity"

    def apply(self, model: ir.Model) -> Changes:
        changes = Changes()
        for node in model.graph:
            if node.op_type == "Identity":
                ir.convenience.replace_all_uses_with(node.outputs[0], node.inputs[0])
                model.graph.remove(node, safe=True)
                changes.add("removed Identity")
                break
        return changes


class _ReluToSigmoid(ZonnxPass):
    """Replaces Relu with Sigmoid: a deliberately wrong rewrite that verification must catch."""

    name = "relu-to-sigmoid"

    def apply(self, model: ir.Model) -> Changes:
        changes = Changes()
        for node in model.graph:
            if node.op_type == "Relu":
                node.op_type = "Sigmoid"
                changes.add("replaced Relu")
        return changes


class _Crash(ZonnxPass):
    """Raises an internal error."""

    name = "crash"

    def apply(self, model: ir.Model) -> Changes:
        raise KeyError("internal")


def test_result_modified_comes_from_counts() -> None:
    model = to_ir(parse(CHAIN))
    first = _DropOneIdentity()(model)
    assert first.modified and first.changes.counts["removed Identity"] == 1
    second = _DropOneIdentity()(model)
    third = _DropOneIdentity()(model)
    assert second.modified and not third.modified
    assert [n.op_type for n in model.graph] == ["Relu", "Neg"]


def test_fixed_point_runs_until_nothing_changes() -> None:
    model = to_ir(parse(CHAIN))
    report = Pipeline([_DropOneIdentity()], fixed_point=True, verify=VerifyOptions()).run(model)
    assert report.rounds == 3  # two rounds remove one Identity each, the third changes nothing
    rec = report.records[0]
    assert rec.removed == {"Identity": 2} and not rec.added
    assert (report.nodes_before, report.nodes_after) == (4, 2)
    assert report.max_error == 0.0


def test_single_round_stops_after_one() -> None:
    model = to_ir(parse(CHAIN))
    report = Pipeline([_DropOneIdentity()], fixed_point=False).run(model)
    assert report.rounds == 1 and report.nodes_after == 3


def test_verification_names_the_pass_that_broke_numerics() -> None:
    model = to_ir(parse(CHAIN))
    pipeline = Pipeline([_DropOneIdentity(), _ReluToSigmoid()], verify=VerifyOptions())
    with pytest.raises(VerificationError, match="after pass 'relu-to-sigmoid': output 'y' differs"):
        pipeline.run(model)


def test_internal_error_becomes_pass_failed_error() -> None:
    with pytest.raises(PassFailedError, match="pass 'crash' failed.*--skip crash"):
        Pipeline([_Crash()]).run(to_ir(parse(CHAIN)))


def test_verification_without_numeric_still_checks_loadability() -> None:
    model = to_ir(parse(CHAIN))
    report = Pipeline([_ReluToSigmoid()], verify=VerifyOptions(numeric=False)).run(model)
    assert report.final_diffs is None and report.records[0].modified


def test_resolve_pass_names_rejects_typos_with_a_suggestion() -> None:
    with pytest.raises(OptionError, match="Did you mean 'fold-batchnorm'"):
        resolve_pass_names(passes=["fold-batchnrom"])
    with pytest.raises(OptionError, match="unknown pipeline"):
        resolve_pass_names("pre-quant")
    names = resolve_pass_names("pre_quant", skip=["cse"])
    assert "cse" not in names and names[0] == "opset-upgrade"
    assert resolve_pass_names(passes=["clean", "fuse-gelu"])[-1] == "fuse-gelu"


def test_verify_generates_inputs_for_symbolic_dims() -> None:
    model = to_ir(
        parse(
            """
<ir_version: 8, opset_import: ["" : 17]>
dyn (float[N, C] x) => (float[N, C] y) {
    a = Identity(x)
    y = Abs(a)
}
"""
        )
    )
    report = Pipeline([_DropOneIdentity()], verify=VerifyOptions(shapes={"x": (3, 5)})).run(model)
    assert report.final_diffs is not None and report.final_diffs[0].max_abs == 0.0
    assert np.isfinite(report.final_diffs[0].cosine)
