# Sourced by the other scripts: create ./.venv if needed and install the project into it,
# with the extras named in $VENV_EXTRAS (e.g. "test"), or none.
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
if [ -n "${VENV_EXTRAS:-}" ]; then
    .venv/bin/python -m pip install --quiet -e ".[$VENV_EXTRAS]"
else
    .venv/bin/python -m pip install --quiet -e .
fi
