"""tenure for Celery (``pip install 'tenure[celery]'``).

* ``SingletonTask``: ``@app.task(base=SingletonTask)`` runs at most once at a
  time across every worker for the same key (``singleton``).
* ``BeatScheduler``: ``celery beat -S tenure.celery.BeatScheduler`` on several
  hosts, each occurrence sent at most once, another beat taking over within
  a TTL when the sender dies (``beat``).

The store URL comes from the Celery app's configuration (``tenure_url``), or
else the ``TENURE_URL`` environment variable; each worker process makes its
own ``tenure.sync.LockService`` at first use (after the prefork pool forked).
"""

from __future__ import annotations

from .beat import BeatScheduler
from .service import locks_for
from .singleton import SingletonTask

__all__ = ("BeatScheduler", "SingletonTask", "locks_for")
