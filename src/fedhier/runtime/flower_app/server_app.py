"""ServerApp entry point of the fedhier Flower app (see ``fedhier.runtime.flower`` and ``fedhier.deploy``)."""

from fedhier.deploy.apps import server_app as app

__all__ = ["app"]
