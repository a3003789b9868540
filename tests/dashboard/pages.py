"""Logging in to the dashboard the way a browser's form does, for the in-process page tests."""

from __future__ import annotations

import re

import httpx

CSRF = re.compile(r'name="csrf_token" value="([^"]+)"')


def csrf_of(html: str) -> str:
    match = CSRF.search(html)
    assert match is not None, "no CSRF token on the page"
    return match.group(1)


async def login(client: httpx.AsyncClient, key: str) -> httpx.Response:
    """GET the form, POST it with its token; the client keeps the cookies."""
    form = await client.get("/dashboard/login")
    assert form.status_code == 200
    return await client.post(
        "/dashboard/login", data={"key": key, "csrf_token": csrf_of(form.text)}
    )
