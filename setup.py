"""Builds the `gradcomm` Python package with CMake, for pip.

    pip install .                                               # configures and builds (5-10 min on 2 cores)
    pip install --no-build-isolation .                          # the same with this machine's setuptools
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

What pip shows. Before configuring, the build requirements are checked
(scripts/check-build-deps.py: cmake, compilers, UCX, fmt, OpenBLAS, pybind11, ...):
when some are missing the install stops at once with one message naming them and
the apt-get line. Then one line per phase, each with its time: the requirements,
configure, the C++ library and tools, the Python module and the torch backend (ON or
OFF, and why), install (cmake --install, the wheel), after a first line giving the
expected total and how to see the whole log (pip install -v .). pip hides what a
build backend prints unless -v is given or the build fails, so the lines also go
to the terminal (class Progress says when and how).

pip's build isolation (plain `pip install .`) hides the environment being
installed into from the build; CMake's questions to the interpreter (its torch,
for the torch backend) are asked outside it, so the backend is built against the
torch the module will be loaded next to, as with --no-build-isolation.

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
  GRADCOMM_SKIP_DEPS_CHECK=1  skips the check of the build requirements (for a
                         package CMake finds where the check does not look; the
                         check is skipped anyway with GRADCOMM_BUILD_DIR).
  GRADCOMM_PIP_TTY       0: never write the phase lines to the terminal (stderr
                         only); 1: always, as whole lines, when there is one.

The version is the one in CMakeLists.txt's project(VERSION ...), the single source
that include/gradcomm/version.h and gradcomm.__version__ also come from.
"""
import importlib.util
import os
import re
import shlex
import shutil
import stat
import subprocess
import sys
import sysconfig
import time
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


