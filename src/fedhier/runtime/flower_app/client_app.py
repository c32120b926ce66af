"""ClientApp entry point of the fedhier Flower app (see ``fedhier.runtime.flower`` and ``fedhier.deploy``)."""

from fedhier.deploy.apps import client_app as app

__all__ = ["app"]
