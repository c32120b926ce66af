"""ServerApp entry point of the fedhier Flower app (see ``fedhier.runtime.flower``)."""

from fedhier.runtime.flower import server_app as app

__all__ = ["app"]
