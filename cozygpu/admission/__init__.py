"""The admission layer (see the import-linter layers in pyproject.toml)."""
