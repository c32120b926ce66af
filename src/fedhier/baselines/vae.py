"""VAE baselines of Fed-mv-PPCA, trained with FedAvg or FedProx (spec fed-mv-ppca §12.5, §14 row 27).

Models (networks in :mod:`._networks`, PyTorch, imported lazily):

* ``model="vae"`` -- a VAE on the concatenated views;
* ``model="mcvae"`` -- the multi-channel VAE of Antelmi et al. (ICML 2019);

each "linear" (``hidden=None``, the paper's main baselines) or "2-layer" (``hidden=64``).

Federation, one round (:class:`FederatedAveraging`):

* each site loads the broadcast parameter vector theta, runs ``n_epochs`` epochs of Adam
  (learning rate 1e-3, a fresh optimiser each round) on its negative ELBO, plus the
  proximal term (lambda / 2) ||theta_c - theta||^2 for FedProx (lambda > 0);
* it replies N_c theta_c and N_c (a plain sum, so secure summation applies);
* the global step is the N_c-weighted average theta = sum_c N_c theta_c / sum_c N_c ([R]).

[R] choices (§14 row 27, all assumptions): latent size q; mini-batches of 32 (or full batch);
widths 64; the mc-VAE latent is the average of the view-wise encoder means.  The baselines
cannot handle missing views: :meth:`FederatedVAE.fit` refuses a site lacking a view or a
subject lacking a view.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
from sklearn.base import BaseEstimator, TransformerMixin
from sklearn.utils.validation import check_is_fitted

from ..data.schema import ViewSchema
from ..data.validation import check_sites, check_views
from ..protocol.base import RoundProtocol, SiteContext
from ..protocol.messages import Field, Message, MessageSpec
from ..runtime.simulate import simulate
from ..estimators._input import NOT_FITTED, array_view, view_sites

__all__ = ["FederatedAveraging", "FederatedVAE", "torch_available"]

MODELS = ("vae", "mcvae")


def torch_available() -> bool:
    """True when PyTorch can be imported (``pip install -e ".[torch]"``)."""
    try:
        import torch  # noqa: F401
    except ModuleNotFoundError:
        return False
    return True


def _torch():
    try:
        import torch
    except ModuleNotFoundError as exc:  # pragma: no cover - depends on the environment
        raise ModuleNotFoundError(
            'the VAE baselines need PyTorch: pip install torch==2.13.0 (or pip install -e ".[torch]")'
        ) from exc
    return torch


def _check_complete(where: str, site: Mapping[str, np.ndarray], schema: ViewSchema) -> None:
    """Refuse a site (or input) lacking a view or with a subject lacking a view."""
    for view in schema.names:
        if view not in site:
            raise ValueError(f"{where} lacks view {view!r}: the VAE baselines cannot handle missing views")
        if np.isnan(site[view]).any():
            raise ValueError(f"{where}, view {view!r}: a subject lacks the view; the VAE baselines need complete data")


class FederatedAveraging(RoundProtocol):
    """FedAvg / FedProx round for a VAE baseline (module docstring).

    Parameters
    ----------
    schema : ViewSchema
    n_components : int, latent size q
    model : {"vae", "mcvae"}
    hidden : int or None, hidden width (None = linear)
    n_epochs : int, local epochs per round
    learning_rate : float, Adam step size
    batch_size : int or None, None = full batch
    proximal : float, FedProx weight lambda (0 = FedAvg)
    init_seed : int, seed of the public initial parameters
    """

    name = "fedavg-vae"
    combine = "sum"

    def __init__(
        self,
        schema: ViewSchema,
        n_components: int,
        *,
        model: str,
        hidden: int | None,
        n_epochs: int,
        learning_rate: float,
        batch_size: int | None,
        proximal: float,
        init_seed: int,
    ):
        self.schema = schema
        self.n_components = n_components
        self.model = model
        self.hidden = hidden
        self.n_epochs = n_epochs
        self.learning_rate = learning_rate
        self.batch_size = batch_size
        self.proximal = proximal
        self.init_seed = init_seed
        n_params = sum(p.numel() for p in self.network().parameters())
        self._reply_spec = MessageSpec(
            "fedavg-reply",
            {"weighted_params": Field((n_params,)), "n_samples": Field(()), "weighted_loss": Field(())},
        )
        self._broadcast_spec = MessageSpec("fedavg-broadcast", {"params": Field((n_params,))})

    @property
    def reply_spec(self) -> MessageSpec:
        return self._reply_spec

    @property
    def broadcast_spec(self) -> MessageSpec:
        return self._broadcast_spec

    def network(self):
        """A fresh network of this protocol's architecture (torch default initialisation)."""
        from ._networks import build_network

        return build_network(self.model, self.schema.dims, self.n_components, self.hidden)

    def initial_broadcast(self) -> Message:
        torch = _torch()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.init_seed)
            net = self.network()
        return {"params": torch.nn.utils.parameters_to_vector(net.parameters()).detach().numpy().copy()}

    def validate_site_data(self, site: int, data: Any) -> None:
        _check_complete(f"site {site}", data, self.schema)

    def site_step(self, ctx: SiteContext, broadcast: Message) -> Message:
        """The site's ``n_epochs`` of Adam from the broadcast theta, on one torch thread: the networks are small
        (widths up to 64), and on a busy machine torch's threads per product only wait for each other (a default
        fit on 30 rows of 3 features took 126 s with torch's default threads beside other jobs, about 1 s with one)."""
        torch = _torch()
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            return self._local_epochs(ctx, broadcast)
        finally:
            torch.set_num_threads(threads)

    def _local_epochs(self, ctx: SiteContext, broadcast: Message) -> Message:
        """Replies ``N_c theta_c``, ``N_c`` and ``N_c`` times the site's final negative ELBO."""
        torch = _torch()
        net = self.network()
        torch.nn.utils.vector_to_parameters(
            torch.from_numpy(np.array(broadcast["params"], dtype=np.float64)), net.parameters()
        )
        generator = torch.Generator().manual_seed(int(ctx.rng.integers(2**63 - 1)))
        x = torch.from_numpy(np.hstack([np.asarray(ctx.data[v], dtype=np.float64) for v in self.schema.names]))
        n = x.shape[0]
        batch = n if self.batch_size is None else min(self.batch_size, n)
        params = list(net.parameters())
        anchors = [p.detach().clone() for p in params]
        optimiser = torch.optim.Adam(params, lr=self.learning_rate, fused=True)
        for _ in range(self.n_epochs):
            order = torch.randperm(n, generator=generator)
            for start in range(0, n, batch):
                rows = order[start : start + batch]
                loss = net.negative_elbo(torch.split(x[rows], self.schema.dims, dim=1), generator)
                optimiser.zero_grad()
                loss.backward()
                if self.proximal > 0:  # gradient of the FedProx term (lambda / 2) ||theta - anchor||^2
                    with torch.no_grad():
                        for p, a in zip(params, anchors):
                            p.grad.add_(p - a, alpha=self.proximal)
                optimiser.step()
        with torch.no_grad():
            final_loss = float(net.negative_elbo(torch.split(x, self.schema.dims, dim=1), generator))
        theta = torch.nn.utils.parameters_to_vector(net.parameters()).detach().numpy()
        return {
            "weighted_params": n * theta,
            "n_samples": np.asarray(float(n)),
            "weighted_loss": np.asarray(n * final_loss),
        }

    def global_step(self, combined: Message, round: int, previous: Message) -> Message:
        return {"params": combined["weighted_params"] / combined["n_samples"]}

    def round_metrics(self, combined: Message, round: int) -> dict[str, float]:
        return {"negative_elbo": float(combined["weighted_loss"] / combined["n_samples"])}


