# Source me (bash): create or refresh the project's .venv, then put it first on PATH.
#
# torch==2.13.0 is installed first, then the project with its test tools
# (`pip install -e ".[test]"`: pytest and the pinned ruff; deps pinned in pyproject.toml).
# A marker with the hash of pyproject.toml skips the installs until the file changes.
# Set PIP_INDEX_URL / PIP_EXTRA_INDEX_URL to pick a torch build (CPU/CUDA).

BOOST_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BOOST_VENV="$BOOST_ROOT/.venv"

boost_bootstrap_venv() {
    local marker="$BOOST_VENV/.boost-installed" want
    want="$(sha256sum "$BOOST_ROOT/pyproject.toml" | cut -d' ' -f1)"
    if [[ ! -x "$BOOST_VENV/bin/python" ]]; then
        echo "bootstrap: creating $BOOST_VENV" >&2
        python3 -m venv "$BOOST_VENV"
    fi
    if [[ "$(cat "$marker" 2>/dev/null)" != "$want" ]]; then
        echo "bootstrap: installing torch and boost-titan into $BOOST_VENV" >&2
        "$BOOST_VENV/bin/python" -m pip install --quiet torch==2.13.0
        "$BOOST_VENV/bin/python" -m pip install --quiet -e "$BOOST_ROOT[test]"
        echo "$want" > "$marker"
    fi
    export VIRTUAL_ENV="$BOOST_VENV"
    export PATH="$BOOST_VENV/bin:$PATH"
}

boost_bootstrap_venv
