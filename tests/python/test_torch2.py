"""PyTorch 2.x (issue 31): runs only where the interpreter's torch is 2.x (the venv
that scripts/install-torch2-venv.sh makes; ctest's python-torch2.* entries, see
docs/development.md, "PyTorch 2.x"); elsewhere every test skips, saying so. Under torchrun
with 2 ranks:
DDP on the "gradcomm" backend with set_compression(WORLD, "topk:ratio=0.01"), and
DDP over gloo with gradcomm's compression_hook: parameters bitwise identical across
ranks after 5 steps, plain all_reduce exact, the compressor really ran; the backend's
2.x-only calls (coalescing, the *_coalesced tensor ops, new_group subgroups,
compressed reduce_scatter_tensor) against closed-form references."""
import os
import re

import pytest

from conftest import PYTHON, WORKERS, expect_ok, launch, run, torchrun

torch = pytest.importorskip("torch")
if int(torch.__version__.split(".")[0]) < 2:
    pytest.skip(f"needs torch >= 2 (this interpreter has torch {torch.__version__}); scripts/test-torch2.sh runs "
                "these in the torch 2.x venv", allow_module_level=True)
gtorch = pytest.importorskip("gradcomm.torch")
if not gtorch.backend_available():
    pytest.fail(f"torch {torch.__version__} but no gradcomm backend: {gtorch.backend_available().reason}")


@pytest.mark.parametrize("mode", ["backend", "hook"])
def test_ddp_replicas_bitwise_identical_and_all_reduce_exact(mode):
    result = torchrun(os.path.join(WORKERS, "torch2_ddp.py"), mode)
    expect_ok(result, 2, "torch2-ddp")
    digests = set(re.findall(r"OK torch2-ddp rank=\d+ .*digest=([0-9a-f]+)", result.stdout))
    assert len(digests) == 1, result.stdout


@pytest.mark.parametrize("n", [2, 3])
def test_torch2_calls_match_references(n):
    expect_ok(launch(n, os.path.join(WORKERS, "torch2_collectives.py")), n, "torch2-collectives")


def test_backend_registered_for_its_devices():
    assert "gradcomm" in torch.distributed.Backend.backend_capability
    devices = torch.distributed.Backend.backend_capability["gradcomm"]
    assert devices[0] == "cpu" and set(devices) <= {"cpu", "cuda"}


def test_set_compression_on_another_backends_group_names_it(tmp_path):
    code = f"""
import torch.distributed as dist, gradcomm.torch as gt
dist.init_process_group("gloo", store=dist.FileStore({str(tmp_path / 'store')!r}, 1), rank=0, world_size=1)
try:
    gt.set_compression(dist.group.WORLD, "topk:ratio=0.01")
except TypeError as e:
    assert 'process group of the "gradcomm" backend, got one of "gloo"' in str(e), e
    print("OK refused")
dist.destroy_process_group()
"""
    result = run([PYTHON, "-c", code], timeout=60)
    assert result.returncode == 0 and "OK refused" in result.stdout, result.stdout
