"""Builds the `gradcomm` Python package with CMake, for pip.

    pip install --no-build-isolation .                          # configures and builds (~20 min on 2 cores)
    GRADCOMM_BUILD_DIR=build pip install --no-build-isolation .  # reuses a configured build directory

Everything is built by CMake; setuptools only packs the result. The build step
runs `cmake --install <build dir> --prefix <staging dir>` and splits what it
installs in two:
  * the Python package (the directory holding gradcomm/__init__.py: the pybind11
    module _gradcomm, the pure-Python files and whatever else CMake puts in the
    package, e.g. the torch extension) goes where the environment keeps packages;
  * everything else (bin/gradcomm-run, gradcomm-bench, gradcomm-train, the shared
    library, headers, the CMake package config) goes under the environment's
    prefix, as `cmake --install --prefix $VIRTUAL_ENV` would put it: the tools land
    on the venv's PATH, gradcomm-train finds lib/libgradcomm.so.0 through its
    $ORIGIN/../lib rpath, and find_package(gradcomm) works with that prefix.
pip uninstall removes both. The wheel is tagged for this interpreter and platform.

Environment variables:
  GRADCOMM_BUILD_DIR     an existing, configured CMake build directory of this
                         source tree (relative paths are taken from this file's
                         directory). It is brought up to date with `cmake --build`
                         (a no-op when it is) and installed from, as configured: it
                         must have been configured with the Python bindings for an
                         interpreter of this one's version (checked); setuptools'
                         own files go to its pip/ subdirectory. Without it, a fresh
                         build directory is configured in build-pip/temp.*/cmake
                         (kept, so a second install is incremental) with tests OFF,
                         gradcomm-bench but not the other benchmarks, Release.
  GRADCOMM_CMAKE_ARGS    extra arguments for that configure step, split like a
                         shell line, e.g. "-DGRADCOMM_CUDA=OFF" or
                         "-DCMAKE_BUILD_TYPE=RelWithDebInfo" (later -D win). Ignored
                         with GRADCOMM_BUILD_DIR (reconfigure that directory yourself).
  GRADCOMM_BUILD_TARGETS targets to build, space-separated (default: all). Every
                         target that `cmake --install` installs must then be built
                         already.
  GRADCOMM_BUILD_JOBS    parallel build jobs (default: the number of CPUs).

The version is the one in CMakeLists.txt's project(VERSION ...), the single source
that include/gradcomm/version.h and gradcomm.__version__ also come from.
"""
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

from setuptools import Command, Distribution, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.install import install

SOURCE_DIR = Path(__file__).resolve().parent


def project_version():
    """The VERSION of CMakeLists.txt's project() call."""
    text = (SOURCE_DIR / "CMakeLists.txt").read_text()
    match = re.search(r"^\s*project\s*\(\s*gradcomm\b[^)]*?\bVERSION\s+([0-9]+(?:\.[0-9]+)*)", text,
                      re.MULTILINE | re.IGNORECASE)
    if match is None:
        raise RuntimeError(f"setup.py: no `project(gradcomm VERSION x.y.z ...)` in {SOURCE_DIR / 'CMakeLists.txt'}")
    return match.group(1)


def run(command, what):
    print(f"gradcomm setup.py: {what}: {shlex.join(str(c) for c in command)}", flush=True)
    try:
        subprocess.run([str(c) for c in command], check=True)
    except FileNotFoundError:
        raise RuntimeError(f"setup.py: {what}: {command[0]} not found (Debian: scripts/install-deps.sh)") from None
    except subprocess.CalledProcessError as e:
        raise RuntimeError(f"setup.py: {what} failed with exit status {e.returncode}") from None


def cache_entry(build_dir, name):
    """The value of `name` in build_dir/CMakeCache.txt, or None."""
    for line in (build_dir / "CMakeCache.txt").read_text(errors="replace").splitlines():
        if line.startswith(name + ":"):
            return line.split("=", 1)[1] if "=" in line else ""
    return None


