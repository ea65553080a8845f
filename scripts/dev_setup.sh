#!/usr/bin/env bash
# Installs the package (editable) with everything the tests need, on a CPU-only machine:
# the dev tools, and SGLang 0.5.23's real Python modules without its GPU kernels
# (sglang-kernel, flashinfer), so that the plugin is tested against SGLang's own code.
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install -e ".[dev]"
python -m pip install --no-deps "sglang==0.5.23"
python -m pip install -r requirements/sglang-cpu.txt
