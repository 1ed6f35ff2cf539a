"""What `pip install .` does before it compiles anything, without a build (seconds):
the build-requirement check (scripts/check-build-deps.py) names each missing package
and the apt-get line; pip's build isolation is undone for CMake's questions to the
interpreter; setup.py's phase lines, on stderr and on a terminal shared with pip's
spinner. The whole install is packaging.pip_install (scripts/check-pip-install.sh)."""
import importlib.util
import io
import os
import sys
from pathlib import Path

import pytest

SOURCE = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def deps():
    spec = importlib.util.spec_from_file_location("check_build_deps", SOURCE / "scripts" / "check-build-deps.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def setup_py():
    """setup.py's definitions, without its setup() call (as tests/packaging/test_torch_refusal.sh)."""
    text = (SOURCE / "setup.py").read_text()
    namespace = {"__file__": str(SOURCE / "setup.py"), "__name__": "setup_under_test"}
    exec(compile(text[:text.index("BUILD_BASE = setuptools_build_base()")], "setup.py", "exec"), namespace)
    return namespace


def executable(path, text):
    path.write_text(text)
    path.chmod(0o755)
    return path


def test_this_machine_has_every_requirement(deps):
    # The machine that built these bindings: a complaint here is the check being wrong.
    assert deps.find_missing(sys.executable) == []


def test_everything_missing_is_named_with_its_package(deps, tmp_path):
    probe = deps.Probe(env={"PATH": str(tmp_path)}, include_dirs=[], library_dirs=[])
    missing = deps.find_missing(sys.executable, probe=probe)
    assert [m.package for m in missing] == [
        "cmake", "build-essential", "build-essential", "ninja-build", "libucx-dev", "libssl-dev", "libfmt-dev",
        "libopenblas-dev", "zlib1g-dev", "nlohmann-json3-dev", "libcli11-dev", "pybind11-dev"]
    text = deps.message(missing)
    assert text.startswith("gradcomm: cannot build: 12 build requirements missing")
    assert ("apt-get install cmake build-essential ninja-build libucx-dev libssl-dev libfmt-dev libopenblas-dev "
            "zlib1g-dev nlohmann-json3-dev libcli11-dev pybind11-dev\n") in text
    assert "scripts/install-deps.sh" in text and "GRADCOMM_SKIP_DEPS_CHECK=1" in text
    assert "no ucp/api/ucp.h, no libucp.so, no libucs.so" in text


def test_old_cmake_and_a_compiler_without_cxx20(deps, tmp_path):
    executable(tmp_path / "cmake", "#!/bin/sh\necho 'cmake version 3.20.4'\n")
    executable(tmp_path / "ninja", "#!/bin/sh\n")
    cxx = executable(tmp_path / "old-g++", "#!/bin/sh\necho \"cc1plus: error: unrecognized command-line option "
                                           "'-std=c++20'\" >&2\nexit 1\n")
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin", "CXX": str(cxx)}
    missing = {m.what: m for m in deps.find_missing(sys.executable, probe=deps.Probe(env=env))}
    assert missing["cmake >= 3.25"].why == f"{tmp_path}/cmake is cmake version 3.20.4"
    assert "unrecognized command-line option '-std=c++20'" in missing["a C++20 compiler"].why


def test_torch_without_headers_unless_the_backend_is_off(deps, tmp_path):
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text("raise ImportError('found, never imported')\n")
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    missing = deps.find_missing(sys.executable, probe=deps.Probe(env=env))
    assert [m.why for m in missing] == [f"no {tmp_path}/torch/include/torch/csrc/distributed/c10d/Work.hpp"]
    assert missing[0].package is None  # not Debian's torch: no package to name
    assert "GRADCOMM_TORCH_BACKEND=OFF" in missing[0].what
    off = deps.Probe(env=env, cmake_args=["-DGRADCOMM_TORCH_BACKEND=OFF"])
    assert deps.find_missing(sys.executable, probe=off) == []


def test_pip_build_isolation_is_undone_for_the_interpreter(deps, tmp_path):
    site = tmp_path / "pip-build-env-x1y2" / "site"
    site.mkdir(parents=True)
    (site / "sitecustomize.py").write_text("")
    env = {"PATH": "/usr/bin", "PYTHONPATH": str(site), "PYTHONNOUSERSITE": "1"}
    assert deps.outside_pip_build_env(env) == {"PATH": "/usr/bin"}
    mine = {"PYTHONPATH": "/opt/mine", "PYTHONNOUSERSITE": "1"}
    assert deps.outside_pip_build_env(mine) == mine


def test_phase_lines_on_stderr(setup_py, monkeypatch, capsys):
    monkeypatch.setenv("GRADCOMM_PIP_TTY", "0")
    progress = setup_py["Progress"]()
    assert progress.tty is None
    with progress.phase("configure") as phase:
        phase.notes.append("Ninja, Release, CUDA OFF")
    with pytest.raises(RuntimeError):
        with progress.phase("C++ library and tools"):
            raise RuntimeError("compiler crashed")
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].startswith("gradcomm: configure ... ") and lines[0].endswith(" s (Ninja, Release, CUDA OFF)")
    assert lines[1].startswith("gradcomm: C++ library and tools ... failed after ")
    assert [setup_py["minutes"](s) for s in (0.42, 12.4, 361)] == ["0.4 s", "12 s", "6 min 1 s"]


