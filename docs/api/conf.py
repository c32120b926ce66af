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