def build_deps():
    """scripts/check-build-deps.py as a module (its find_missing, message and
    outside_pip_build_env), or None when the source tree lacks it."""
    if not (SOURCE_DIR / "scripts" / "check-build-deps.py").is_file():
        return None
    spec = importlib.util.spec_from_file_location("gradcomm_check_build_deps",
                                                  SOURCE_DIR / "scripts" / "check-build-deps.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run(command, what, env=None):
    """Runs command, its output passed on to ours (pip shows it with -v); returns
    its lines that start with "-- gradcomm: " (CMake's own summary lines)."""
    print(f"gradcomm setup.py: {what}: {shlex.join(str(c) for c in command)}", flush=True)
    summary = []
    try:
        with subprocess.Popen([str(c) for c in command], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              env=env, text=True, errors="replace") as process:
            for line in process.stdout:
                sys.stdout.write(line)
                sys.stdout.flush()
                if line.startswith("-- gradcomm: "):
                    summary.append(line[len("-- "):].rstrip())
    except FileNotFoundError:
        raise RuntimeError(f"setup.py: {what}: {command[0]} not found (Debian: scripts/install-deps.sh)") from None
    if process.returncode != 0:
        raise RuntimeError(f"setup.py: {what} failed with exit status {process.returncode}")
    return summary


def minutes(seconds):
    """12.3 -> "12 s", 361 -> "6 min 1 s"."""
    if seconds < 10:
        return f"{seconds:.1f} s"
    seconds = round(seconds)
    return f"{seconds // 60} min {seconds % 60} s" if seconds >= 60 else f"{seconds} s"


class Progress:
    """The lines "gradcomm: <phase> ... <time and result>" of a pip install.

    pip runs the build backend in a subprocess and reads its stdout and stderr
    through one pipe; it shows them only with -v or when the build fails, and
    meanwhile draws a spinner on its own stdout ("Building wheel for gradcomm
    (pyproject.toml) ... |"), turning it one step per line it reads (pip 23:
    pip/_internal/utils/subprocess.py call_subprocess, cli/spinners.py). pip
    forwards nothing else. So each line goes
      * to stderr, always: pip -v, pip's --log and a failed build's report keep it;
      * and to the terminal, /dev/tty, when pip would show nothing of it there:
        when our parent is pip, pip's stdout or stderr is our controlling terminal,
        and pip's command line (or PIP_VERBOSE / PIP_QUIET) asks for neither -v
        (pip shows stderr itself) nor -q (quiet was asked for).
    When pip's stdout is that terminal its spinner is there, at the end of the
    current line: a phase is then written as pip writes its own steps, its name
    ("gradcomm: configure ... ") when it starts, with pip's spinner turning after
    it, its time when it ends ("31 s (Ninja, Release, CUDA ON)"), and pip's "done"
    ends the last line. Every write leaves the cursor just after a one-character
    slot, which is what pip's spinner overwrites ("\\b \\b|"). Lines are cut to
    the terminal's width, so no line wraps under the spinner. Otherwise (pip's
    stdout redirected, `pip install . | tee log`), whole lines. No terminal (CI,
    ssh without -t), or anything unexpected: stderr only, silently.
    GRADCOMM_PIP_TTY=0 never writes to the terminal; 1 always does, whole lines."""

    def __init__(self):
        self.started = time.monotonic()
        self.tty, self.spinner = self._terminal()
        self.width = 0
        if self.tty is not None:
            try:
                self.width = os.get_terminal_size(self.tty).columns
            except OSError:
                pass
        self.width = self.width or 200  # a terminal of unknown size (0 columns: script(1) without one)
        self.head = None  # what start() wrote on the terminal for the open phase
        if self.spinner:
            # Let pip read the lines printed so far and draw its spinner once, so
            # the slot is there before the first write.
            sys.stdout.flush()
            time.sleep(0.3)

    @staticmethod
    def _terminal():
        """(a descriptor of /dev/tty or None, whether pip's spinner shares it)."""
        setting = os.environ.get("GRADCOMM_PIP_TTY", "")
        if setting == "0" or sys.stderr.isatty():  # stderr is already on the terminal
            return None, False
        try:
            tty = os.open("/dev/tty", os.O_WRONLY | os.O_NOCTTY)
        except OSError:
            return None, False
        if setting == "1":
            return tty, False
        try:
            parent = f"/proc/{os.getppid()}"
            args = Path(parent, "cmdline").read_bytes().decode(errors="replace").split("\0")
            # Our controlling terminal: field tty_nr of /proc/self/stat, after the command name.
            tty_nr = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[4])
            terminal = os.makedev((tty_nr >> 8) & 0xFFF, (tty_nr & 0xFF) | ((tty_nr >> 12) & 0xFFF00))
            on_terminal = []
            for fd in (1, 2):
                st = os.stat(f"{parent}/fd/{fd}")
                on_terminal.append(stat.S_ISCHR(st.st_mode) and st.st_rdev == terminal)
        except (OSError, ValueError, IndexError):
            os.close(tty)
            return None, False
        is_pip = any(re.fullmatch(r"pip[0-9.]*", Path(a).name) for a in args) or any(
            a == "-m" and b == "pip" for a, b in zip(args, args[1:]))
        verbosity = 0
        for arg in args[:args.index("--")] if "--" in args else args:
            if re.fullmatch(r"-v+|-q+", arg):
                verbosity += len(arg) - 1 if arg[1] == "v" else 1 - len(arg)
            verbosity += {"--verbose": 1, "--quiet": -1}.get(arg, 0)
        for name, sign in (("PIP_VERBOSE", 1), ("PIP_QUIET", -1)):
            value = os.environ.get(name, "").strip().lower()
            if value:
                verbosity += sign * (int(value) if value.isdigit() else int(value in ("true", "yes", "on")))
        if not is_pip or verbosity != 0 or not any(on_terminal):
            os.close(tty)
            return None, False
        return tty, on_terminal[0]

    def _to_terminal(self, text):
        try:
            os.write(self.tty, text.encode(errors="replace"))
        except OSError:
            self.tty = None

    def _fit(self, text, room):
        return text if len(text) <= room else text[:max(room - 3, 0)] + "..."

    def line(self, text):
        """One whole line, "gradcomm: text"."""
        print(f"gradcomm: {text}", file=sys.stderr, flush=True)
        if self.tty is None:
            return
        text = self._fit(f"gradcomm: {text}", self.width - 3)
        if self.spinner:
            # Blank the slot, a new line, the text and a slot after it: pip's
            # spinner turns at its end until the next line or phase.
            self._to_terminal(f"\b \n{text}  ")
        else:
            self._to_terminal(text + "\n")

    def start(self, what):
        """A phase begins: on pip's spinner line, its name and " ... "."""
        self.head = f"gradcomm: {what} ..."
        if self.tty is not None and self.spinner:
            self.head = self._fit(self.head, self.width - 16)
            self._to_terminal(f"\b \n{self.head}  ")

    def finish(self, what, result):
        """The phase ends: its whole line on stderr; on the terminal, the result after
        start()'s name (spinner) or the whole line."""
        print(f"gradcomm: {what} ... {result}", file=sys.stderr, flush=True)
        if self.tty is not None:
            if self.spinner:
                self._to_terminal("\b" + self._fit(result, self.width - len(self.head) - 4) + "  ")
            else:
                self._to_terminal(self._fit(f"gradcomm: {what} ... {result}", self.width - 3) + "\n")
        self.head = None

    class Phase:
        def __init__(self, progress, what):
            self.progress, self.what, self.notes = progress, what, []

        def __enter__(self):
            self.begun = time.monotonic()
            self.progress.start(self.what)
            return self

        def __exit__(self, kind, error, trace):
            took = minutes(time.monotonic() - self.begun)
            if kind is None:
                notes = "; ".join(self.notes)
                self.progress.finish(self.what, took + (f" ({notes})" if notes else ""))
            else:
                self.progress.finish(self.what, f"failed after {took}")
            return False

    def phase(self, what):
        """with progress.phase("configure") as p: ...; p.notes.append("Ninja")"""
        return Progress.Phase(self, what)

    def handing_over(self):
        """The last line, left open on pip's spinner line for pip's own "done"."""
        total = minutes(time.monotonic() - self.started)
        if self.tty is not None and self.spinner:
            print(f"gradcomm: built in {total}; the wheel goes to pip", file=sys.stderr, flush=True)
            self.start(f"built in {total}; the wheel goes to pip")
        else:
            self.line(f"built in {total}; the wheel goes to pip")


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


