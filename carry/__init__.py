"""carry: build and ship an upstream project with patches it has not merged yet."""

__version__ = "0.1.0"
