"""The small data set the attack tests fit: sites of two views drawn from one PPCA with a shared latent, in [0, 1]."""

import numpy as np

#: view -> number of features
VIEWS = {"a": 4, "b": 3}


def two_view_sites(n_sites: int = 3, n: int = 50, seed: int = 0) -> list[dict[str, np.ndarray]]:
    """``n_sites`` sites of ``n`` subjects, each ``{view: (n, d)}``: x ~ N(0, I_2), view = clip(0.5 + W_v x + noise, 0, 1)."""
    rng = np.random.default_rng(seed)
    W = {v: rng.uniform(-0.3, 0.3, size=(d, 2)) for v, d in VIEWS.items()}
    out = []
    for _ in range(n_sites):
        x = rng.normal(size=(n, 2))
        out.append({v: np.clip(0.5 + x @ W[v].T + 0.05 * rng.normal(size=(n, d)), 0, 1) for v, d in VIEWS.items()})
    return out
