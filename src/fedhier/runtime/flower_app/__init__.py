"""Flower app template shipped with fedhier: ``pyproject.toml`` (for ``flwr run``),
``server_app.py`` / ``client_app.py`` (entry points) and ``fit.toml`` (an example fit)."""
