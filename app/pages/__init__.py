"""Browser pages served by the API itself: `install(app)` adds the routes under /ui and the
static files under /ui/static (our own small CSS and JavaScript: no library, no CDN, no build)."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles


def install(app: FastAPI) -> None:
    from .routes import HERE, SignInRequired, home_router, router, sign_in_redirect

    app.mount("/ui/static", StaticFiles(directory=HERE / "static"), name="ui-static")
    app.include_router(home_router)
    app.include_router(router)
    app.add_exception_handler(SignInRequired, sign_in_redirect)
