"""Job secrets kept out of what read-only callers, logs and run errors see.

A job document holds four kinds of secret: ``http.headers`` values (``Authorization``),
``shell.env`` values, the userinfo, query string and fragment of ``http.url``
(``https://user:pw@host/x?api_key=...``) and ``alerts.webhook``, whose path is the secret
of Slack-style hooks. ``mask_spec`` replaces each with ``MASK``; ``unmask_doc`` puts the
stored values back where a document sent for storage still holds ``MASK``, so a masked
document applied back by a writer keeps the secrets rather than storing ``***``.

For text that leaves the process (a log line, a run error in the ledger), ``mask_url``
masks a URL's userinfo, query and fragment, ``shown_webhook`` keeps only its origin, and
``scrub_urls`` applies one of them to every URL inside a message (an aiohttp exception
may quote the URL it failed on).

URLs are cut with the generic pattern of RFC 3986 (appendix B) rather than
``urllib.parse``: the parts are replaced in the string as given, so unmasking gives back
the stored URL byte for byte and nothing is normalised on the way.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .errors import FieldError, ValidationFailed

__all__ = ["MASK", "mask_spec", "mask_url", "scrub_urls", "shown_webhook", "unmask_doc"]

MASK = "***"

# RFC 3986 appendix B; every group optional, so it matches any string.
_URI = re.compile(r"^(?:([^:/?#]+):)?(?://([^/?#]*))?([^?#]*)(?:\?([^#]*))?(?:#(.*))?$", re.DOTALL)
# A URL inside free text: it ends at whitespace, a quote or an angle bracket. Brackets stay
# inside (an IPv6 host is one); punctuation closing the sentence is given back by _TRAILING.
_URL_IN_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>]+")
_TRAILING = re.compile(r"[.,;:!)\]}]+$")


@dataclass(frozen=True, slots=True)
class _Url:
    scheme: str | None
    userinfo: str | None  # None: no "@" in the authority
    hostport: str | None  # None: no "//" authority at all
    path: str
    query: str | None  # None: no "?"
    fragment: str | None  # None: no "#"

    @classmethod
    def parse(cls, url: str) -> _Url:
        m = _URI.match(url)
        assert m is not None  # the pattern matches every string
        scheme, authority, path, query, fragment = m.groups()
        userinfo, hostport = None, authority
        if authority is not None and "@" in authority:
            userinfo, _, hostport = authority.rpartition("@")
        return cls(scheme, userinfo, hostport, path, query, fragment)

    def text(self) -> str:
        out = f"{self.scheme}:" if self.scheme is not None else ""
        if self.hostport is not None:
            out += "//" + (f"{self.userinfo}@" if self.userinfo is not None else "") + self.hostport
        out += self.path
        if self.query is not None:
            out += f"?{self.query}"
        if self.fragment is not None:
            out += f"#{self.fragment}"
        return out


def _masked(part: str | None) -> str | None:
    return MASK if part else part


def mask_url(url: str) -> str:
    """``url`` with its userinfo, query string and fragment (when not empty) each replaced by
    ``***``: ``https://***@host/path?***``. Scheme, host, port and path stay readable."""
    u = _Url.parse(url)
    return _Url(u.scheme, _masked(u.userinfo), u.hostport, u.path, _masked(u.query), _masked(u.fragment)).text()


def shown_webhook(url: str) -> str:
    """A webhook as a log line may print it: its origin only (``https://hooks.example/***``),
    since a Slack-style hook's path is its secret."""
    u = _Url.parse(url)
    if u.hostport is None:
        return MASK
    return f"{u.scheme}://{u.hostport}/{MASK}" if u.scheme is not None else f"//{u.hostport}/{MASK}"


def scrub_urls(text: str, shown: Callable[[str], str] = mask_url) -> str:
    """``text`` with every URL in it replaced by ``shown(url)``."""
    def one(m: re.Match[str]) -> str:
        url = m.group(0)
        tail = _TRAILING.search(url)
        cut = tail.start() if tail is not None else len(url)
        return shown(url[:cut]) + url[cut:]

    return _URL_IN_TEXT.sub(one, text)