def render(data):
    """The screen lines a terminal shows for data (\\b, \\n only)."""
    lines, line, col = [], [], 0
    for ch in data:
        if ch == "\n":
            lines.append("".join(line).rstrip())
            line, col = [], 0
        elif ch == "\b":
            col = max(col - 1, 0)
        else:
            line[col:col + 1] = [ch] if col < len(line) else [" "] * (col - len(line)) + [ch]
            col += 1
    return lines + ["".join(line).rstrip()]


def test_phase_lines_share_the_terminal_with_pips_spinner(setup_py, monkeypatch):
    """On pip's spinner line each phase is written where pip's spinner ("\\b \\b" and one
    character, cli/spinners.py) keeps turning after it, and pip's "done" ends the last."""
    monkeypatch.setenv("GRADCOMM_PIP_TTY", "0")
    progress = setup_py["Progress"]()
    read, write = os.pipe()
    progress.tty, progress.spinner, progress.width = write, True, 80
    screen = io.StringIO("  Building wheel for gradcomm (pyproject.toml) ... -")

    def spin(char):
        os.write(write, f"\b \b{char}".encode())

    progress.line("the build takes 5 to 10 min on 2 cores; full log: pip install -v .")
    spin("\\")
    with progress.phase("configure") as phase:
        spin("|")
        spin("/")
        phase.notes.append("Ninja, Release, CUDA OFF")
    with progress.phase("a phase whose name is far too long to fit the eighty columns of this terminal"):
        spin("-")
    progress.handing_over()
    spin("|")
    os.write(write, b"\b \bdone\n")
    os.close(write)
    with os.fdopen(read) as f:
        screen.seek(0, io.SEEK_END)
        screen.write(f.read())
    lines = render(screen.getvalue())
    assert lines[0] == "  Building wheel for gradcomm (pyproject.toml) ..."
    assert lines[1] == "gradcomm: the build takes 5 to 10 min on 2 cores; full log: pip install -v ."
    assert lines[2].startswith("gradcomm: configure ... ") and lines[2].endswith(" s (Ninja, Release, CUDA OFF)")
    assert lines[3].startswith("gradcomm: a phase whose name is far too long to fit the eight... ")
    assert lines[3].endswith(" s") and len(lines[3]) < 80  # cut, so that it never wraps under the spinner
    assert lines[4].startswith("gradcomm: built in ") and lines[4].endswith("; the wheel goes to pip ... done")
    assert lines[5:] == [""]
