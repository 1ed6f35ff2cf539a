"""PyTorch: DDP with gloo plus gradcomm's hook, and DistributedOptimizer, on 2 and 4 ranks
(parameters bitwise identical across ranks after every step, loss falling, compression
"none" equal to plain DDP within fp32 tolerance); DistributedOptimizer with a layer that
has no gradient on one rank only (equal to a reference, fusion on and off); callbacks on
the hook's futures that wait on the hook again, run in issue order, and past a stall;
the hook's futures in a forked child and at the program's end (a callback still
running); the hook's errors keep their gradcomm class;
compressor=auto through the hook measuring the overlap DDP gives; the examples under
gradcomm-run and torchrun."""
import os

import pytest

from conftest import EXAMPLES, PYTHON, WORKERS, expect_ok, launch, run, torchrun, torchrun_command

torch = pytest.importorskip("torch")
if not torch.distributed.is_available():
    pytest.skip("torch.distributed is not available", allow_module_level=True)

SCENARIOS = ["ddp:none", "ddp:topk:ratio=0.05", "ddp0:topk:ratio=0.05", "ddp:qsgd:levels=16",
             "ddpbig:topk:ratio=0.01", "ddp:powersgd:rank=2",
             "opt:none", "opt:topk:ratio=0.05", "opt:qsgd:levels=16", "opt:powersgd:rank=2", "optclip:topk:ratio=0.05"]


@pytest.mark.parametrize("n", [2, 4])
def test_ddp_hook_and_distributed_optimizer(n):
    result = launch(n, os.path.join(WORKERS, "torch_train.py"), *SCENARIOS)
    expect_ok(result, n, "torch")


@pytest.mark.parametrize("case", ["fixed", "varying"])
@pytest.mark.parametrize("fusion", ["default", "off"])
def test_distributed_optimizer_layer_without_gradient_on_one_rank(case, fusion):
    # Same-shaped layers, no bias: a gradient paired with another layer's on the other
    # rank would go unnoticed on the wire; the parameters must equal the reference.
    env = {"GRADCOMM_FUSION_BYTES": "0"} if fusion == "off" else None
    result = launch(2, os.path.join(WORKERS, "torch_optimizer_unused.py"), case, timeout=90, env=env)
    expect_ok(result, 2, "torch-opt-unused")


def test_hook_futures_chain_run_in_issue_order_outlast_a_stall_and_keep_error_class():
    expect_ok(launch(2, os.path.join(WORKERS, "torch_hook_futures.py"), timeout=90), 2, "torch-hook-futures")


def test_hook_futures_complete_in_a_forked_child():
    result = run([PYTHON, os.path.join(WORKERS, "torch_hook_fork.py")], timeout=90)
    expect_ok(result, 1, "torch-hook-fork")


def test_program_end_waits_for_a_hook_future_callback_still_running():
    result = run([PYTHON, os.path.join(WORKERS, "torch_hook_exit.py")], timeout=90)
    expect_ok(result, 1, "torch-hook-exit")
    assert "late callback returned" in result.stdout, result.stdout


def test_auto_through_the_hook_measures_the_overlap_ddp_gives():
    # Backward sleeps between the two buckets: the first is needed that much later, the
    # last at once (the hook's own thread waits on both at once; that must not count).
    expect_ok(launch(2, os.path.join(WORKERS, "torch_hook_overlap.py"), timeout=120), 2, "torch-hook-overlap")


def test_init_before_torch_leaves_master_port_to_torch():
    result = launch(2, os.path.join(WORKERS, "init_order.py"))
    expect_ok(result, 2, "init-order")


def test_torchrun_launch_ddp_hook_uses_torch_store():
    # torch_train.py asserts that gradcomm rendezvous through torch's store (its keys are there).
    result = torchrun(os.path.join(WORKERS, "torch_train.py"), "ddp:topk:ratio=0.05", "opt:qsgd:levels=16")
    expect_ok(result, 2, "torch")


def test_torchrun_c10d_rendezvous_needs_no_port_beside_master_port():
    # torch 1.13's agent (c10d) hands out a released ephemeral MASTER_PORT; MASTER_PORT + 1
    # is reserved by nobody. Rank 0 holds it here: init must not need it.
    result = torchrun(os.path.join(WORKERS, "init_order.py"), "hold-next-port")
    expect_ok(result, 2, "init-order")


