"""``tenure web``: serve the read-only page of tasks and holders."""

from __future__ import annotations

from ..errors import ConfigurationError
from ..stores import from_url as store_from_url
from .common import load_scheduler, url_of


async def web(url: str | None, host: str, port: int, app: str | None) -> None:
    try:
        import uvicorn

        from ..web import make_app
    except ImportError as exc:
        raise ConfigurationError(f"tenure web needs {exc.name}: pip install 'tenure[web]'") from exc
    scheduler = None
    if app is not None:
        scheduler, locks = load_scheduler(app, url, reading=True)
        store = locks.store
    else:
        store = store_from_url(url_of(url, reading=True))
    config = uvicorn.Config(
        make_app(store, scheduler), host=host, port=port, log_level="warning", lifespan="on"
    )
    server = uvicorn.Server(config)
    print(f"tenure web on http://{host}:{port}/ ({store.describe()}); Ctrl-C stops it", flush=True)
    await server.serve()