def existing_build_dir(value):
    build_dir = Path(value)
    if not build_dir.is_absolute():
        build_dir = SOURCE_DIR / build_dir
    build_dir = build_dir.resolve()
    if not (build_dir / "CMakeCache.txt").is_file():
        raise RuntimeError(f"setup.py: GRADCOMM_BUILD_DIR={value}: {build_dir} has no CMakeCache.txt; configure it "
                           f"first (cmake -S {SOURCE_DIR} -B {build_dir}) or unset GRADCOMM_BUILD_DIR")
    home = cache_entry(build_dir, "CMAKE_HOME_DIRECTORY")
    if home is not None and Path(home).resolve() != SOURCE_DIR:
        raise RuntimeError(f"setup.py: GRADCOMM_BUILD_DIR={value}: {build_dir} was configured for the source tree "
                           f"{home}, not {SOURCE_DIR}")
    if cache_entry(build_dir, "GRADCOMM_PYTHON") == "OFF":
        raise RuntimeError(f"setup.py: GRADCOMM_BUILD_DIR={value}: {build_dir} has GRADCOMM_PYTHON=OFF; reconfigure it "
                           f"with -DGRADCOMM_PYTHON=ON")
    return build_dir


def configure_fresh(build_dir):
    command = ["cmake", "-S", SOURCE_DIR, "-B", build_dir, "-DCMAKE_BUILD_TYPE=Release",
               # gradcomm-bench (README: pip puts it on the venv's PATH), not the developers' benchmarks.
               "-DGRADCOMM_TESTS=OFF", "-DGRADCOMM_BENCH=ON", "-DGRADCOMM_BENCH_EXTRAS=OFF", "-DGRADCOMM_PYTHON=ON",
               f"-DGRADCOMM_PYTHON_EXECUTABLE={sys.executable}"]
    if shutil.which("ninja") and not (build_dir / "CMakeCache.txt").exists():
        command += ["-G", "Ninja"]
    command += shlex.split(os.environ.get("GRADCOMM_CMAKE_ARGS", ""))
    run(command, "configuring")


