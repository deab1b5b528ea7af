"""The passes layer (see the import-linter layers in pyproject.toml)."""
