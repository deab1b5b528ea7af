#!/usr/bin/env bash
# The project's one test command (README, .ci/run): build what is missing,
# then lint, type-check, check the layering and run every test.
source "$(dirname "$0")/env.sh"
python -m cozygpu.devcluster.binaries
ruff check cozygpu tests bench
mypy
lint-imports
# pytest exits 5 when it collected no test; set -e makes that a failure too.
python -m pytest "$@"
