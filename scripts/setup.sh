#!/usr/bin/env bash
# Creates the project's environment in .venv (git-ignored) and installs the package with its extras.
# Usage: bash scripts/setup.sh            (idempotent; reuses an existing .venv)
# Env:   LF_VENV=path  to choose another folder;  LF_TORCH="torch==X torchvision==Y" to override torch.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${LF_VENV:-.venv}"
torch_spec="${LF_TORCH:-torch==2.14.1 torchvision==0.29.1}"
python="${PYTHON:-python3}"

if [ ! -x "$venv/bin/python" ]; then
  echo "[setup] creating $venv"
  "$python" -m venv "$venv"
  "$venv/bin/pip" install -q --upgrade pip
fi
if ! "$venv/bin/python" -c "import torch, torchvision" 2>/dev/null; then
  echo "[setup] installing $torch_spec (from local disk where available)"
  "$venv/bin/pip" install -q $torch_spec
fi
echo "[setup] installing laplacianformer[test] (editable)"
"$venv/bin/pip" install -q -e ".[test]"

# The embedded default data set (Fashion-MNIST, Debian package; see docs/DATA.md).
if [ ! -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ] && [ -z "${LF_FASHION_MNIST:-}" ]; then
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null; then
    echo "[setup] installing dataset-fashion-mnist"
    (apt-get update -qq && apt-get install -y -qq dataset-fashion-mnist) >/dev/null 2>&1 \
      || echo "[setup] warning: could not install dataset-fashion-mnist; tests that need it will say so"
  else
    echo "[setup] note: run 'sudo apt-get install dataset-fashion-mnist' for the default data set"
  fi
fi
# the C kernels of the CPU path, built now rather than at their first call (a failure is not fatal: the
# library then runs its PyTorch fallback, and says so)
"$venv/bin/laplacianformer" build || echo "[setup] warning: C kernels not built (see above); the CPU path will be slower"
echo "[setup] done: $("$venv/bin/python" -c 'import torch, laplacianformer; print("torch", torch.__version__, "laplacianformer", laplacianformer.__version__)')"