def configure_fresh(build_dir, env):
    command = ["cmake", "-S", SOURCE_DIR, "-B", build_dir, "-DCMAKE_BUILD_TYPE=Release",
               # gradcomm-bench (README: pip puts it on the venv's PATH), not the developers' benchmarks.
               "-DGRADCOMM_TESTS=OFF", "-DGRADCOMM_BENCH=ON", "-DGRADCOMM_BENCH_EXTRAS=OFF", "-DGRADCOMM_PYTHON=ON",
               f"-DGRADCOMM_PYTHON_EXECUTABLE={sys.executable}"]
    if shutil.which("ninja") and not (build_dir / "CMakeCache.txt").exists():
        command += ["-G", "Ninja"]
    command += shlex.split(os.environ.get("GRADCOMM_CMAKE_ARGS", ""))
    return run(command, "configuring", env)


# The whole build, said by the first line of a pip install: `pip install .` of a fresh
# clone built in 6 min 4 s on 2 cores shared with a CI build (Release, CUDA ON with
# nvcc 13 for sm_90, torch backend ON; 2026-11-29).
EXPECTED_BUILD = "5 to 10 min on 2 cores"


def existing_targets(build_dir):
    """The targets a configured build directory has (Ninja or Makefiles; else none)."""
    if "Ninja" in (cache_entry(build_dir, "CMAKE_GENERATOR") or ""):
        rules, pattern = build_dir / "build.ninja", r"^build ([^:\s]+):"
    else:
        rules, pattern = build_dir / "Makefile", r"^([A-Za-z0-9_.+-]+):"
    return set(re.findall(pattern, rules.read_text(errors="replace"), re.MULTILINE)) if rules.is_file() else set()


