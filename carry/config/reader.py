"""What every section of build.yaml is read with: `Section`, typed access to one mapping (every error names the key,
the file and the form wanted), and the checks and helpers more than one section uses (variable names, commands,
URLs shown without their credentials). Imports no section: they import it."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal, overload

from carry.util.errors import BadInput

ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class Section:
    """Typed access to one mapping of build.yaml; every error names the key, the file and the form wanted."""

    def __init__(self, data: Any, prefix: str, path: Path, allowed: tuple[str, ...]):
        self.prefix = prefix
        self.path = path
        if data is None:
            data = {}
        if not isinstance(data, dict):
            raise BadInput(f"{path}: {prefix or 'the file'} must be a mapping of keys, got {type(data).__name__}")
        unknown = sorted(str(k) for k in data if k not in allowed)
        if unknown:
            raise BadInput(f"{path}: unknown key {self.key(unknown[0])}; allowed keys here: {', '.join(allowed)}")
        self.data = data

    def key(self, key: str) -> str:
        return f"{self.prefix}.{key}" if self.prefix else key

    def fail(self, key: str, form: str) -> BadInput:
        return BadInput(f"{self.path}: {self.key(key)} must be {form}, got {self.data.get(key)!r}")

    def has(self, key: str) -> bool:
        return self.data.get(key) is not None

    def section(self, key: str, allowed: tuple[str, ...]) -> Section:
        return Section(self.data.get(key), self.key(key), self.path, allowed)

    @overload
    def string(self, key: str, default: str) -> str: ...
    @overload
    def string(self, key: str, *, required: Literal[True]) -> str: ...
    @overload
    def string(self, key: str) -> str | None: ...
    def string(self, key: str, default: str | None = None, required: bool = False) -> str | None:
        value = self.data.get(key)
        if value is None:  # `key:` with no value is the key left out: the default (has() reads it so too)
            value = default
        if value is None:
            if required:
                raise BadInput(f"{self.path}: {self.key(key)} is required (a string)")
            return None
        if not isinstance(value, str) or not value.strip():
            raise self.fail(key, "a non-empty string")
        return value

    def integer(self, key: str) -> int | None:
        value = self.data.get(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise self.fail(key, "a positive integer")
        return value

    def boolean(self, key: str, default: bool) -> bool:
        value = self.data.get(key, default)
        if not isinstance(value, bool):
            raise self.fail(key, "true or false")
        return value

    def strings(self, key: str, default: tuple[str, ...] = ()) -> tuple[str, ...]:
        value = self.data.get(key)
        if value is None:
            return default
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
            raise self.fail(key, "a list of non-empty strings")
        return tuple(value)

    def env(self, key: str) -> dict[str, str]:
        value = self.data.get(key) or {}
        if not isinstance(value, dict):
            raise self.fail(key, "a mapping of NAME: value")
        result = {}
        for name, item in value.items():
            if not isinstance(name, str) or not ENV_NAME_RE.match(name):
                raise BadInput(f"{self.path}: {self.key(key)} has an invalid name {name!r}; use NAME: value")
            if isinstance(item, bool) or not isinstance(item, (str, int, float)):
                raise BadInput(f"{self.path}: {self.key(key)}.{name} must be a string or number, got {item!r}")
            result[name] = str(item)
        return result


def without_secrets(url: str) -> str:
    """A URL for an error message: scheme, host and path only; no user, password, query or fragment."""
    if not url.strip().partition("://")[2]:
        return "(not a URL)" if "@" in url or "?" in url else url.strip()
    from carry.util import redact

    return redact.address(url.strip())


def public_url(url: str) -> str:
    """The URL without any user:password part, safe for logs, labels and buildinfo."""
    from carry.util import redact

    return redact.credentials(url)


def strip_credentials(text: str) -> str:
    """`text` (e.g. build.yaml) with the user:password part removed from every URL in it."""
    from carry.util import redact

    return redact.credentials(text)


def env_names(section: Section, key: str) -> tuple[str, ...]:
    names = section.strings(key)
    if not all(ENV_NAME_RE.match(name) for name in names):
        raise section.fail(key, "a list of environment variable names")
    return names


def test_argv(entry: Any, where: str) -> tuple[list[str], str]:
    """A command as a string (split like a shell would) or a list of arguments: (argv, the command as text)."""
    argv = command_argv(entry, where)
    if isinstance(entry, str):
        return argv, entry.strip()
    if all(re.fullmatch(r"[\w@%+=:,./{}-]+", arg) for arg in argv):
        return argv, " ".join(argv)  # what shlex.join writes for these, without loading shlex on check's path
    import shlex

    return argv, shlex.join(entry)


def command_argv(entry: Any, where: str) -> list[str]:
    """A command as a string (split like a shell would: shlex, imported only then) or a list of arguments."""
    if isinstance(entry, str):
        import shlex

        try:
            argv = shlex.split(entry)
        except ValueError as exc:
            raise BadInput(f"{where} {entry!r} does not parse ({exc}); close the quote or use a list") from None
    elif isinstance(entry, list) and all(isinstance(arg, str) for arg in entry):
        argv = list(entry)
    else:
        raise BadInput(f"{where} must be a string or a list of strings, got {entry!r}")
    if not argv or not argv[0].strip():
        raise BadInput(f"{where} is empty; give the command to run, e.g. 'python -m pkg.check'")
    return argv