def mask_spec(spec: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of a stored (canonical) job document with every secret masked; the stored one is
    not touched (views share it with the state machine)."""
    out = dict(spec)
    http = out.get("http")
    if isinstance(http, Mapping):
        http = out["http"] = dict(http)
        if isinstance(http.get("url"), str):
            http["url"] = mask_url(http["url"])
        if isinstance(http.get("headers"), Mapping):
            http["headers"] = dict.fromkeys(http["headers"], MASK)
    shell = out.get("shell")
    if isinstance(shell, Mapping) and isinstance(shell.get("env"), Mapping):
        out["shell"] = {**shell, "env": dict.fromkeys(shell["env"], MASK)}
    alerts = out.get("alerts")
    if isinstance(alerts, Mapping) and alerts.get("webhook") is not None:
        out["alerts"] = {**alerts, "webhook": MASK}
    return out


def unmask_doc(doc: Any, stored: Mapping[str, Any] | None) -> Any:
    """``doc`` (a job document sent for storage) with each ``***`` at a secret path replaced by
    the value stored at the same path in ``stored`` (the job's current canonical document, None
    for a new job). ``doc`` itself is not changed.

    Raises ``ValidationFailed`` naming every field that holds ``***`` where nothing is stored:
    storing the mask itself would wipe a secret without anyone having asked for it. Anything
    that is not of the expected shape is left for the job model to report.
    """
    if not isinstance(doc, dict):
        return doc
    problems: list[FieldError] = []
    old = stored or {}
    out = dict(doc)
    http, old_http = out.get("http"), _section(old, "http")
    if isinstance(http, dict):
        http = out["http"] = dict(http)
        if isinstance(http.get("url"), str):
            old_url = old_http.get("url")
            http["url"] = _unmask_url(http["url"], old_url if isinstance(old_url, str) else None, problems)
        _unmask_map(http, "headers", old_http, "http.headers", problems)
    shell = out.get("shell")
    if isinstance(shell, dict):
        shell = out["shell"] = dict(shell)
        _unmask_map(shell, "env", _section(old, "shell"), "shell.env", problems)
    alerts = out.get("alerts")
    if isinstance(alerts, dict) and alerts.get("webhook") == MASK:
        kept = _section(old, "alerts").get("webhook")
        if isinstance(kept, str):
            out["alerts"] = {**alerts, "webhook": kept}
        else:
            problems.append(_nothing_stored("alerts.webhook"))
    if problems:
        raise ValidationFailed(problems)
    return out


def _section(doc: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = doc.get(key)
    return value if isinstance(value, Mapping) else {}


def _nothing_stored(field: str, what: str = "the value") -> FieldError:
    return {"field": field, "message": f"{what} is masked ({MASK}) but the stored job has none to keep; "
                                       "send the real value"}


def _unmask_map(section: dict[str, Any], key: str, old_section: Mapping[str, Any], where: str,
                problems: list[FieldError]) -> None:
    given = section.get(key)
    if not isinstance(given, dict) or MASK not in given.values():
        return
    old = old_section.get(key)
    old_map: Mapping[str, Any] = old if isinstance(old, Mapping) else {}
    kept = dict(given)
    for name, value in given.items():
        if value != MASK:
            continue
        if isinstance(old_map.get(name), str):
            kept[name] = old_map[name]
        else:
            problems.append(_nothing_stored(f"{where}.{name}"))
    section[key] = kept


def _unmask_url(url: str, old_url: str | None, problems: list[FieldError]) -> str:
    u = _Url.parse(url)
    if MASK not in (u.userinfo, u.query, u.fragment):
        return url
    o = _Url.parse(old_url) if old_url is not None else None
    parts: dict[str, str | None] = {}
    for name, given, kept in (("userinfo", u.userinfo, o and o.userinfo), ("query", u.query, o and o.query),
                              ("fragment", u.fragment, o and o.fragment)):
        if given == MASK and not kept:
            problems.append(_nothing_stored("http.url", f"its {name.replace('userinfo', 'user info')}"))
        parts[name] = kept if given == MASK and kept else given
    return _Url(u.scheme, parts["userinfo"], u.hostport, u.path, parts["query"], parts["fragment"]).text()
