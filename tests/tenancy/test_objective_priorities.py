"""Tiers in the Gateway API Inference Extension's priority convention (InferenceObjective)."""

from __future__ import annotations

import pytest

from tenancy.priority import objective_priorities
from tenancy.settings import TierBand


def test_objective_priorities_follow_the_inference_extension_convention() -> None:
    tiers = {
        "realtime": TierBand(lo=0, hi=9, default=0),
        "standard": TierBand(lo=10, hi=19, default=10),
        "batch": TierBand(lo=20, hi=29, default=20),
    }
    # Higher is more important; the default tier is GIE's default (0); slower tiers shed first.
    assert objective_priorities(tiers, "standard") == {"realtime": 1, "standard": 0, "batch": -1}
    assert objective_priorities(tiers, "batch") == {"realtime": 2, "standard": 1, "batch": 0}
    tiers["bulk"] = TierBand(lo=20, hi=39, default=20)  # same default, same priority
    assert objective_priorities(tiers, "standard")["bulk"] == -1
    with pytest.raises(ValueError, match="default_tier"):
        objective_priorities(tiers, "nope")
