"""Keep a float fall-back search within the NPU's share of MACs before it starts.

On a target without int16 a raised layer runs in float on the CPU. With ``min_npu_share`` s, the layers
raised together may hold at most ``(n - s)`` of the model's MACs, where n is the share the all-int8
model already keeps on the NPU (layers the NPU cannot run at all, such as PP-OCRv4 rec's 6625-class
head on dpu-b4096, 4.6% of its MACs, are on the CPU before anything is raised). Rule: walk the search
order (most sensitive first) and keep a layer when the MACs already kept plus its own stay within that
allowance; a layer over it is skipped and the walk goes on, so cheap layers further down (elementwise
ops, Softmax, LayerNorm pieces: no MACs) still get their turn. A layer whose MACs cannot be counted (shapes unknown)
is skipped. A layer the all-int8 model already runs on the CPU (``off_npu``: that head) costs nothing:
raising it moves no MACs off the NPU. Without this, the search's "every layer raised" probe can hold most
of the MACs, miss the share and end the search with nothing.

The partitioner's share can still differ a little (a float layer can strand a small NPU subgraph below
the minimum size); the search checks each choice's real share afterwards.
"""

from __future__ import annotations

__all__ = ["within_mac_allowance"]

import logging
from collections.abc import Collection, Mapping, Sequence

logger = logging.getLogger(__name__)


def within_mac_allowance(
    order: Sequence[str],
    macs: Mapping[str, int | None],
    min_npu_share: float,
    npu_share_now: float = 1.0,
    off_npu: Collection[str] = (),
) -> list[str]:
    """The layers of ``order`` the walk of the module docstring keeps, in order; ``npu_share_now``: the
    share of MACs the all-int8 model keeps on the NPU (n); ``off_npu``: the nodes it runs on the CPU."""
    total = sum(m for m in macs.values() if m)
    allowance = max(0.0, npu_share_now - min_npu_share) * total
    kept, used, skipped = [], 0, []
    for name in order:
        cost = 0 if name in off_npu else macs.get(name, 0)
        if cost is None or used + cost > allowance:
            skipped.append(name)
            continue
        kept.append(name)
        used += cost
    if skipped:
        logger.info(
            "float fall-back search: %d of %d layers left out of the order, to keep at least %.0f%% of MACs on "
            "the NPU (the kept ones hold %.1f%% of MACs)",
            len(skipped),
            len(order),
            100 * min_npu_share,
            100 * used / total if total else 0.0,
        )
    return kept
