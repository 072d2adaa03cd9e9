"""The REST service: `create_app(settings)` (FastAPI), served by `memsweep serve`."""

from service.api.app import create_app

__all__ = ["create_app"]
