"""Plain HTTP GETs (stdlib) for package-index metadata, with clear errors when an index is unreachable."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from imagekit.errors import EnvironmentFailure

T = TypeVar("T")
SIMPLE_JSON = "application/vnd.pypi.simple.v1+json"


def get(url: str, accept: str | None = None, timeout: float = 30.0, attempts: int = 3) -> bytes:
    last: Exception | None = None
    for _ in range(attempts):
        req = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                return resp.read()
        except urllib.error.HTTPError as exc:
            if exc.code < 500:
                raise EnvironmentFailure(f"GET {url} answered HTTP {exc.code}", "check the index URL") from exc
            last = exc
        except (urllib.error.URLError, TimeoutError, OSError) as exc:
            last = exc
    raise EnvironmentFailure(f"cannot reach {url}: {last}", "check network access to the package index")


def get_json(url: str, accept: str | None = None) -> dict:
    return json.loads(get(url, accept))


def map_concurrently(fn: Callable[[str], T], items: list[str], workers: int = 8) -> list[T]:
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(fn, items))
