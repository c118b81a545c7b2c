"""The spec stage: TOML -> validated, frozen Spec (models, loader, errors with FILE:LINE, cache, pins).

Kept import-free: a warm plan reads the cached view without importing pydantic.
"""
