#!/usr/bin/env bash
# Gradescope runs this once, as root, while it builds the autograder image of @LAB_NAME@
# (written by `dtrain-lab autograder build`; base image: Ubuntu 22.04 or newer).
#
# It installs the course (the wheel in wheels/) with its pinned dependencies into its own virtual
# environment, /opt/dtrain-lab/venv, and creates the unprivileged user the submission runs as.
#
# Which index serves the CPU build of torch: PyTorch's own, https://download.pytorch.org/whl/cpu
# (pytorch.org, "Previous PyTorch Versions", CPU only: pip install torch==X --index-url
# https://download.pytorch.org/whl/cpu). PyPI's Linux torch wheel pulls the CUDA libraries (GBs) that
# a grader never uses. The pin torch==@TORCH_VERSION@ is met by @TORCH_VERSION@+cpu from that index
# (PEP 440: a local version label matches a pin without one).
set -euo pipefail

TORCH_INDEX="@TORCH_INDEX@"
SRC="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VENV=/opt/dtrain-lab/venv
export DEBIAN_FRONTEND=noninteractive PIP_DISABLE_PIP_VERSION_CHECK=1

apt-get update -q
# python3-venv for the environment, the system's bubblewrap for the namespace sandbox (preferred to the
# course's own copy; either works only where the container allows user namespaces), procps for ps.
apt-get install -y -q --no-install-recommends python3 python3-venv python3-pip bubblewrap procps

PY=""
for candidate in python3.13 python3.12 python3.11 python3.10 python3; do
  if command -v "$candidate" >/dev/null && "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 10))'; then
    PY="$candidate"; break
  fi
done
[ -n "$PY" ] || { echo "dtrain-lab needs Python >= 3.10; this image has $(python3 --version 2>&1). Choose a newer base image." >&2; exit 1; }

mkdir -p /opt/dtrain-lab
"$PY" -m venv "$VENV"
"$VENV/bin/pip" install -q --upgrade pip setuptools wheel
# 1. torch, CPU build, exactly the version the course pins
"$VENV/bin/pip" install -q --index-url "$TORCH_INDEX" "torch==@TORCH_VERSION@"
# 2. deepspeed builds at install time: build it against the torch just installed, not a fresh one
"$VENV/bin/pip" install -q --no-build-isolation --extra-index-url "$TORCH_INDEX" "deepspeed==@DEEPSPEED_VERSION@"
# 3. the course and the rest of its pinned dependencies (torch and deepspeed are already satisfied)
"$VENV/bin/pip" install -q --extra-index-url "$TORCH_INDEX" "$SRC"/wheels/*.whl
"$VENV/bin/python" -c 'import torch, dtrain_lab; assert torch.__version__.startswith("@TORCH_VERSION@"), torch.__version__'

# Where the container blocks user namespaces there is no sandbox, and launched exercises are not run
# unless the zip was built with --allow-unsandboxed (see the instructor guide, "what the grader proves").
# the venv is readable by everyone (the submission imports torch and the contract API from it); the
# autograder's own files (config, hidden checks) and the results are root's alone
chmod -R a+rX /opt/dtrain-lab
# ...except the checks, references and hidden checks: the root grader imports them, a submission never
chmod 700 "$VENV"/lib/python3*/site-packages/dtrain_lab/grading/checks
chmod 700 "$SRC"
mkdir -p /autograder/results && chmod 700 /autograder/results
