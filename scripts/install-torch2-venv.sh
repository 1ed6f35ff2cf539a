#!/usr/bin/env bash
# Creates (once) and reuses a venv holding the newest torch 2.x from the Python
# package index, for building and testing gradcomm's torch backend against the torch
# users run (Debian's python3-torch is 1.13). Prints the venv's python on the last
# line of stdout.
#
#   scripts/install-torch2-venv.sh            the venv in $GRADCOMM_TORCH2_VENV
#                                             (default ~/.cache/gradcomm/venv-torch2)
#   GRADCOMM_TORCH2_SPEC='torch==2.15.*' ...  another torch requirement
#
# The venv is made from /usr/bin/python3 (Debian's 3.11, the interpreter the rest of
# the project uses; its pip and venv come from scripts/install-deps.sh) without the
# system site-packages, so Debian's torch 1.13 cannot shadow the wheel. It holds
# torch, numpy and pytest. A venv that already imports a torch >= 2 is reused as it
# is (nothing is downloaded); delete it to get a newer torch.
#
# Cost on a fresh machine (measured, docs/development.md, "PyTorch 2.x"): the index serves
# only the CUDA build of torch for Linux (download.pytorch.org's CPU-only wheels are
# not reachable from the project's machines): about 3 GB downloaded (torch 540 MB
# plus the nvidia-* wheels it depends on), 5.4 GB on disk, about 2 minutes here. The
# CUDA build runs on CPU-only machines.
set -euo pipefail

venv=${GRADCOMM_TORCH2_VENV:-$HOME/.cache/gradcomm/venv-torch2}
spec=${GRADCOMM_TORCH2_SPEC:-torch>=2}
python=$venv/bin/python

have_torch2() {
  [[ -x $python ]] && "$python" -c 'import sys, torch; sys.exit(0 if int(torch.__version__.split(".")[0]) >= 2 else 1)' \
    2>/dev/null
}

if have_torch2; then
  echo "install-torch2-venv: reusing $venv (torch $("$python" -c 'import torch; print(torch.__version__)' 2>/dev/null))" >&2
  echo "$python"
  exit 0
fi

echo "install-torch2-venv: creating $venv with $spec from the package index" >&2
start=$SECONDS
mkdir -p "$(dirname "$venv")"
rm -rf "$venv"
/usr/bin/python3 -m venv "$venv"
"$python" -m pip install -q --disable-pip-version-check --progress-bar off "$spec" numpy pytest setuptools wheel >&2
if ! have_torch2; then
  echo "install-torch2-venv: FAILED: $venv does not import a torch >= 2 after pip install" >&2
  exit 1
fi
echo "install-torch2-venv: torch $("$python" -c 'import torch; print(torch.__version__)' 2>/dev/null)," \
  "$(du -sh "$venv" | cut -f1) in $((SECONDS - start)) s" >&2
echo "$python"
