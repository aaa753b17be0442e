"""The contract suite runs on every store and on the deployments that only it
covers (``CONTRACT_ONLY``: Redis under Sentinel)."""

from __future__ import annotations

from ..conftest import CONTRACT_ONLY, STORES, store_fixtures

kind, shared_kind = store_fixtures({**STORES, **CONTRACT_ONLY})