class FederatedVAE(TransformerMixin, BaseEstimator):
    """A VAE baseline trained across sites with FedAvg (``proximal=0``) or FedProx.

    Parameters
    ----------
    n_components : int, default 5
        Latent size (= q of Fed-mv-PPCA, [R]).
    model : {"vae", "mcvae"}
        VAE on concatenated views, or multi-channel VAE (Antelmi et al. 2019).
    hidden : int or None, default None
        None: linear encoders and decoders [P]; an int: one hidden layer of that width (2-layer).
    n_rounds, n_epochs : int, default 100 and 15
        Communication rounds and local epochs per round [P].
    learning_rate : float, default 1e-3
        Adam step size [P; Adam is R].
    batch_size : int or None, default 32
        Mini-batch size; None trains on the full local data at each step.
    proximal : float, default 0
        FedProx weight lambda; the paper sweeps {0.01, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5}.
    random_state : int or None
        Seed of the initial parameters, the mini-batches and the reparameterisation draws.

    Attributes
    ----------
    schema_ : ViewSchema
    params_ : ndarray (n_params,)
        Final global parameter vector.
    history_ : list of dict
        Per round: mean negative ELBO over subjects, bytes sent.
    """

    def __init__(
        self,
        n_components: int = 5,
        *,
        model: str = "vae",
        hidden: int | None = None,
        n_rounds: int = 100,
        n_epochs: int = 15,
        learning_rate: float = 1e-3,
        batch_size: int | None = 32,
        proximal: float = 0.0,
        random_state: int | None = None,
    ):
        self.n_components = n_components
        self.model = model
        self.hidden = hidden
        self.n_rounds = n_rounds
        self.n_epochs = n_epochs
        self.learning_rate = learning_rate
        self.batch_size = batch_size
        self.proximal = proximal
        self.random_state = random_state

    def _check_params(self) -> None:
        if self.model not in MODELS:
            raise ValueError(f"model must be one of {MODELS}, got {self.model!r}")
        for name in ("n_components", "n_rounds", "n_epochs"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        for name in ("hidden", "batch_size"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1):
                raise ValueError(f"{name} must be None or a positive integer, got {value!r}")
        if not (np.isfinite(self.learning_rate) and self.learning_rate > 0):
            raise ValueError(f"learning_rate must be positive, got {self.learning_rate!r}")
        if not (np.isfinite(self.proximal) and self.proximal >= 0):
            raise ValueError(f"proximal (the FedProx lambda) must be >= 0, got {self.proximal!r}")

    def fit(self, X: Any, y: None = None, groups: Any = None) -> "FederatedVAE":
        """Train on the sites' data, every view at every site: a list of sites ``{view: (n_c, d_view) array}``,
        or pooled views with ``groups`` (the site of each row), or one mapping or one array (one site;
        an array is one view), as :meth:`fedhier.estimators.mvppca.FedMVPPCA.fit`.  ``y`` is ignored.

        Raises
        ------
        ValueError
            On bad parameters, or when a site or a subject lacks a view.
        """
        self._check_params()
        sites, schema = check_sites(view_sites(self, X, groups), min_subjects=2)
        for s, site in enumerate(sites):
            _check_complete(f"site {s}", site, schema)
        seed = int(np.random.SeedSequence(self.random_state).generate_state(1)[0])
        protocol = FederatedAveraging(
            schema,
            self.n_components,
            model=self.model,
            hidden=self.hidden,
            n_epochs=self.n_epochs,
            learning_rate=self.learning_rate,
            batch_size=self.batch_size,
            proximal=self.proximal,
            init_seed=seed,
        )
        result = simulate(protocol, sites, n_rounds=self.n_rounds, random_state=seed, min_sites=len(sites))
        self.schema_ = schema
        self.params_ = np.asarray(result.broadcast["params"], dtype=np.float64)
        self.history_ = [
            {
                "round": r.round,
                "negative_elbo": r.metrics["negative_elbo"],
                "bytes_sent": int(sum(r.bytes_up.values())),
            }
            for r in result.history
        ]
        self._protocol = protocol
        return self

    def _network(self):
        check_is_fitted(self, "params_", msg=NOT_FITTED)
        torch = _torch()
        net = self._protocol.network()
        torch.nn.utils.vector_to_parameters(torch.from_numpy(self.params_.copy()), net.parameters())
        return net

    def _tensors(self, X: Mapping[str, Any]):
        torch = _torch()
        views = check_views(array_view(self, X), self.schema_)
        _check_complete("X", views, self.schema_)
        return [torch.from_numpy(views[v]) for v in self.schema_.names]

    def transform(self, X: Mapping[str, Any]) -> np.ndarray:
        """Latent means (n, q): the encoder mean (VAE) or the average of the view-wise means (mc-VAE)."""
        torch = _torch()
        net, views = self._network(), self._tensors(X)
        with torch.no_grad():
            return net.latent(views).numpy()

    def reconstruct(self, X: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """Decoder means at the latent means, ``{view: (n, d_view)}`` for every view."""
        torch = _torch()
        net, views = self._network(), self._tensors(X)
        with torch.no_grad():
            return {v: t.numpy() for v, t in zip(self.schema_.names, net.reconstruct(views))}
