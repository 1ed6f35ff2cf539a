#!/usr/bin/env bash
# CI check of the pip packaging (pyproject.toml, setup.py): installs gradcomm with
# pip into a scratch venv and uses it from outside the source tree, so nothing is
# imported from the repository or the build directory by accident.
#
#   scripts/check-pip-install.sh [BUILD_DIR]     (default: build)
#
# BUILD_DIR is reused (GRADCOMM_BUILD_DIR; setup.py runs `cmake --build` on it, a
# no-op when it is up to date, then installs from it): it must be configured with
# the Python bindings. GRADCOMM_BUILD_LOCK=<file> holds that file with flock(1)
# around the pip install, for machines where others build in the same directory.
# Python: /usr/bin/python3 (Debian's; numpy and torch come from its site-packages),
# or GRADCOMM_CHECK_PYTHON.
#
# Checks, in order: pip installs; `import gradcomm` comes from the venv and its
# __version__ equals the project version (CMakeLists.txt), version.h's and pip's;
# the installed library and module do not link libnccl, and a CPU allreduce does
# not load it; the console scripts run (gradcomm-plot, the C++ tools on the venv's
# PATH); python_bindings/examples/numpy_allreduce.py and, when present,
# examples/torch_backend.py under the installed gradcomm-run with 2 ranks; pip
# uninstall removes it all. Scratch directories are removed on every exit.
# Exit status: 0 passed, 1 failed, 77 skipped (no bindings in BUILD_DIR).
set -euo pipefail

src=$(cd "$(dirname "$0")/.." && pwd)
build_arg=${1:-$src/build}
if [[ ! -f $build_arg/CMakeCache.txt ]]; then
  echo "check-pip-install: $build_arg is not a configured CMake build directory" >&2
  exit 1
fi
build_dir=$(cd "$build_arg" && pwd)
python=${GRADCOMM_CHECK_PYTHON:-/usr/bin/python3}
if grep -q '^GRADCOMM_PYTHON:STRING=OFF' "$build_dir/CMakeCache.txt" || [[ ! -d $build_dir/python/gradcomm ]]; then
  echo "check-pip-install: SKIPPED: $build_dir has no Python bindings (GRADCOMM_PYTHON)"
  exit 77
fi

scratch=$(mktemp -d "${TMPDIR:-/tmp}/gradcomm-pip-check.XXXXXX")
trap 'rm -rf "$scratch"' EXIT
trap 'exit 130' INT TERM  # the EXIT trap still cleans up
venv=$scratch/venv
vpy=$venv/bin/python
mkdir "$scratch/run" "$scratch/store"
cd "$scratch/run"  # outside the source tree from here on

step() { echo "check-pip-install: $*"; }
fail() {
  echo "check-pip-install: FAILED: $*" >&2
  exit 1
}
started=$SECONDS

step "venv (--system-site-packages) in $venv"
# --without-pip: Debian's pip (python3-pip) is visible through the system site-packages.
"$python" -m venv --system-site-packages --without-pip "$venv"

step "GRADCOMM_BUILD_DIR=$build_dir pip install --no-build-isolation $src"
pip_install=(env GRADCOMM_BUILD_DIR="$build_dir" "$vpy" -m pip install --no-build-isolation --no-index
  --disable-pip-version-check -q "$src")
if [[ -n ${GRADCOMM_BUILD_LOCK:-} ]]; then
  flock "$GRADCOMM_BUILD_LOCK" "${pip_install[@]}" || fail "pip install"
else
  "${pip_install[@]}" || fail "pip install"
fi

step "import gradcomm and its version"
project_version=$(sed -n 's/^project(gradcomm VERSION \([0-9.]*\).*/\1/p' "$src/CMakeLists.txt")
header_version=$(sed -n 's/^#define GRADCOMM_VERSION_STRING "\(.*\)"/\1/p' "$build_dir/include/gradcomm/version.h")
"$vpy" - "$venv" "$project_version" "$header_version" <<'EOF' || fail "import gradcomm / version"
import importlib.metadata, os, sys
import gradcomm
venv, project, header = sys.argv[1:]
where = os.path.realpath(gradcomm.__file__)
assert where.startswith(os.path.realpath(venv) + "/"), f"gradcomm imported from {where}, not from the venv"
versions = {"gradcomm.__version__": gradcomm.__version__, "CMakeLists.txt project()": project,
            "version.h": header, "pip metadata": importlib.metadata.version("gradcomm")}
print(f"  gradcomm {gradcomm.__version__} from {os.path.dirname(where)}")
assert len(set(versions.values())) == 1, f"versions disagree: {versions}"
EOF

step "no libnccl: not linked, not loaded by a CPU allreduce"
for lib in "$venv"/lib/libgradcomm.so.* "$venv"/lib/python3*/site-packages/gradcomm/_gradcomm*.so; do
  [[ -f $lib ]] || fail "$lib missing from the install"
  if readelf -d "$lib" | grep -q 'NEEDED.*libnccl'; then fail "$lib links libnccl"; fi
done
"$vpy" - "$scratch/store" <<'EOF' || fail "CPU allreduce / libnccl mapped"
import sys
import numpy as np
import gradcomm
gradcomm.init(rank=0, world_size=1, store="file://" + sys.argv[1], timeout=60)
x = np.arange(16, dtype=np.float32)
gradcomm.allreduce(x, compression="topk:ratio=0.5", name="x")
gradcomm.shutdown()
with open("/proc/self/maps") as maps:
    mapped = [line.split()[-1] for line in maps if "libnccl" in line]
assert not mapped, f"libnccl is mapped after a CPU allreduce: {sorted(set(mapped))}"
EOF

step "console scripts"
for tool in gradcomm-run gradcomm-bench gradcomm-train; do
  [[ -x $venv/bin/$tool ]] || fail "$tool not installed in $venv/bin"
  "$venv/bin/$tool" --help >/dev/null 2>&1 || fail "$venv/bin/$tool --help"
done
if [[ -f $src/python_bindings/gradcomm/plot.py ]]; then
  "$venv/bin/gradcomm-plot" --help >/dev/null || fail "gradcomm-plot --help"
else
  step "gradcomm/plot.py does not exist (yet): gradcomm-plot not checked"
fi

export PATH=$venv/bin:$PATH
step "gradcomm-run -n 2 -- python python_bindings/examples/numpy_allreduce.py"
gradcomm-run -n 2 -- "$vpy" "$src/python_bindings/examples/numpy_allreduce.py" || fail "numpy_allreduce.py"

torch_example=$src/python_bindings/examples/torch_backend.py
if [[ -f $torch_example ]]; then
  step "gradcomm-run -n 2 -- python python_bindings/examples/torch_backend.py"
  gradcomm-run -n 2 -- "$vpy" "$torch_example" || fail "torch_backend.py"
else
  step "MISSING: $torch_example does not exist: the torch backend example was NOT run"
fi

step "pip uninstall"
"$vpy" -m pip uninstall -y -q --disable-pip-version-check gradcomm || fail "pip uninstall"
for left in "$venv/bin/gradcomm-run" "$venv/bin/gradcomm-plot" "$venv"/lib/libgradcomm.so*; do
  [[ ! -e $left ]] || fail "pip uninstall left $left behind"
done
if "$vpy" -c "import gradcomm" 2>/dev/null; then fail "gradcomm still importable after pip uninstall"; fi

step "passed ($((SECONDS - started)) s)"
