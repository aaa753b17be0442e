"""The commands: ``tenure_run``."""
