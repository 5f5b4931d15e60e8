"""Helpers behind tests/conftest.py's session fixtures (each expensive thing made once per run): see docs/testing.md."""
