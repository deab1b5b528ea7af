# Shared by hack/*.sh: a project virtualenv with the package and its dev tools.
# Sourced, not run. Binaries of the control plane are cached outside the
# checkout ($COZYGPU_CACHE, default ~/.cache/cozygpu) and reused.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
VENV=${COZYGPU_VENV:-.venv}
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
stamp="$VENV/.installed-$(sha256sum pyproject.toml | cut -c1-16)"
if [ ! -e "$stamp" ]; then
  "$VENV/bin/pip" install --quiet --disable-pip-version-check -e '.[dev]'
  touch "$stamp"
fi
export PATH="$PWD/$VENV/bin:$PATH"
