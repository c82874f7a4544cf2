"""The routes, one router per resource; :func:`hapi_server.app.create_app` includes them."""

from . import extract, finetune, health, metrics, models, timings

__all__ = ["extract", "finetune", "health", "metrics", "models", "timings"]
