"""An index URL as build.yaml writes it (a nightly index, a precompiled wheel's index:): a URL, or one holding ${NAME}
that the environment fills in when it is used. Checked where build.yaml is read (`check` and `version` load it), so
it imports nothing of carry/util/index.py, and urllib.parse only for a URL written out."""

from __future__ import annotations

import os
import re

from carry.util.errors import BadInput

ENV_REF_RE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
URL_SCHEMES = ("http", "https", "file")


def check_template(template: str, where: str, schemes: tuple[str, ...] = ("http", "https")) -> str:
    """An index URL of `schemes`, or one holding ${NAME}; bad input naming `where` for a stray '$' or another form."""
    if "$" in ENV_REF_RE.sub("", template):
        raise BadInput(f"{where} is {template!r}: a '$' outside ${{NAME}}; write the variable as ${{NAME}}")
    return template if ENV_REF_RE.search(template) else _check_url(template, where, schemes)


def expand(template: str, where: str, schemes: tuple[str, ...] = ("http", "https")) -> str:
    """`template` with every ${NAME} set from the environment (bad input for one unset or empty); a URL of `schemes`."""
    for name in ENV_REF_RE.findall(template):
        if not os.environ.get(name):
            raise BadInput(
                f"{where} is {template!r}, but ${name} is not set; export {name}=<the index URL> (CI sets it from "
                f"its configuration), or write the URL"
            )
    if not ENV_REF_RE.search(template):
        return template
    return _check_url(ENV_REF_RE.sub(lambda m: os.environ[m.group(1)], template), f"{where} (from {template})", schemes)


def _check_url(url: str, where: str, schemes: tuple[str, ...]) -> str:
    import urllib.parse

    from carry.util import redact

    parts = urllib.parse.urlsplit(url.strip())
    if parts.scheme.lower() not in schemes or not (parts.netloc or parts.scheme.lower() == "file"):
        forms = " or ".join(f"{s}://" for s in schemes)
        raise BadInput(
            f"{where}: {redact.address(url)!r} is not an index URL; give {forms}HOST/PATH, "
            f"or ${{NAME}} to take it from the environment"
        )
    return url.strip()
