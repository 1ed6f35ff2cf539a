#!/usr/bin/env bash
# A torch the backend cannot support is said in one line, at configure time and by pip.
# A stub `torch` package (version 2.9, built with the pre-C++11 ABI, no headers) first on
# PYTHONPATH stands in for such a torch: the configure step must print the backend OFF
# with that reason and record it (_torch_backend_status.txt); setup.py's check must turn
# the record into one error naming it and the way out (gradcomm.torch.backend_available()
# reading such a record: tests/python/test_torch_backend.py). No build: configure only.
#   tests/packaging/test_torch_refusal.sh SOURCE_DIR PYTHON
set -euo pipefail
src=$1 python=$2
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

mkdir -p "$tmp/stub/torch/lib" "$tmp/stub/torch/include"
printf '__version__ = "2.9.0+stub"\nclass _C:\n    _GLIBCXX_USE_CXX11_ABI = False\n' >"$tmp/stub/torch/__init__.py"
for lib in c10 torch torch_cpu torch_python; do : >"$tmp/stub/torch/lib/lib$lib.so"; done

PYTHONPATH=$tmp/stub cmake -S "$src" -B "$tmp/build" -G Ninja -DGRADCOMM_TESTS=OFF -DGRADCOMM_BENCH=OFF \
  -DGRADCOMM_CUDA=OFF -DGRADCOMM_PYTHON_EXECUTABLE="$python" >"$tmp/configure.log" 2>&1 ||
  { cat "$tmp/configure.log"; fail "configure failed"; }
want="torch 2.9.0+stub was built with the pre-C++11 libstdc++ ABI (_GLIBCXX_USE_CXX11_ABI=0)"
grep -qF -- "gradcomm: torch.distributed backend OFF ($want)" "$tmp/configure.log" ||
  { grep "torch" "$tmp/configure.log"; fail "configure did not say why the backend is off"; }
status=$tmp/build/python/gradcomm/_torch_backend_status.txt
[[ $(cat "$status") == "OFF ($want)" ]] || fail "status file: $(cat "$status")"

# setup.py's check (the part of setup.py before it builds anything), on that record.
out=$(cd "$src" && "$python" - "$tmp/build/python/gradcomm" 2>&1 <<'PY'
import pathlib, sys
text = open("setup.py").read()
namespace = {"__file__": "setup.py", "__name__": "setup_under_test"}
exec(compile(text[:text.index("BUILD_BASE = setuptools_build_base()")], "setup.py", "exec"), namespace)
try:
    namespace["report_torch_backend"](pathlib.Path(sys.argv[1]))
except RuntimeError as e:
    print(f"RAISED {e}")
PY
) || true
grep -qF -- "RAISED setup.py: the gradcomm torch.distributed backend cannot be built for" <<<"$out" ||
  { echo "$out"; fail "setup.py did not refuse"; }
grep -qF -- "$want." <<<"$out" || { echo "$out"; fail "setup.py's error does not name the reason whole"; }
grep -qF -- "GRADCOMM_TORCH_BACKEND=OFF" <<<"$out" || { echo "$out"; fail "setup.py's error gives no way out"; }

echo "ok: configure, setup.py and the status record all say: $want"