@pytest.mark.parametrize("example", ["ddp_hook.py", "distributed_optimizer.py"])
def test_examples_under_gradcomm_run(example):
    result = launch(2, os.path.join(EXAMPLES, example), "--steps", "20")
    assert result.returncode == 0, result.stdout
    assert result.stdout.count("parameters identical on all 2 ranks") == 2, result.stdout


@pytest.mark.parametrize("example", ["numpy_allreduce.py", "distributed_optimizer.py"])
def test_examples_under_torchrun(example):
    result = torchrun(os.path.join(EXAMPLES, example), *([] if example.startswith("numpy") else ["--steps", "20"]))
    assert result.returncode == 0, result.stdout
    assert result.stdout.count("rank 0") >= 1 and result.stdout.count("rank 1") >= 1, result.stdout


def test_hook_state_and_optimizer_reject_bad_arguments():
    from gradcomm.torch import CompressionHookState, DistributedOptimizer
    with pytest.raises(TypeError):
        CompressionHookState(compression=None)
    with pytest.raises(ValueError):
        CompressionHookState(start_iter=-1)
    model = torch.nn.Linear(3, 2)
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(TypeError):
        DistributedOptimizer(object())
    with pytest.raises(ValueError, match="no name"):
        DistributedOptimizer(sgd, named_parameters=[("weight", model.weight)])
    with pytest.raises(ValueError, match="twice"):
        DistributedOptimizer(sgd, named_parameters=[("w", model.weight), ("w", model.bias)])
    opt = DistributedOptimizer(sgd, named_parameters=model.named_parameters())
    assert isinstance(opt, torch.optim.SGD) and type(opt).__name__ == "SGD"


def test_torchrun_command_is_available():
    assert run(torchrun_command() + ["--help"], timeout=60).returncode == 0


def test_bad_specs_are_refused_at_construction():
    # Not at the first compressed step: a typo fails where it is written, naming it.
    import gradcomm
    from gradcomm.torch import CompressionHookState, DistributedOptimizer
    with pytest.raises(gradcomm.InvalidArgument, match=r"CompressionHookState: compression='tpk'.*tpk"):
        CompressionHookState("tpk")
    with pytest.raises(ValueError, match=r"ratio"):
        CompressionHookState("topk:ratio=banana")
    model = torch.nn.Linear(3, 2)
    with pytest.raises(gradcomm.InvalidArgument, match=r"DistributedOptimizer: compression='qsgd:levels=x'"):
        DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), compression="qsgd:levels=x")
    CompressionHookState("topk:ratio=0.01")  # a good one still passes
    CompressionHookState("auto")  # compressor=auto, and its accuracy guard
    with pytest.raises(gradcomm.InvalidArgument, match=r"compression='auto:among=none\|quant:bits=4'.*error feedback"):
        CompressionHookState("auto:among=none|quant:bits=4")


def test_hook_compresses_bfloat16_buckets_as_they_are():
    if int(torch.__version__.split(".")[0]) < 2:
        pytest.skip("torch 1.13's gloo has no bfloat16 (DDP broadcasts the parameters with it)")
    expect_ok(launch(2, os.path.join(WORKERS, "torch_hook_bf16.py"), timeout=90), 2, "torch-hook-bf16")


def test_half_precision_gradients_warn_once_that_they_go_dense():
    import warnings
    from gradcomm import torch as gtorch
    gtorch._warned_dtypes.clear()
    g = torch.zeros(4096, dtype=torch.bfloat16)
    # The codecs and top-k take bfloat16 CPU tensors as they are: compressed, no warning.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not gtorch._dense_only(g, "topk:ratio=0.01", 0, "compression_hook")
        assert not gtorch._dense_only(g, "quant:bits=8", 0, "compression_hook")
    with pytest.warns(UserWarning, match=r"compression_hook: torch.bfloat16 gradients are reduced dense"):
        assert gtorch._dense_only(g, "randomk:ratio=0.01", 0, "compression_hook")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per dtype: no second warning
        assert gtorch._dense_only(g, "randomk:ratio=0.01", 0, "compression_hook")
        assert not gtorch._dense_only(torch.zeros(4096), "topk:ratio=0.01", 0, "compression_hook")
        assert gtorch._dense_only(torch.zeros(4096, dtype=torch.float64), "topk:ratio=0.01", 0, "x")  # no warning