class BuildWithCMake(build_ext):
    """Builds and stages the CMake install tree, then puts its Python package in
    build_lib (for install_lib) and leaves the rest in the staging directory (for
    install_cmake_prefix)."""

    def run(self):  # instead of compiling extensions: there are none for setuptools
        build_temp = Path(self.build_temp).resolve()
        if os.environ.get("GRADCOMM_BUILD_DIR"):
            build_dir = existing_build_dir(os.environ["GRADCOMM_BUILD_DIR"])
        else:
            build_dir = build_temp / "cmake"
            build_dir.mkdir(parents=True, exist_ok=True)
            configure_fresh(build_dir)

        jobs = os.environ.get("GRADCOMM_BUILD_JOBS") or str(os.cpu_count() or 1)
        command = ["cmake", "--build", build_dir, "-j", jobs]
        targets = os.environ.get("GRADCOMM_BUILD_TARGETS", "").split()
        if targets:
            command += ["--target", *targets]
        run(command, "building")

        stage = build_temp / "gradcomm-stage"
        shutil.rmtree(stage, ignore_errors=True)
        run(["cmake", "--install", build_dir, "--prefix", stage], "staging the install tree")

        package = self._find_package(stage, build_dir)
        report_torch_backend(package)
        target = Path(self.build_lib) / "gradcomm"
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(package, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        shutil.rmtree(package)
        self.distribution.gradcomm_stage = stage

    @staticmethod
    def _find_package(stage, build_dir):
        found = [p.parent for p in stage.rglob("gradcomm/__init__.py")]
        if len(found) != 1:
            raise RuntimeError(f"setup.py: `cmake --install {build_dir}` installed {len(found)} gradcomm Python "
                               f"packages ({', '.join(map(str, found)) or 'none'}); expected one. Was it configured "
                               f"with the Python bindings (GRADCOMM_PYTHON=ON, pybind11, python3-dev)?")
        package = found[0]
        suffix = sysconfig.get_config_var("EXT_SUFFIX")
        if not (package / f"_gradcomm{suffix}").is_file():
            built = sorted(p.name for p in package.glob("_gradcomm.*"))
            raise RuntimeError(f"setup.py: {build_dir} built the module for another interpreter ({built or 'none'}); "
                               f"{sys.executable} needs _gradcomm{suffix}: configure it with "
                               f"-DGRADCOMM_PYTHON_EXECUTABLE={sys.executable}")
        return package


def report_torch_backend(package):
    """One line on the torch.distributed backend: printed, and, when this interpreter
    has a torch that the backend cannot be built against, the install fails with it
    (pip shows a failed build's output; it hides a successful one's unless -v), so a
    torch user never finds out at init_process_group("gradcomm"). Without torch, or
    with GRADCOMM_TORCH_BACKEND=OFF asked for, the package installs without it."""
    status_file = package / "_torch_backend_status.txt"
    status = status_file.read_text().strip() if status_file.is_file() else "unknown (no status recorded)"
    print(f"gradcomm setup.py: torch.distributed backend {status}", flush=True)
    if not status.startswith("OFF") or "GRADCOMM_TORCH_BACKEND=OFF" in status or "cannot import torch" in status:
        return
    why = re.fullmatch(r"OFF \((.*)\)", status)
    raise RuntimeError(f"setup.py: the gradcomm torch.distributed backend cannot be built for {sys.executable}'s "
                       f"torch: {why.group(1) if why else status}. Install a torch it supports (1.13, or >= 2.0 built with "
                       f"the C++11 ABI), or install without the backend: "
                       f"GRADCOMM_CMAKE_ARGS=-DGRADCOMM_TORCH_BACKEND=OFF pip install ...")


class InstallCMakePrefix(Command):
    """Copies the staged install tree (all but the Python package) under the
    environment's data prefix (a venv's root, --prefix's directory; in a wheel, its
    .data/data/), keeping file modes: bin/ stays executable. Symbolic links are
    copied as files (a wheel holds no links)."""

    description = "install gradcomm's CMake install tree (tools, library, headers) under the prefix"
    user_options = []

    def initialize_options(self):
        self.install_dir = None
        self.outputs = []

    def finalize_options(self):
        self.set_undefined_options("install", ("install_data", "install_dir"))

    def run(self):
        self.run_command("build_ext")
        stage = getattr(self.distribution, "gradcomm_stage", None)
        if stage is None:
            raise RuntimeError("setup.py: install_cmake_prefix ran without build_ext staging the install tree")
        for source in sorted(p for p in stage.rglob("*") if p.is_file()):
            destination = Path(self.install_dir) / source.relative_to(stage)
            destination.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, destination)  # follows links: the library under each of its names
            self.outputs.append(str(destination))

    def get_outputs(self):
        return self.outputs


class InstallWithPrefix(install):
    sub_commands = install.sub_commands + [("install_cmake_prefix", lambda self: True)]


class BinaryDistribution(Distribution):
    """The package holds compiled modules: platform wheel, platlib install, and
    build_ext (BuildWithCMake) runs although setuptools sees no extension."""

    def has_ext_modules(self):
        return True


def setuptools_build_base():
    """Where setuptools keeps its own files (build/lib.*, build/temp.*, bdist.*,
    egg-info): inside the CMake build directory when reusing one, else build-pip/;
    never the top of `build/`, which is CMake's directory by convention here."""
    if os.environ.get("GRADCOMM_BUILD_DIR"):
        base = existing_build_dir(os.environ["GRADCOMM_BUILD_DIR"]) / "pip"
    else:
        base = SOURCE_DIR / "build-pip"
    base.mkdir(parents=True, exist_ok=True)
    return str(base)


BUILD_BASE = setuptools_build_base()

setup(
    version=project_version(),
    options={"build": {"build_base": BUILD_BASE}, "egg_info": {"egg_base": BUILD_BASE}},
    distclass=BinaryDistribution,
    packages=[],  # the package comes from CMake's install tree (BuildWithCMake)
    cmdclass={"build_ext": BuildWithCMake, "install": InstallWithPrefix, "install_cmake_prefix": InstallCMakePrefix},
    zip_safe=False,
)
