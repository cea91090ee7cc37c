"""The voice agent's browser page: `GET /` and `/agent` (HTML), `/agent/static/{name}` (its JS and CSS).

Plain files shipped in `voxgate/web/` (package data), read once and served as they are: no
build step, no templating. The page talks to `POST /v1/agent/offer` like any other client;
being static and public, its paths are open where API keys are set (the page sends the key
given as `?key=` with its API calls).
"""

from __future__ import annotations

from functools import cache
from importlib import resources

from fastapi import APIRouter
from fastapi.responses import Response

from voxgate.types import NotFound

router = APIRouter()

_TYPES = {"agent.html": "text/html; charset=utf-8", "agent.js": "text/javascript; charset=utf-8",
          "agent.css": "text/css; charset=utf-8"}  # fmt: skip
STATIC = tuple(f"/agent/static/{name}" for name in _TYPES if name != "agent.html")
PAGE_PATHS = ("/", "/agent", *STATIC)


@cache
def _file(name: str) -> bytes:
    return (resources.files("voxgate") / "web" / name).read_bytes()


def _serve(name: str) -> Response:
    return Response(_file(name), media_type=_TYPES[name], headers={"cache-control": "no-cache"})


@router.get("/", include_in_schema=False)
@router.get("/agent", include_in_schema=False)
async def agent_page() -> Response:
    """The voice agent page."""
    return _serve("agent.html")


@router.get("/agent/static/{name}", include_in_schema=False)
async def agent_static(name: str) -> Response:
    """The page's script and style sheet (only those)."""
    if name not in _TYPES or name == "agent.html":
        raise NotFound(f"no page file {name!r}")
    return _serve(name)
