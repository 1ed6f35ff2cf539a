"""Program (one process, a world of one): the program ends while a DDP hook future's
callback is still running. The callback wakes the main thread and then runs on for
0.5 s; the main thread goes straight to the interpreter's exit. gradcomm.shutdown()
(run at exit) waits for the callback to return: without that wait, the callback's
thread takes the GIL during the interpreter's finalization, which ends that thread
inside torch's code and the process with it ("terminate called without an active
exception", exit -6). Prints 'late callback returned' from the callback, then
'OK torch-hook-exit rank=0' from an atexit handler that runs after gradcomm's."""
import atexit
import faulthandler
import sys
import threading
import time
import types

callback_returned = []


def report_at_exit():
    print("OK torch-hook-exit rank=0" if callback_returned else
          "FAILED: gradcomm.shutdown() at exit returned before the hook future's callback", flush=True)


atexit.register(report_at_exit)  # before gradcomm registers its shutdown(): runs after it (atexit is LIFO)

import torch  # noqa: E402

import gradcomm  # noqa: E402
from gradcomm.torch import CompressionHookState, compression_hook  # noqa: E402

faulthandler.dump_traceback_later(60, exit=True)
# The completion thread can complete the hook's future only with the GIL; with no
# forced switches it gets the GIL only where this thread blocks, so the callback below
# is attached before the future completes (and runs on the completion thread).
sys.setswitchinterval(1000)
gradcomm.init(rank=0, world_size=1)
woken = torch.futures.Future()


def late(f):
    assert threading.current_thread() is not threading.main_thread(), "the callback ran on the main thread"
    woken.set_result(None)  # the main thread goes on to its end from here
    time.sleep(0.5)
    print("late callback returned", flush=True)
    callback_returned.append(True)
    return f.value()


bucket = types.SimpleNamespace(buffer=lambda: torch.ones(5), is_last=lambda: True)
future = compression_hook(CompressionHookState(compression="none"), bucket).then(late)
woken.wait()
print("main thread at its end", flush=True)
