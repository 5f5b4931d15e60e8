"""The one way carry keeps secrets out of what it prints, writes and labels: a given secret (a password, a token)
becomes MARKER wherever it appears, as written or URL-quoted; a URL's user:password@ (its userinfo) is taken out."""

from __future__ import annotations

import re
import urllib.parse

MARKER = "***"
# scheme://, then the authority up to its last '@' (before the path, query or fragment): the userinfo
_USERINFO_RE = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://)[^/?#\s'\"]*@")


def secrets(text: str, *given: str | None) -> str:
    """`text` with every given secret (as written and URL-quoted) replaced by MARKER; empty ones are no secret."""
    forms = {form for secret in given if secret for form in (secret, urllib.parse.quote(secret, safe=""))}
    for form in sorted(forms, key=len, reverse=True):
        text = text.replace(form, MARKER)
    return text


def credentials(text: str) -> str:
    """`text` (a URL, a log, build.yaml) with the user:password@ of every URL in it taken out."""
    return _USERINFO_RE.sub(r"\1", text)


def address(url: str) -> str:
    """A URL as scheme://host/path only: no user:password@, query or fragment. Not a URL: as it is."""
    scheme, sep, rest = url.partition("://")
    if not (sep and rest):
        return url
    location = rest.split("?", 1)[0].split("#", 1)[0]
    host, slash, path = location.partition("/")
    return f"{scheme}{sep}{host.rsplit('@', 1)[-1]}{slash}{path}"
