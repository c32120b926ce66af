"""The view schema shared by all sites: view names in a fixed order and their dimensions.

Every site is a mapping ``view name -> float64 array (n, d_view)``; a view absent from the
mapping is not measured by that site (spec fed-mv-ppca §2.3).  The schema is the one small
object that fixes the view order K = (view_1, ..., view_K) and the dimensions d_k used to stack
views (§2.2) and to check messages.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

__all__ = ["ViewSchema"]


@dataclass(frozen=True)
class ViewSchema:
    """View names in their fixed order and the dimension d_k of each (spec §1, §2.2).

    Attributes
    ----------
    names : tuple of str, length K
        View names, in the order used to stack views.
    dims : tuple of int, length K
        ``dims[k]`` is the number of features d_k of view ``names[k]``.
    """

    names: tuple[str, ...]
    dims: tuple[int, ...]

    def __post_init__(self) -> None:
        names = tuple(self.names)
        dims = tuple(self.dims)
        if len(names) != len(dims):
            raise ValueError(f"ViewSchema: {len(names)} view names but {len(dims)} dimensions")
        for name in names:
            if not isinstance(name, str) or not name:
                raise ValueError(f"ViewSchema: view names must be non-empty strings, got {name!r}")
        if len(set(names)) != len(names):
            duplicated = sorted({n for n in names if names.count(n) > 1})
            raise ValueError(f"ViewSchema: duplicate view names {duplicated}")
        for name, d in zip(names, dims):
            if isinstance(d, (bool, np.bool_)) or not isinstance(d, (int, np.integer)) or d < 1:
                raise ValueError(f"ViewSchema: view {name!r} has dimension {d!r}; expected a positive integer")
        object.__setattr__(self, "names", names)
        object.__setattr__(self, "dims", tuple(int(d) for d in dims))

    @classmethod
    def from_sites(
        cls, sites: Sequence[Mapping[str, Any]], site_names: Sequence[str] | None = None
    ) -> "ViewSchema":
        """Union of the views of all sites, in first-seen order.

        Parameters
        ----------
        sites : sequence of mappings ``view name -> array (n, d_view)``
        site_names : optional sequence of str, used in error messages.

        Raises
        ------
        ValueError
            If a view has different dimensions at two sites (names both sites, the view and
            both dimensions), or a view array is not 2-D.
        """
        dims: dict[str, int] = {}
        first_site: dict[str, int] = {}
        for s, site in enumerate(sites):
            for view, X in site.items():
                shape = np.shape(X)
                if len(shape) != 2:
                    raise ValueError(
                        f"{_site_label(s, site_names)}, view {view!r}: expected a 2-D array (n, d), got shape {shape}"
                    )
                d = int(shape[1])
                if view not in dims:
                    dims[view] = d
                    first_site[view] = s
                elif dims[view] != d:
                    raise ValueError(
                        f"view {view!r} has dimension {dims[view]} at {_site_label(first_site[view], site_names)} "
                        f"but dimension {d} at {_site_label(s, site_names)}"
                    )
        return cls(tuple(dims), tuple(dims.values()))

    def __contains__(self, view: object) -> bool:
        return view in self.names

    def __len__(self) -> int:
        return len(self.names)

    def dim(self, view: str) -> int:
        """Dimension d_k of ``view``; ValueError if the view is not in the schema."""
        return self.dims[self.index(view)]

    def index(self, view: str) -> int:
        """Position k of ``view`` in the view order; ValueError if the view is not in the schema."""
        try:
            return self.names.index(view)
        except ValueError:
            raise ValueError(f"unknown view {view!r}; the schema has views {list(self.names)}") from None

    @property
    def total_dim(self) -> int:
        """d = sum_k d_k (spec §1)."""
        return sum(self.dims)

    def to_dict(self) -> dict[str, list]:
        """JSON-safe form ``{"names": [...], "dims": [...]}``."""
        return {"names": list(self.names), "dims": list(self.dims)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "ViewSchema":
        """Inverse of :meth:`to_dict`."""
        if not isinstance(data, Mapping) or set(data) != {"names", "dims"}:
            raise ValueError(f"ViewSchema.from_dict expects a mapping with keys 'names' and 'dims', got {data!r}")
        return cls(tuple(data["names"]), tuple(data["dims"]))


def _site_label(index: int, site_names: Sequence[str] | None) -> str:
    """``site 2`` or ``site 2 ('Hungary')`` for error messages."""
    if site_names is not None and index < len(site_names):
        return f"site {index} ({site_names[index]!r})"
    return f"site {index}"
