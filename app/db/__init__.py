"""Persistence: the database is the truth about jobs, files and API keys (Celery carries ids only).

Plain SQLAlchemy, no FastAPI: the worker and the CLI use it too.
"""
