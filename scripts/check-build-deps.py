#!/usr/bin/python3
"""Checks, in about a second, that this machine has what `pip install .` needs to
build gradcomm, before setup.py spends minutes configuring and compiling; names
whatever is missing and the one apt-get line that installs it.

    scripts/check-build-deps.py [--python PYTHON] [--cmake-args "ARGS"]

Exit status 0 when everything is there (one line saying so), 1 when something is
missing (the message on stderr). setup.py runs the same check (find_missing) first.

What is checked is what the CMake configure and build of a pip install require
(CMakeLists.txt, trainer/, bench/, python_bindings/; the Debian names as in
scripts/install-deps.sh, which installs these and what the tests and benchmarks use):
  cmake >= the cmake_minimum_required of CMakeLists.txt      cmake
  C and C++ compilers, the C++ one taking -std=c++20          build-essential
    (span, bit, numbers, concepts); $CXX/$CC when set
  ninja or make                                               ninja-build
  Python.h of the interpreter the module is built for         python3-dev
  pybind11 (pybind11/pybind11.h)                              pybind11-dev
  UCX (ucp/api/ucp.h, libucp.so)                              libucx-dev
  OpenSSL's libcrypto (openssl/evp.h, libcrypto.so)           libssl-dev
  fmt (fmt/core.h, libfmt.so)                                 libfmt-dev
  OpenBLAS (cblas.h, libopenblas.so)                          libopenblas-dev
  zlib (zlib.h, libz.so)                                      zlib1g-dev
  nlohmann-json (nlohmann/json.hpp)                           nlohmann-json3-dev
  CLI11 (CLI/CLI.hpp)                                         libcli11-dev
  torch's C++ headers, only when the interpreter has torch    libtorch-dev (Debian's torch;
    and the backend is not turned off (GRADCOMM_TORCH_BACKEND)  a pip torch ships them)
  nvcc, only with -DGRADCOMM_CUDA=ON                          (NVIDIA's CUDA toolkit)
numpy and torch themselves are not build requirements: without torch the package
installs without the torch.distributed backend, and numpy is imported only by callers.

Headers are looked for where the C++ compiler looks (its `-v` search list, so CPATH
and CPLUS_INCLUDE_PATH count) and under CMAKE_PREFIX_PATH (the environment variable
or -DCMAKE_PREFIX_PATH=... in the CMake arguments); libraries in the compiler's
library search list (LIBRARY_PATH counts) and under CMAKE_PREFIX_PATH. The check
errs on the side of letting the build try: a package CMake finds some other way
(e.g. ucx_DIR) can be let through with GRADCOMM_SKIP_DEPS_CHECK=1 (setup.py).
"""
import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple, Optional

SOURCE_DIR = Path(__file__).resolve().parent.parent

# What a compiler that "speaks C++20" must compile: the C++20 headers the code uses.
CXX20_PROBE = """
#include <bit>
#include <concepts>
#include <numbers>
#include <span>
template <std::integral T> int bits(std::span<const T> s) { return std::popcount(unsigned(s.size())); }
constexpr double kPi = std::numbers::pi;
"""


class Missing(NamedTuple):
    what: str               # "UCX (ucp/api/ucp.h, libucp.so)"
    why: str                # "no ucp/api/ucp.h"
    package: Optional[str]  # the Debian package, or None when there is none to name


def cmake_minimum_version(source_dir=SOURCE_DIR):
    text = (source_dir / "CMakeLists.txt").read_text()
    match = re.search(r"cmake_minimum_required\s*\(\s*VERSION\s+([0-9.]+)", text, re.IGNORECASE)
    return match.group(1) if match else "3.25"


def version_tuple(text):
    return tuple(int(p) for p in re.findall(r"[0-9]+", text)[:3])


def cmake_define(cmake_args, name):
    """The value of -D<name>[:TYPE]=value in cmake_args (the last one wins), or None."""
    value = None
    for arg in cmake_args:
        match = re.fullmatch(rf"-D{re.escape(name)}(?::[A-Za-z]+)?=(.*)", arg)
        if match:
            value = match.group(1)
    return value


