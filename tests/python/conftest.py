"""Shared helpers: where things are, and launching ranks as real processes."""
import os
import random
import re
import shutil
import socket
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
WORKERS = os.path.join(HERE, "workers")
EXAMPLES = os.path.normpath(os.path.join(HERE, "..", "..", "python_bindings", "examples"))
PYTHON = sys.executable


def gradcomm_run():
    """The built launcher (ctest sets GRADCOMM_RUN); skips the test when absent."""
    path = os.environ.get("GRADCOMM_RUN")
    if not path or not os.access(path, os.X_OK):
        pytest.skip("GRADCOMM_RUN does not name the built gradcomm-run (ctest sets it)")
    return path


def torchrun_command():
    """torchrun, or `python -m torch.distributed.run` for the same interpreter."""
    exe = shutil.which("torchrun")
    if exe:
        with open(exe, "rb") as f:
            first = f.readline()
        # Debian's torchrun runs /usr/bin/python3; only use it when that is us. A venv's
        # python resolves to the same file but imports the venv's torch: not us.
        if (first.startswith(b"#!") and sys.prefix == sys.base_prefix
                and os.path.realpath(first[2:].strip().split()[0].decode()) == os.path.realpath(PYTHON)):
            return [exe]
    return [PYTHON, "-m", "torch.distributed.run"]


def _free_port():
    """A TCP port free on 127.0.0.1 right now, drawn below the kernel's ephemeral range
    (as base/free_port.h does for gradcomm-run): between this check and its use only
    another listener can take it, not the local end of an outgoing connection."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    candidates = [random.randrange(10000, low) for _ in range(64)] if low > 10001 else []
    for port in candidates + [0]:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return s.getsockname()[1]
    raise RuntimeError("no free TCP port on 127.0.0.1")


def torchrun(script, *args, nproc=2, env=None):
    """Runs `script` on nproc local ranks under torchrun; returns the CompletedProcess.

    Not `--standalone`: torch 1.13 fixes its rendezvous at port 29400, so two tests
    (or a user's job) running at once collide ("Address already in use"). A port the
    kernel just handed out can still be taken before torchrun binds it; that case is
    retried, nothing else is."""
    # "--redirects 1 --tee 1": Debian's torch 1.13 on Python 3.11 cannot parse torchrun's
    # default "--redirects 0" (enum.Flag iteration skips 0); this sends stdout to the console.
    for attempt in range(3):
        cmd = torchrun_command() + [
            "--nnodes", "1", "--rdzv_backend", "c10d", "--rdzv_endpoint", f"127.0.0.1:{_free_port()}",
            "--rdzv_id", f"gradcomm-test-{os.getpid()}-{attempt}", f"--nproc_per_node={nproc}",
            "--monitor_interval", "1", "--redirects", "1", "--tee", "1", script, *map(str, args)]
        result = run(cmd, env={"OMP_NUM_THREADS": "1", **(env or {})})
        if result.returncode == 0 or "errno: 98 - Address already in use" not in result.stdout:
            return result
    return result


def run(cmd, timeout=150, env=None):
    full_env = dict(os.environ)
    if env:
        full_env.update(env)
    return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout,
                          env=full_env)


def launch(n, script, *args, timeout=150, env=None):
    """Runs `script` on n ranks under gradcomm-run; returns the CompletedProcess."""
    cmd = [gradcomm_run(), "-n", str(n), "--timeout", str(timeout - 10), "--", PYTHON, script, *map(str, args)]
    return run(cmd, timeout=timeout, env=env)


def ok_ranks(output, tag):
    """The ranks that printed 'OK <tag>' (gradcomm-run prefixes lines with '[rank] ';
    torchrun with 'rank: ' or nothing)."""
    ranks = set()
    for line in output.splitlines():
        m = re.search(r"OK " + re.escape(tag) + r" rank=(\d+)\b", line)
        if m:
            ranks.add(int(m.group(1)))
    return ranks


def expect_ok(result, n, tag):
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout}"
    assert ok_ranks(result.stdout, tag) == set(range(n)), result.stdout
