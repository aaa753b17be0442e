"""``tenure web``: serve the page of tasks, holders and audit records
(read-only unless given a token file)."""

from __future__ import annotations

from ..errors import ConfigurationError
from ..stores import from_url as store_from_url
from .common import load_scheduler, url_of


async def web(
    url: str | None, host: str, port: int, app: str | None, token_file: str | None = None
) -> None:
    try:
        import uvicorn

        from ..web import make_app, read_tokens
    except ImportError as exc:
        raise ConfigurationError(f"tenure web needs {exc.name}: pip install 'tenure[web]'") from exc
    tokens = None if token_file is None else read_tokens(token_file)
    scheduler = None
    if app is not None:
        scheduler, locks = load_scheduler(app, url, reading=True)
        store = locks.store
    else:
        store = store_from_url(url_of(url, reading=True))
    config = uvicorn.Config(
        make_app(store, scheduler, tokens=tokens),
        host=host,
        port=port,
        log_level="warning",
        lifespan="on",
    )
    server = uvicorn.Server(config)
    acts = (
        "read-only"
        if tokens is None
        else f"acting for {len(tokens.entries)} token(s) of {token_file}"
    )
    print(
        f"tenure web on http://{host}:{port}/ ({store.describe()}; {acts}); Ctrl-C stops it",
        flush=True,
    )
    await server.serve()
