"""TIDE's ML core: a plain library shared by the CLI, the API and the worker.

It imports neither FastAPI nor Celery; everything the service needs flows through
`extension.pipeline.run(spec, callbacks)`.
"""
