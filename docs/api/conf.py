"""Sphinx configuration of the API reference (``make docs``), built from the docstrings with numpydoc."""

project = "fedhier"
author = "fedhier developers"
extensions = ["sphinx.ext.autodoc", "numpydoc"]
autodoc_default_options = {"inherited-members": False, "show-inheritance": False}
autodoc_member_order = "bysource"
numpydoc_show_class_members = False
numpydoc_class_members_toctree = False
exclude_patterns = ["_build"]
html_theme = "alabaster"
# CI reaches only the package registries: the link check covers the references inside these pages and never
# fetches an outside address (the Markdown pages' relative links are checked by docs/check_links.py).
linkcheck_ignore = [r"^[a-z][a-z0-9+.-]*://"]
