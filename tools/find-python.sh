#!/usr/bin/env sh
# Print the path of a Python >= 3.12: python3.13, python3.12 or python3 on PATH, else the newest under pyenv.
# Exits 1 with a message on stderr when there is none.
ok() { "$1" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 12) else 1)' >/dev/null 2>&1; }
for name in python3.13 python3.12 python3; do
  if command -v "$name" >/dev/null 2>&1 && ok "$name"; then
    "$name" -c 'import sys; print(sys.executable)'
    exit 0
  fi
done
root="${PYENV_ROOT:-$HOME/.pyenv}"
for exe in $(ls -d "$root"/versions/3.12*/bin/python3 "$root"/versions/3.1[3-9]*/bin/python3 2>/dev/null); do
  if ok "$exe"; then echo "$exe"; exit 0; fi
done
echo "error: no Python >= 3.12 found (looked for python3.13, python3.12, python3 on PATH and under $root/versions)." >&2
echo "Install Python 3.12 or newer, or run: make PYTHON=/path/to/python3.12 demo" >&2
exit 1
