"""Program (one process, a world of one): the DDP hook's futures across fork(). The
hook's completer threads run in the parent when it forks; in the child, which has
none of them, a new communicator and the hook complete a future with the exact
result (the child's completer is a new one, not the parent's copy, whose threads are
gone), and so does the parent afterwards. Prints 'OK torch-hook-fork rank=0'."""
import faulthandler
import os
import signal
import time
import types

import torch

import gradcomm
from gradcomm.torch import CompressionHookState, compression_hook

faulthandler.dump_traceback_later(60, exit=True)


def bucket(tensor):  # what compression_hook reads of DDP's GradBucket
    return types.SimpleNamespace(buffer=lambda: tensor, is_last=lambda: True)


def hook_once(value):
    """The hook's future over a world of one: the average is the bucket itself."""
    future = compression_hook(CompressionHookState(compression="none"), bucket(torch.full((5,), value)))
    return future.then(lambda f: f.value() + 1).wait()


gradcomm.init(rank=0, world_size=1)
assert torch.equal(hook_once(2.0), torch.full((5,), 3.0))  # the completer's threads run from here on
pid = os.fork()
if pid == 0:
    gradcomm.init(rank=0, world_size=1)
    ok = torch.equal(hook_once(4.0), torch.full((5,), 5.0))
    os._exit(0 if ok else 3)
deadline = time.monotonic() + 20
while not (reaped := os.waitpid(pid, os.WNOHANG))[0]:
    if time.monotonic() > deadline:
        os.kill(pid, signal.SIGKILL)
        raise SystemExit("the child's hook future never completed (its completer was the parent's copy?)")
    time.sleep(0.05)
status = reaped[1]
assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, f"child: {status:#x}"
assert torch.equal(hook_once(6.0), torch.full((5,), 7.0))
gradcomm.shutdown()
print("OK torch-hook-fork rank=0", flush=True)
