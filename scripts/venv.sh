# Sourced by the other scripts: create ./.venv if needed and install the project into it,
# with the extras named in $VENV_EXTRAS (e.g. "test"), or none.
# pip runs only when something changed (it takes ~30 s and needs the network): a stamp file per
# set of extras, .venv/.tidemq-installed-<extras>, holds the hash of what it was installed from.
# The install is editable, so changes to interpreted code need no new install; the compiled
# modules (setup.py) are built in place by it, so a change to one of them does.
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
# The hash covers pyproject.toml, setup.py and the compiled modules' sources ([tool.tidemq]
# compiled) with the .pxd declarations of their folders: the install builds their C extensions in place, so an edited one is built again.
_tidemq_hash=$(.venv/bin/python - <<'PY'
import hashlib, tomllib
project = open("pyproject.toml", "rb").read()
digest = hashlib.sha256(project + open("setup.py", "rb").read())
import pathlib
folders = set()
for name in tomllib.loads(project.decode())["tool"]["tidemq"]["compiled"]:
    source = pathlib.Path(name.replace(".", "/") + ".py")
    digest.update(source.read_bytes())
    folders.add(source.parent)
for declarations in sorted(p for folder in folders for p in folder.glob("*.pxd")):  # what they cimport
    digest.update(declarations.read_bytes())
print(digest.hexdigest())
PY
)
# ... and the built extensions must be there (a `git clean` removes them, not the stamp), each
# no older than its source and the .pxd files of its folder: a checkout that puts a source's
# content back leaves the hash as it was and the extension older, which the tests refuse
# (tests/builds.py, stale_extensions), naming this script as the cure
_tidemq_built=$(.venv/bin/python - <<'PY'
import pathlib, tomllib
names = tomllib.loads(open("pyproject.toml", "rb").read().decode())["tool"]["tidemq"]["compiled"]
def state(source):
    extensions = list(source.parent.glob(source.stem + ".*.so"))
    newest = max(path.stat().st_mtime for path in [source, *source.parent.glob("*.pxd")])
    return "missing" if not extensions else "yes" if any(e.stat().st_mtime >= newest for e in extensions) else "stale"
states = {state(pathlib.Path(name.replace(".", "/") + ".py")) for name in names}
print("missing" if "missing" in states else "stale" if "stale" in states else "yes")
PY
)
_tidemq_stamp=".venv/.tidemq-installed-${VENV_EXTRAS:-base}"
_tidemq_current=no
if [ "$_tidemq_built" = missing ]; then
    rm -f .venv/.tidemq-installed-*  # (every set of extras needs the build again)
elif [ "$_tidemq_built" = stale ]; then
    :  # built again, whatever the stamp says
elif [ "$(cat "$_tidemq_stamp" 2>/dev/null)" = "$_tidemq_hash" ]; then
    _tidemq_current=yes
elif [ -z "${VENV_EXTRAS:-}" ]; then
    # no extras asked: any install from this pyproject.toml has the base dependencies
    for _tidemq_other in .venv/.tidemq-installed-*; do
        if [ -f "$_tidemq_other" ] && [ "$(cat "$_tidemq_other")" = "$_tidemq_hash" ]; then
            _tidemq_current=yes
        fi
    done
fi
if [ "$_tidemq_current" = no ]; then
    if [ "$_tidemq_built" != missing ] && [ -f "$_tidemq_stamp" ]; then
        echo "scripts/venv.sh: pyproject.toml, setup.py or a compiled module's source changed since the build; building again" >&2
    fi
    rm -f "$_tidemq_stamp"
    # pip, and the build requirements (pyproject.toml's build-system: setuptools, Cython), so that
    # `.venv/bin/python setup.py build_ext --inplace` (docs/compiled.md, the test set-up's rebuild
    # hint) runs in the venv too: the setuptools a venv starts with cannot read pyproject.toml
    # shellcheck disable=SC2046  # (one word per requirement)
    .venv/bin/python -m pip install --quiet --upgrade pip $(.venv/bin/python -c \
        'import tomllib; print(" ".join(tomllib.load(open("pyproject.toml", "rb"))["build-system"]["requires"]))')
    if [ -n "${VENV_EXTRAS:-}" ]; then
        .venv/bin/python -m pip install --quiet -e ".[$VENV_EXTRAS]"
    else
        .venv/bin/python -m pip install --quiet -e .
    fi
    echo "$_tidemq_hash" > "$_tidemq_stamp"  # (only after pip succeeded: the scripts run with set -e)
fi
unset _tidemq_hash _tidemq_stamp _tidemq_current _tidemq_other _tidemq_built