def outside_pip_build_env(env):
    """env without what pip's build isolation put there to hide the environment being
    installed into (PYTHONPATH = its temporary site directory with a sitecustomize.py
    that drops the site-packages, PYTHONNOUSERSITE): the interpreter then sees the
    torch the module will be loaded next to. pip had replaced PYTHONPATH; the user's
    own PYTHONPATH is not recoverable, so it is left empty."""
    env = dict(env)
    kept = [p for p in env.get("PYTHONPATH", "").split(os.pathsep)
            if p and not ("pip-build-env-" in p and (Path(p) / "sitecustomize.py").is_file())]
    if kept != [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]:
        if kept:
            env["PYTHONPATH"] = os.pathsep.join(kept)
        else:
            env.pop("PYTHONPATH", None)
        env.pop("PYTHONNOUSERSITE", None)
    return env


class Probe:
    """What the build would find on this machine. The search lists can be given
    instead of asked for (tests)."""

    def __init__(self, env=None, cmake_args=(), include_dirs=None, library_dirs=None):
        self.env = dict(os.environ if env is None else env)
        self.cmake_args = list(cmake_args)
        prefixes = self.env.get("CMAKE_PREFIX_PATH", "").split(os.pathsep)
        prefixes += (cmake_define(self.cmake_args, "CMAKE_PREFIX_PATH") or "").split(";")
        self.prefixes = [Path(p) for p in prefixes if p]
        self.cxx = self._compiler("CXX", ["c++", "g++", "clang++"])
        self.cc = self._compiler("CC", ["cc", "gcc", "clang"])
        self.cxx20_error = None
        compiler_includes = []
        if self.cxx:
            self.cxx20_error, compiler_includes = self._compile_cxx20()
        self.include_dirs = include_dirs if include_dirs is not None else (
            compiler_includes + [p / "include" for p in self.prefixes]
            + [Path("/usr/local/include"), Path(f"/usr/include/{self._multiarch()}"), Path("/usr/include")])
        self.library_dirs = library_dirs if library_dirs is not None else (
            self._compiler_library_dirs()
            + [p / d for p in self.prefixes for d in ("lib", "lib64", f"lib/{self._multiarch()}")])

    def which(self, name):
        return shutil.which(name, path=self.env.get("PATH", os.defpath))

    def _compiler(self, variable, names):
        chosen = shlex.split(self.env.get(variable, ""))
        if chosen:
            return chosen[0] if self.which(chosen[0]) or os.access(chosen[0], os.X_OK) else None
        return next((n for n in names if self.which(n)), None)

    def _run(self, command, stdin=""):
        try:
            return subprocess.run(command, input=stdin, capture_output=True, text=True, env=self.env, timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            return None

    def _compile_cxx20(self):
        """(None or the compiler's first error, the compiler's #include <...> search list)."""
        done = self._run([self.cxx, "-std=c++20", "-fsyntax-only", "-v", "-x", "c++", "-"], CXX20_PROBE)
        if done is None:
            return f"{self.cxx} did not run", []
        dirs, listing = [], False
        for line in done.stderr.splitlines():
            if line.startswith("#include <...> search starts here"):
                listing = True
            elif line.startswith("End of search list"):
                listing = False
            elif listing:
                dirs.append(Path(line.strip().split(" (framework")[0]))
        if done.returncode != 0:
            errors = [l for l in done.stderr.splitlines() if "error" in l.lower()]
            return (errors[0].strip() if errors else f"exit status {done.returncode}"), dirs
        return None, dirs

    def _multiarch(self):
        done = self._run([self.cxx or "cc", "-print-multiarch"]) if self.cxx else None
        return done.stdout.strip() if done and done.returncode == 0 and done.stdout.strip() else "x86_64-linux-gnu"

    def _compiler_library_dirs(self):
        done = self._run([self.cxx, "-print-search-dirs"]) if self.cxx else None
        if done and done.returncode == 0:
            for line in done.stdout.splitlines():
                if line.startswith("libraries: ="):
                    return [Path(p) for p in line[len("libraries: ="):].split(os.pathsep) if p]
        arch = self._multiarch()
        return [Path(p) for p in (f"/usr/local/lib/{arch}", "/usr/local/lib", f"/usr/lib/{arch}", "/usr/lib")]

    def header(self, name):
        return next((d / name for d in self.include_dirs if (d / name).is_file()), None)

    def library(self, name):
        return next((d / name for d in self.library_dirs if (d / name).exists()), None)

    def tool_version(self, tool):
        done = self._run([tool, "--version"])
        return done.stdout.splitlines()[0] if done and done.returncode == 0 and done.stdout else ""

    def python_facts(self, python):
        """(its version "3.11", the directory of its Python.h, where it finds torch or None),
        asked outside pip's build environment; None when it does not run."""
        ask = ("import importlib.util as u, sys, sysconfig; s = u.find_spec('torch'); "
               "print(f'{sys.version_info[0]}.{sys.version_info[1]}'); print(sysconfig.get_paths()['include']); "
               "print(list(s.submodule_search_locations)[0] if s and s.submodule_search_locations else '')")
        try:
            done = subprocess.run([python, "-c", ask], capture_output=True, text=True, timeout=60,
                                  env=outside_pip_build_env(self.env))
        except (OSError, subprocess.TimeoutExpired):
            return None
        lines = done.stdout.split("\n")
        if done.returncode != 0 or len(lines) < 3:
            return None
        return lines[0], Path(lines[1]), Path(lines[2]) if lines[2] else None


# (what, Debian package, headers, libraries): found when every header and library is.
LIBRARIES = [
    ("UCX", "libucx-dev", ["ucp/api/ucp.h"], ["libucp.so", "libucs.so"]),
    ("OpenSSL's libcrypto", "libssl-dev", ["openssl/evp.h"], ["libcrypto.so"]),
    ("fmt", "libfmt-dev", ["fmt/core.h"], ["libfmt.so"]),
    ("OpenBLAS", "libopenblas-dev", ["cblas.h"], ["libopenblas.so"]),
    ("zlib", "zlib1g-dev", ["zlib.h"], ["libz.so"]),
    ("nlohmann-json", "nlohmann-json3-dev", ["nlohmann/json.hpp"], []),
    ("CLI11", "libcli11-dev", ["CLI/CLI.hpp"], []),
    ("pybind11", "pybind11-dev", ["pybind11/pybind11.h"], []),
]


def find_missing(python=sys.executable, cmake_args=(), probe=None):
    """[Missing] for what the pip build needs and this machine lacks; [] when all is there."""
    probe = probe or Probe(cmake_args=cmake_args)
    missing = []

    cmake = probe.which("cmake")
    minimum = cmake_minimum_version()
    if not cmake:
        missing.append(Missing(f"cmake >= {minimum}", "not on PATH", "cmake"))
    else:
        found = probe.tool_version(cmake)
        if version_tuple(found) < version_tuple(minimum):
            missing.append(Missing(f"cmake >= {minimum}", f"{cmake} is {found or 'of unknown version'}", "cmake"))

    if not probe.cxx:
        why = f"CXX={probe.env['CXX']} not found" if probe.env.get("CXX") else "no c++, g++ or clang++ on PATH"
        missing.append(Missing("a C++20 compiler", why, "build-essential"))
    elif probe.cxx20_error:
        missing.append(Missing("a C++20 compiler", f"{probe.cxx} -std=c++20: {probe.cxx20_error}", "build-essential"))
    if not probe.cc:
        why = f"CC={probe.env['CC']} not found" if probe.env.get("CC") else "no cc, gcc or clang on PATH"
        missing.append(Missing("a C compiler", why, "build-essential"))
    if not (probe.which("ninja") or probe.which("make")):
        missing.append(Missing("a build tool (ninja or make)", "neither on PATH", "ninja-build"))

    facts = probe.python_facts(python)
    if facts is None:
        missing.append(Missing(f"the interpreter {python}", "it does not run", None))
        version, python_include, torch_dir = None, None, None
    else:
        version, python_include, torch_dir = facts
        python_include = python_include / "Python.h"
    if python_include and not python_include.is_file():
        debian_default = Path("/usr/bin/python3").resolve().name == f"python{version}"
        missing.append(Missing(f"Python {version}'s headers (Python.h)", f"no {python_include}",
                               "python3-dev" if debian_default else f"python{version}-dev"))

    for what, package, headers, libraries in LIBRARIES:
        lacking = [h for h in headers if not probe.header(h)] + [l for l in libraries if not probe.library(l)]
        if lacking:
            missing.append(Missing(f"{what} ({', '.join(headers + libraries)})",
                                   "no " + ", no ".join(lacking), package))

    if (cmake_define(probe.cmake_args, "GRADCOMM_TORCH_BACKEND") or "AUTO").upper() != "OFF":
        work = Path("torch/csrc/distributed/c10d/Work.hpp")
        if torch_dir and not (torch_dir / "include" / work).is_file():
            debian = str(torch_dir).startswith("/usr/lib/python3/dist-packages/")
            missing.append(Missing(
                "torch's C++ headers (for the torch.distributed backend; "
                "or GRADCOMM_CMAKE_ARGS=-DGRADCOMM_TORCH_BACKEND=OFF)",
                f"no {torch_dir / 'include' / work}",
                "libtorch-dev" if debian else None))

    if (cmake_define(probe.cmake_args, "GRADCOMM_CUDA") or "").upper() == "ON":
        nvcc = cmake_define(probe.cmake_args, "CMAKE_CUDA_COMPILER") or probe.which("nvcc") or (
            "/usr/local/cuda/bin/nvcc" if os.access("/usr/local/cuda/bin/nvcc", os.X_OK) else None)
        if not nvcc:
            missing.append(Missing("nvcc (GRADCOMM_CUDA=ON)", "not on PATH nor in /usr/local/cuda/bin",
                                   None))
    return missing


def message(missing):
    """The one message for a non-empty find_missing(): each, then the apt-get line."""
    packages = list(dict.fromkeys(m.package for m in missing if m.package))
    width = max(len(m.what) for m in missing)
    debian = [f"(Debian: {m.package})" if m.package else "" for m in missing]
    debian_width = max(len(d) for d in debian)
    lines = [f"gradcomm: cannot build: {len(missing)} build requirement{'s' if len(missing) > 1 else ''} "
             f"missing (checked before compiling anything):"]
    for m, d in zip(missing, debian):
        lines.append(f"  {m.what:<{width}}  {d:<{debian_width}}  {m.why}")
    if packages:
        sudo = "sudo " if hasattr(os, "geteuid") and os.geteuid() != 0 else ""
        lines += ["gradcomm: install them with",
                  f"    {sudo}apt-get install {' '.join(packages)}",
                  "  or everything this project uses (tests, benchmarks, fuzzing too): "
                  f"{SOURCE_DIR / 'scripts' / 'install-deps.sh'}"]
    lines.append("  then run pip install again (GRADCOMM_SKIP_DEPS_CHECK=1 skips this check).")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", default=sys.executable, help="the interpreter the module is for")
    parser.add_argument("--cmake-args", default=os.environ.get("GRADCOMM_CMAKE_ARGS", ""),
                        help="the extra CMake arguments (default: $GRADCOMM_CMAKE_ARGS)")
    args = parser.parse_args(argv)
    missing = find_missing(args.python, shlex.split(args.cmake_args))
    if missing:
        print(message(missing), file=sys.stderr)
        return 1
    print("gradcomm: every build requirement is there")
    return 0


if __name__ == "__main__":
    sys.exit(main())
