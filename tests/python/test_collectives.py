"""numpy collectives over real processes started by the built gradcomm-run: results
against closed forms and a numpy top-k reference, mismatched calls, alloc_shared buffers
reduced in place, dead and late peers."""
import os

import pytest

from conftest import EXAMPLES, WORKERS, expect_ok, launch


@pytest.mark.parametrize("n", [2, 3])
def test_numpy_collectives_match_references(n):
    expect_ok(launch(n, os.path.join(WORKERS, "numpy_collectives.py")), n, "numpy")


@pytest.mark.parametrize("kind", ["numel", "compressor", "op", "op_stopped"])
def test_mismatched_calls_raise_mismatch_error_on_every_rank(kind):
    expect_ok(launch(3, os.path.join(WORKERS, "mismatch.py"), kind), 3, f"mismatch-{kind}")


@pytest.mark.parametrize("n", [2, 3])
def test_allreduce_reads_alloc_shared_buffers_in_place(n):
    expect_ok(launch(n, os.path.join(WORKERS, "shared_buffers.py")), n, "shared-buffers")


def test_dead_peer_is_peer_failure():
    expect_ok(launch(2, os.path.join(WORKERS, "faults.py"), "peer_exit"), 2, "faults-peer_exit")


def test_late_peer_is_timeout_error():
    expect_ok(launch(2, os.path.join(WORKERS, "faults.py"), "timeout"), 2, "faults-timeout")


def test_numpy_example_runs_under_gradcomm_run():
    result = launch(2, os.path.join(EXAMPLES, "numpy_allreduce.py"))
    assert result.returncode == 0, result.stdout
    assert result.stdout.count(": ok;") == 2, result.stdout
