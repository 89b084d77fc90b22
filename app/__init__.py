"""TIDE service and CLI: thin layers over `extension` (the ML core) and `worker` (Celery)."""
