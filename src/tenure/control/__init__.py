"""Control of a cluster through its store: pause, resume, run now, free a
lock, each audited (``operator``); a scheduler's side of it (``serving``);
what the store's control board holds (``records``)."""

from .operator import AUDIT_KEEP, TRIGGER_WAIT, Control
from .records import Action, Pause, Registration, RunRequest
from .serving import CONTROL_POLL, ControlWatch

__all__ = (
    "AUDIT_KEEP",
    "CONTROL_POLL",
    "TRIGGER_WAIT",
    "Action",
    "Control",
    "ControlWatch",
    "Pause",
    "Registration",
    "RunRequest",
)
