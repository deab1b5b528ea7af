"""The binder layer (see the import-linter layers in pyproject.toml)."""
