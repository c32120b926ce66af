"""Membership of the sole observer of a view, attacked as the coordinator would, record- and client-level.

The adversary knows every subject of the site but one, and that one's values: D holds the
subject, the only one at the site with view b; D' lacks it, so the site's data has no view b
at all (as a site file with b's columns empty at every row is read).  The coordinator
receives the site's round-1 reply -- the bytes :func:`fedhier.runtime.simulate.run_site_step`
encodes, the noise from the operating system's entropy -- 300 times from each data set and
scores each reply with its best test on the whole reply:

* anything raw about view b: a field saying the site measures it, view b's fields present,
  or view b's blocks sent as exact zeros (a noisy release is never exactly zero) -- decisive;
* otherwise the likelihood-ratio direction of the Gaussian noise: the released moments
  projected on the subject's own z z^T (record level), the released mean of view b
  projected on the subject's values minus the public anchor (client level).

The threshold is chosen on the first 150 draws of each side and two-sided Clopper--Pearson
95 % bounds on the other 150 give an empirical epsilon lower bound (:mod:`audit_bounds`),
which must stay below the claimed epsilon.  The same attack on a far larger epsilon shows
that it has the power to refute a false claim.
"""

import numpy as np
import pytest
from audit_bounds import empirical_epsilon_lower_bound

from fedhier.data.schema import ViewSchema
from fedhier.models.mvppca import record_dp as mv_rdp
from fedhier.models.mvppca.dp import DPConfig
from fedhier.privacy.analyze_gauss import RecordDP, record_vectors
from fedhier.protocol.messages import decode, encode
from fedhier.protocol.mvppca import MVPPCAProtocol
from fedhier.protocol.record_dp import MVPPCARecordDPProtocol
from fedhier.runtime.simulate import run_site_step

DRAWS = 300  # per data set
DELTA = 1e-5
CLAIM = 1.0
DECISIVE = 1e6  # the score of a reply that shows view b's presence outright
SCHEMA = ViewSchema(("a", "b"), (4, 3))


def _neighbours(n=12, seed=3):
    """D: n subjects with view a, the first of them alone with view b (values far from the centre); D' without it."""
    rng = np.random.default_rng(seed)
    a = rng.uniform(0.3, 0.7, size=(n, 4))
    b = np.full((n, 3), np.nan)
    b[0] = [0.95, 0.05, 0.9]
    return {"a": a, "b": b}, {"a": a[1:]}


def _replies(protocol, data, draws=DRAWS):
    """``draws`` round-1 replies of the site, decoded as the coordinator decodes them."""
    broadcast = encode(protocol.site_broadcast_spec, protocol.initial_broadcast())
    out = []
    for _ in range(draws):
        status, reply, _ = run_site_step(protocol, data, 0, 1, None, broadcast, {})
        assert status == "ok", reply
        out.append(decode(protocol.reply_spec, reply))
    return out


def _bound(scores_d, scores_d_prime):
    """Empirical epsilon lower bound (95 %) of the best threshold chosen on the first half of the draws."""
    half = scores_d.size // 2
    thresholds = np.r_[0.0, np.quantile(np.r_[scores_d[:half], scores_d_prime[:half]], np.linspace(0.01, 0.99, 99))]
    return empirical_epsilon_lower_bound(scores_d, scores_d_prime, DELTA, thresholds, alpha=0.05)


# ------------------------------------------------------------------ record level
def _record_score(subject_b):
    """The coordinator's test on a record-level reply (module docstring)."""
    blocks, indices = mv_rdp.layout(SCHEMA.dims)
    clip = mv_rdp.default_clip(SCHEMA.dims)
    values = np.zeros((1, sum(SCHEMA.dims)))
    values[0, blocks[1]] = subject_b - mv_rdp.CENTRE
    indicators = np.array([[0.0, 1.0]])
    z = record_vectors(values, indicators, clip)[0]
    rows, cols = np.triu_indices(z.size)
    direction = np.outer(z, z)[rows, cols]
    direction /= np.linalg.norm(direction)
    b = np.r_[np.arange(blocks[1].start, blocks[1].stop), indices[1]]

    def score(reply):
        if "observed" in reply:
            return DECISIVE * (2 * reply["observed"][1] - 1)
        M = reply["moments"]
        if not np.any(M[b]):
            return -DECISIVE
        return float(M[rows, cols] @ direction)

    return score


def _record_level_bound(epsilon):
    D, D_prime = _neighbours()
    protocol = MVPPCARecordDPProtocol(SCHEMA, 2, RecordDP(epsilon, DELTA))
    score = _record_score(D["b"][0])
    return _bound(np.array([score(r) for r in _replies(protocol, D)]),
                  np.array([score(r) for r in _replies(protocol, D_prime)]))


def test_record_level_dp_hides_the_sole_observer_of_a_view():
    assert _record_level_bound(CLAIM) < CLAIM


def test_record_level_attack_has_the_power_to_refute_a_false_claim():
    # the same release at epsilon = 200, claimed to be 1: the projection on z z^T gives the subject away
    assert _record_level_bound(200.0) > CLAIM


# ------------------------------------------------------------------ client level
def _client_protocol(epsilon):
    config = DPConfig.total(epsilon, DELTA, n_rounds=1, n_views=2, spread=True)
    return MVPPCAProtocol(SCHEMA, 2, n_local_iter=2, n_first_iter=3, privacy=config)


def _client_score(protocol, subject_b):
    """The coordinator's test on a site-level reply (module docstring); the anchor is public."""
    anchor = protocol.initial_prior["b"].mu
    direction = (subject_b - anchor) / np.linalg.norm(subject_b - anchor)

    def score(reply):
        if "b/count" not in reply:
            return -DECISIVE
        return float((reply["b/sum_mu"] - anchor) @ direction)

    return score


def _client_level_bound(epsilon):
    D, D_prime = _neighbours()
    protocol = _client_protocol(epsilon)
    score = _client_score(protocol, D["b"][0])
    return _bound(np.array([score(r) for r in _replies(protocol, D)]),
                  np.array([score(r) for r in _replies(protocol, D_prime)]))


def test_client_level_dp_hides_the_sole_observer_of_a_view():
    """Protecting the whole site implies protecting one subject: also the one who alone measures a view."""
    assert _client_level_bound(CLAIM) < CLAIM


def test_client_level_attack_has_the_power_to_refute_a_false_claim():
    assert _client_level_bound(2000.0) > CLAIM


@pytest.mark.parametrize("make", [lambda: MVPPCARecordDPProtocol(SCHEMA, 2, RecordDP(CLAIM, DELTA)),
                                  lambda: _client_protocol(CLAIM)])
def test_the_reply_has_the_same_fields_whether_or_not_the_site_measures_a_view(make):
    protocol = make()
    D, D_prime = _neighbours()
    with_b, without_b = _replies(protocol, D, 1)[0], _replies(protocol, D_prime, 1)[0]
    assert sorted(with_b) == sorted(without_b)
    if "moments" in without_b:  # record level: a view nobody measures is noise, not zeros
        assert np.all(without_b["moments"] != 0)
