"""Lock tokens: unique across threads and across a fork."""

from __future__ import annotations

import os
import re
import threading

from tenure import _tokens
from tenure._tokens import new_token


def test_threads_never_share_a_token() -> None:
    minted: list[list[str]] = [[] for _ in range(8)]
    start = threading.Barrier(len(minted))

    def mint(out: list[str]) -> None:
        start.wait()
        out.extend(new_token() for _ in range(3000))

    threads = [threading.Thread(target=mint, args=(out,)) for out in minted]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    every = [token for out in minted for token in out]
    assert len(every) == 24000
    assert len(set(every)) == len(every)
    assert all(re.fullmatch("[0-9a-f]{32}", token) for token in every)


def test_a_forked_child_does_not_mint_its_parents_next_tokens() -> None:
    new_token()  # the pool now holds the parent's next tokens
    upcoming = set(_tokens._pool)
    assert upcoming
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.write(write, "".join(new_token() for _ in range(4)).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        child = pipe.read()
    os.waitpid(pid, 0)
    tokens = [child[i : i + 32] for i in range(0, len(child), 32)]
    assert len(tokens) == 4
    assert not upcoming & set(tokens)
