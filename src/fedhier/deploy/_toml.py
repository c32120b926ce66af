"""Reading and passing on a deployment's ``fit.toml`` (shared by every family's configuration dataclass)."""

from __future__ import annotations

import json
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any


class TomlFit:
    """Mixin of a frozen configuration dataclass with a ``from_toml(text, source)`` classmethod and a ``model`` name."""

    model: str

    @classmethod
    def read(cls, path: str | Path):
        """Read ``fit.toml``; a relative ``out`` is resolved against the file's folder."""
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"fit configuration {path} does not exist")
        config = cls.from_toml(path.read_text(), str(path))
        out = Path(config.out)
        if not out.is_absolute():
            config = config.replace(out=str((path.parent / out).resolve()))
        return config

    def replace(self, **changes: Any):
        return type(self)(**{**self.to_dict(), **changes})

    def to_dict(self) -> dict[str, Any]:
        """The fields as JSON values (tuples become lists)."""
        def plain(value):
            if isinstance(value, (tuple, list)):
                return [plain(v) for v in value]
            if isinstance(value, dict):
                return {k: plain(v) for k, v in value.items()}
            return value

        return {k: plain(v) for k, v in asdict(self).items()}

    def to_json(self) -> str:
        """The form that travels in the Flower run config (key ``RUN_CONFIG_KEY``), with ``model``."""
        return json.dumps({"model": self.model, **self.to_dict()}, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str):
        values = json.loads(text)
        if "model" not in {f.name for f in fields(cls)} and values.pop("model", cls.model) != cls.model:
            raise ValueError(f"the run configuration is not a {cls.model} fit")
        return cls(**values)
