#!/usr/bin/env bash
# Builds the virtual environments scripts/portability_check.py runs its toolchain rows in
# (under $ENVS, default /tmp/open1b-envs): other torch releases, another numpy minor
# version, another Python. Each holds the project's runtime dependencies, never the
# project itself (the check puts a copy of the source tree on PYTHONPATH, with the C
# extension built for that interpreter). Needs PyPI; the x86 torch wheels on PyPI are CUDA
# builds (several GB with their nvidia-* dependencies) that run on the CPU as well.
#   scripts/portability_envs.sh [NAME ...]     # default: every environment below
set -euo pipefail
ENVS=${ENVS:-/tmp/open1b-envs}
first() { for p in "$@"; do "$p" -c "" 2>/dev/null && { echo "$p"; return; }; done; echo "$1"; }
PY311=${PY311:-$(first python3.11 /root/.pyenv/versions/3.11.7/bin/python3.11)}
PY312=${PY312:-$(first python3.12 /root/.pyenv/versions/3.12.1/bin/python3.12)}
DEPS="pyarrow tokenizers tiktoken zstandard fsspec click safetensors tqdm cryptography setuptools wheel"
mkdir -p "$ENVS"

make_env() {  # name python torch-spec numpy-spec
  local name=$1 py=$2 torch=$3 numpy=$4 dir="$ENVS/$1"
  if [ -x "$dir/bin/python" ] && "$dir/bin/python" -c "import torch, numpy" 2>/dev/null; then
    echo "$name: exists"; return; fi
  [ -x "$py" ] || { echo "$name: no interpreter $py" >&2; return 1; }
  rm -rf "$dir"; "$py" -m venv "$dir"
  "$dir/bin/pip" install -q "$torch" "$numpy" $DEPS
  "$dir/bin/python" -c "import torch, numpy, sys; print('$name:', sys.version.split()[0], torch.__version__, numpy.__version__)"
}

for name in "${@:-torch211 torch214 numpy23 py312}"; do
  for n in $name; do
    case $n in
      torch211) make_env torch211 "$PY311" "torch==2.11.0" "numpy==2.4.6" ;;
      torch214) make_env torch214 "$PY311" "torch==2.14.1" "numpy==2.4.6" ;;
      numpy23)  make_env numpy23  "$PY311" "torch==2.13.0" "numpy==2.3.5" ;;
      py312)    make_env py312    "$PY312" "torch==2.13.0" "numpy==2.4.6" ;;
      *) echo "unknown environment $n" >&2; exit 2 ;;
    esac
  done
done
