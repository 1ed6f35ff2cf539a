"""Fusion (src/fusion.h) under programs whose ranks issue differently: a skipped or
extra call is a prompt MismatchError on every rank; a local call or buffer reuse on
one rank only is exact (issue 30, items 2-4); threads issuing concurrently are
refused on every rank, never paired across threads (item 5)."""
import os

import pytest

from conftest import WORKERS, expect_ok, launch


@pytest.mark.parametrize("kind", ["skip_middle", "extra_call", "local_between", "reuse", "threads"])
def test_fusion_follows_every_ranks_program(kind):
    n = 3 if kind == "skip_middle" else 2
    env = {"GRADCOMM_TIMEOUT_S": "60"}
    expect_ok(launch(n, os.path.join(WORKERS, "fusion_faults.py"), kind, env=env), n, kind)