class BuildWithCMake(build_ext):
    """Builds and stages the CMake install tree, then puts its Python package in
    build_lib (for install_lib) and leaves the rest in the staging directory (for
    install_cmake_prefix); says what it does, phase by phase (Progress)."""

    def run(self):  # instead of compiling extensions: there are none for setuptools
        progress = self.distribution.gradcomm_progress = Progress()
        build_temp = Path(self.build_temp).resolve()
        reuse = os.environ.get("GRADCOMM_BUILD_DIR")
        build_dir = existing_build_dir(reuse) if reuse else build_temp / "cmake"
        jobs = os.environ.get("GRADCOMM_BUILD_JOBS") or str(os.cpu_count() or 1)
        if reuse or (build_dir / "CMakeCache.txt").is_file():
            where = os.path.relpath(build_dir, SOURCE_DIR) if SOURCE_DIR in build_dir.parents else build_dir
            progress.line(f"building only what changed; full log: pip install -v .; from scratch {EXPECTED_BUILD}; "
                          f"in {where}")
        else:  # 77 columns: the whole line on an 80-column terminal
            progress.line(f"the build takes {EXPECTED_BUILD}; full log: pip install -v .")
        deps = build_deps()
        env = deps.outside_pip_build_env(os.environ) if deps else None

        if deps and not reuse and os.environ.get("GRADCOMM_SKIP_DEPS_CHECK") != "1":
            with progress.phase("build requirements") as phase:
                missing = deps.find_missing(sys.executable, shlex.split(os.environ.get("GRADCOMM_CMAKE_ARGS", "")))
                if missing:
                    phase.notes.append(f"{len(missing)} missing")
                else:
                    phase.notes.append("all there")
            if missing:
                print(deps.message(missing), file=sys.stderr, flush=True)
                raise SystemExit(1)

        if not reuse:
            build_dir.mkdir(parents=True, exist_ok=True)
            with progress.phase("configure") as phase:
                summary = configure_fresh(build_dir, env)
                cuda = next((line.split("CUDA ", 1)[1] for line in summary if line.startswith("gradcomm: CUDA ")), "?")
                phase.notes.append(f"{cache_entry(build_dir, 'CMAKE_GENERATOR')}, "
                                   f"{cache_entry(build_dir, 'CMAKE_BUILD_TYPE')}, CUDA {cuda}")
        backend = report_torch_backend(build_dir / "python" / "gradcomm")  # refuses an unusable torch now

        build = ["cmake", "--build", build_dir, "-j", jobs]
        chosen = os.environ.get("GRADCOMM_BUILD_TARGETS", "").split()
        if chosen:
            with progress.phase(f"build of {' '.join(chosen)}"):
                run(build + ["--target", *chosen], "building", env)
        else:
            targets = existing_targets(build_dir)
            tools = [t for t in ("gradcomm-run", "gradcomm-bench", "gradcomm-train") if t in targets]
            with progress.phase("C++ library and tools") as phase:
                run(build + ["--target", "gradcomm", *tools], "building the library and tools", env)
                phase.notes.append(", ".join(["libgradcomm", *tools]))
            python = [t for t in ("gradcomm-python", "_gradcomm_torch") if t in targets]
            if python:  # else the bindings are off, and _find_package below says so
                on_off, _, why = backend.partition(" ")
                with progress.phase(f"Python module, torch backend {on_off}") as phase:
                    run(build + ["--target", *python], "building the Python module and the torch backend", env)
                    phase.notes.append(re.sub(r"^[(](.*)[)]$", r"\1", re.sub(r" at /[^)]*[)]$", ")", why)))

        # install: ends in BuildWheel, after the wheel is written, when there is one.
        self.distribution.gradcomm_install = install = progress.phase("install")
        install.__enter__()
        try:
            if not chosen:
                run(build, "building what is left of target all (normally nothing)", env)
            stage = build_temp / "gradcomm-stage"
            shutil.rmtree(stage, ignore_errors=True)
            run(["cmake", "--install", build_dir, "--prefix", stage], "staging the install tree", env)
            package = self._find_package(stage, build_dir)
            target = Path(self.build_lib) / "gradcomm"
            shutil.rmtree(target, ignore_errors=True)
            shutil.copytree(package, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
            shutil.rmtree(package)
            self.distribution.gradcomm_stage = stage
        except BaseException:
            install.__exit__(*sys.exc_info())
            raise
        install.notes.append("cmake --install")
        if "bdist_wheel" not in self.distribution.commands:
            install.__exit__(None, None, None)

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


try:  # setuptools >= 70.1 has its own; before, the wheel package's
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:
    try:
        from wheel.bdist_wheel import bdist_wheel
    except ImportError:
        bdist_wheel = None

if bdist_wheel is not None:
    class BuildWheel(bdist_wheel):
        """bdist_wheel, ending the install phase with the wheel's size and the last line."""

        def run(self):
            super().run()
            install = getattr(self.distribution, "gradcomm_install", None)
            if install is None:
                return
            wheels = sorted(Path(self.dist_dir).glob("gradcomm-*.whl"), key=lambda p: p.stat().st_mtime)
            if wheels:
                size = wheels[-1].stat().st_size / 2**20
                install.notes.append(f"wheel of {size:.{0 if size >= 10 else 1}f} MB")
            install.__exit__(None, None, None)
            self.distribution.gradcomm_progress.handing_over()


def report_torch_backend(package):
    """The torch.distributed backend's status as configured ("ON (torch 1.13...)",
    "OFF (why)"), from the package directory of a configured build: printed, returned,
    and, when this interpreter has a torch that the backend cannot be built against,
    the install fails with it right after configure (pip shows a failed build's
    output), so a torch user never finds out at init_process_group("gradcomm").
    Without torch, or with GRADCOMM_TORCH_BACKEND=OFF asked for, the package installs
    without it."""
    status_file = package / "_torch_backend_status.txt"
    status = status_file.read_text().strip() if status_file.is_file() else "unknown (no status recorded)"
    print(f"gradcomm setup.py: torch.distributed backend {status}", flush=True)
    if not status.startswith("OFF") or "GRADCOMM_TORCH_BACKEND=OFF" in status or "cannot import torch" in status:
        return status
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
    cmdclass={"build_ext": BuildWithCMake, "install": InstallWithPrefix, "install_cmake_prefix": InstallCMakePrefix,
              **({"bdist_wheel": BuildWheel} if bdist_wheel is not None else {})},
    zip_safe=False,
)
