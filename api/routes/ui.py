"""GET /ui/: the dashboard, a static page (api/static) that polls the JSON API of the same origin.

The page and its assets are public (no token): a browser navigating to /ui/ cannot send an
``Authorization`` header, and the files hold no cluster data: every fact the page shows comes from
/v1/... calls, which need the token as always (the page asks for it on a 401 and keeps it in the
browser's local storage). These routes are not in /openapi.json: they are not the JSON API.
"""

from __future__ import annotations

from functools import cache
from importlib import resources
from typing import Any

from aiohttp import web

from ..routing import Handler, Route

__all__ = ["ASSETS", "ROUTES"]

_TYPES = {".html": "text/html", ".js": "text/javascript", ".css": "text/css", ".svg": "image/svg+xml"}
_HEADERS = {
    "Cache-Control": "no-cache",  # revalidate, so an upgraded agent never runs with yesterday's script
    "X-Content-Type-Options": "nosniff",
    # Only this origin's script and style: data is put in with textContent, and this is the backstop.
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'",
}


def _static() -> Any:
    return resources.files("api").joinpath("static")


ASSETS: tuple[str, ...] = tuple(sorted(
    p.name for p in _static().iterdir() if p.is_file() and p.name != "index.html" and p.name[:1] != "."
))


@cache
def _file(name: str) -> bytes:
    # Read once: the files are small and part of the installed package.
    return bytes(_static().joinpath(name).read_bytes())


def _serve(name: str) -> web.Response:
    suffix = name[name.rfind("."):]
    return web.Response(body=_file(name), content_type=_TYPES.get(suffix, "application/octet-stream"),
                        charset="utf-8" if suffix != ".svg" else None, headers=_HEADERS)


async def _index(request: web.Request, args: dict[str, Any]) -> web.Response:
    return _serve("index.html")


async def _redirect(request: web.Request, args: dict[str, Any]) -> web.Response:
    # Returned, not raised: an HTTPFound raised would cross the middlewares as an exception.
    return web.Response(status=302, headers={"Location": "/ui/"})


def _asset(name: str) -> Handler:
    async def asset(request: web.Request, args: dict[str, Any]) -> web.Response:
        return _serve(name)

    asset.__name__ = f"_ui_{name.replace('.', '_')}"
    return asset


ROUTES = [
    Route("GET", "/ui", _redirect, "Redirect to /ui/", tag="ui", public=True, openapi=False),
    Route("GET", "/ui/", _index, "The dashboard", responses={200: "html"}, tag="ui", public=True, openapi=False),
    # One fixed route per shipped file rather than a {path} pattern: nothing outside api/static is reachable.
    *(Route("GET", f"/ui/static/{name}", _asset(name), f"Dashboard asset {name}", tag="ui", public=True,
            openapi=False) for name in ASSETS),
]
