"""Log lines that repeat every round (a numerical safeguard that fires again and again): the first of each
kind at its level, the repeats at DEBUG, so ``logging.basicConfig(level=logging.INFO)`` shows each once."""

from __future__ import annotations

import logging
import re

__all__ = ["OnceLog"]

_NUMBER = re.compile(r"[-+]?\d+(\.\d*)?([eE][-+]?\d+)?")


class OnceLog:
    """``once(kind, msg, *args)`` logs ``msg % args`` to ``logger`` at ``level`` the first time a ``kind`` is seen
    in this process (followed by "(repeats at DEBUG)"), and at DEBUG afterwards.

    ``kind`` is text naming what happened; numbers in it are ignored, so "iteration 3: sigma2_W 0.12 capped"
    and "iteration 7: sigma2_W 0.08 capped" are one kind.
    """

    def __init__(self, logger: logging.Logger, level: int = logging.INFO):
        self.logger = logger
        self.level = level
        self._seen: set[str] = set()

    def __call__(self, kind: str, msg: str, *args) -> None:
        key = _NUMBER.sub("#", kind)
        if key in self._seen:
            self.logger.debug(msg, *args)
            return
        self._seen.add(key)
        self.logger.log(self.level, msg + " (repeats at DEBUG)", *args)
