"""Django management commands of tenure.django (``tenure_run``)."""
