"""``tune_gc``: the long-running workers' collector settings, checked in a fresh interpreter (the
test process keeps its own)."""

from __future__ import annotations

import json
import subprocess
import sys

from couponcenter.core.process import GC_GEN0_THRESHOLD

PROBE = """
import gc, json
from couponcenter.core.process import tune_gc
before = gc.get_threshold()
tune_gc()
garbage = []
garbage.append(garbage)  # a cycle: only the collector frees it
del garbage
print(json.dumps({"before": before, "after": gc.get_threshold(), "frozen": gc.get_freeze_count(),
                  "collected": gc.collect()}))
"""


def test_tune_gc_freezes_start_up_and_collects_the_young_generation_less_often():
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True)
    got = json.loads(out.stdout)
    assert got["before"][0] == 700  # Python's default, so the change below is ours
    assert got["after"] == [GC_GEN0_THRESHOLD, *got["before"][1:]]
    assert got["frozen"] > 1000  # everything alive after start-up
    assert got["collected"] >= 1  # garbage is still collected
