# Sourced by demo.sh and test.sh: makes .venv with a Python of 3.11 or newer
# and installs tenure into it, with the pip options given ("$@"), unless
# nothing they depend on changed since the last install.
# PYTHON picks the interpreter (default: python3).

python=${PYTHON:-python3}
if ! command -v "$python" >/dev/null; then
    echo "tenure needs Python 3.11 or newer: $python is not on PATH; set PYTHON=/path/to/python3.11" >&2
    exit 1
fi
if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
    echo "tenure needs Python 3.11 or newer; $python is $("$python" -V 2>&1)." >&2
    echo "Install one (Debian 12: apt-get install python3) or set PYTHON=/path/to/python3.11" >&2
    exit 1
fi
# A .venv made by another (older, or since removed) Python is made anew.
if [ -e .venv ] && ! .venv/bin/python -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
    echo "removing .venv: it was made by a Python that is too old or gone" >&2
    rm -rf .venv
fi
if [ ! -x .venv/bin/python ]; then
    rm -rf .venv
    "$python" -m venv .venv || { rm -rf .venv; exit 1; }
fi
# Installed again only when pyproject.toml or the options changed (the
# install is editable: source changes need none); a failed install leaves no
# stamp, so the next run tries again.
stamp=".venv/.tenure-installed"
wanted="$("$python" -c 'import hashlib, sys; print(hashlib.sha256(open("pyproject.toml", "rb").read() + " ".join(sys.argv[1:]).encode()).hexdigest())' "$@")"
if [ "$(cat "$stamp" 2>/dev/null)" != "$wanted" ]; then
    rm -f "$stamp"
    .venv/bin/python -m pip install --quiet --upgrade 'pip>=25.1'  # dependency groups
    .venv/bin/python -m pip install --quiet "$@"
    echo "$wanted" > "$stamp"
fi
