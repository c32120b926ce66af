"""The Flower apps of fedhier: :data:`server_app` and :data:`client_app` for every model family.

Both are the generic apps of :mod:`fedhier.runtime.flower`, resolving the run config's fit
with :func:`fedhier.deploy.fit_from_json`; ``fedhier/runtime/flower_app/`` points Flower at them.
"""

from __future__ import annotations

from ..runtime.flower import make_client_app, make_server_app
from . import fit_from_json

__all__ = ["server_app", "client_app"]

server_app = make_server_app(fit_from_json)
client_app = make_client_app(fit_from_json)
