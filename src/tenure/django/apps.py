"""The Django app ``tenure.django``: settings checked when Django starts."""

from __future__ import annotations

from django.apps import AppConfig

__all__ = ("TenureConfig",)


class TenureConfig(AppConfig):
    name = "tenure.django"
    label = "tenure"
    verbose_name = "tenure"

    def ready(self) -> None:
        from . import check_settings

        check_settings()
