"""What every configuration section shares: the `_Section` base (unknown keys are errors), and the
masking of secrets in URLs that sections' serializers, `/readyz` and logs use.

The sections themselves are in `config_transport.py` and `config_quality.py`; the root model and
loading are in `config.py`, which re-exports every public name of these modules.
"""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


MASK = "**********"
"""What every secret-typed setting shows as in `ragmon config`, logs, errors and `/readyz` (as SecretStr)."""


# query parameters whose values are credentials (`?password=`, `?sslpassword=`, `?api_key=`, `?sig=` ...)
_SECRET_QUERY = re.compile(
    r"(?i)(?<![^?&;])([\w.-]*(?:pass|pwd|secret|token|key|sig|credential|auth)[\w.-]*)=([^&;#]*)"
)


def masked_url(url: str) -> str:
    """`url` as it may be shown or logged: the password of its user info and the values of its
    credential-like query parameters masked (`MASK`), everything else as written.

    Works on any scheme (database, broker, HTTP), without parsing what is not a credential, so a URL no
    library reads is masked as well; text with no scheme that holds an `@` is masked whole."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return MASK if "@" in url else url
    query_at = min((i for i in (rest.find("?"), rest.find("#")) if i >= 0), default=len(rest))
    # the user info ends at the last "@" before the query: a password may hold "/" or "@" unencoded
    at = rest.rfind("@", 0, query_at)
    if at >= 0:
        user, colon, _password = rest[:at].partition(":")
        if colon:
            rest = f"{user}:{MASK}{rest[at:]}"
            query_at += len(user) + 1 + len(MASK) - at
    head, tail = rest[:query_at], rest[query_at:]
    if tail.startswith("?"):
        tail = _SECRET_QUERY.sub(lambda m: f"{m.group(1)}={MASK}", tail)
    return f"{scheme}://{head}{tail}"


def _http_url(value: str | None) -> str | None:
    """`value` unchanged if it is an http(s) URL; the error never repeats it (it may hold a password)."""
    if value is not None and not value.lower().startswith(("http://", "https://")):
        raise ValueError("must be an http:// or https:// URL (not shown: it may hold a password)")
    return value
