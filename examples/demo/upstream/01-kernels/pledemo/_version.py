"""Version of the source tree; builds may override it (see setup.py)."""

__version__ = "0.3.0"
