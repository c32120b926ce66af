"""Attacks on secure summation by a coordinator that deviates from the protocol, with no colluding site.

Each test plays the coordinator (the :class:`~fedhier.secure.secagg.SecAggServer` side and
everything it can send) against honest sites, and tries to learn one victim's input:

(a) key substitution: it plays every other site with keys it made itself, so the victim's
    shares are encrypted to it;
(b) the dropped-victim lie: it tells some sites that the victim sent its masked input and
    others that it dropped, collecting both kinds of share of the victim's secrets;
(c) the repeated round: it runs a round again with the same broadcast on a cohort without
    the victim and subtracts the two sums.

Each attack ends with an honest site refusing (a clear error) before anything that would
reveal the victim's input has left it; the attack is also checked to work when the defence
is missing (the site sketched as it was before), so the tests have power.  Honest secure
sums still equal plain ones with dropouts, and honest fits (FedLin EP, Fed-mv-PPCA) plain ones.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from fedhier.protocol.messages import Field, MessageSpec, decode
from fedhier.secure import keys as crypto
from fedhier.secure import secagg
from fedhier.secure.fixedpoint import PRIME, FixedPoint
from fedhier.secure.secagg import (
    InsufficientSitesError, SecAggParams, SecAggProtocolError, SecAggServer, SecAggSite, secure_sum,
)
from fedhier.secure.secure_round import SecureAggregator

FP = FixedPoint(frac_bits=24)
M = 64  # entries of each input
#: the honest sites' long-term keys, and the roster of their public keys every site was given
KEYS = {u: crypto.generate_signing_key() for u in range(6)}
ROSTER = {u: key.public_key() for u, key in KEYS.items()}


def _inputs(sites, seed):
    rng = np.random.default_rng(seed)
    return {u: rng.normal(scale=30.0, size=M) for u in sites}


def _honest(u, params, **kw):
    return SecAggSite(u, params, signing_key=KEYS[u], roster=ROSTER, **kw)


def _unmask_victim(params, y, victim, b, s_key, public):
    """The victim's input from its masked vector ``y``, its self-mask seed ``b``, its mask key and
    every other site's public mask key (what the attacker wants to hold)."""
    z = secagg._ring_sub(y, crypto.prg(b, params.length, PRIME), PRIME)
    for v in params.sites:
        if v == victim:
            continue
        seed = crypto.agree(s_key, public[v], salt=params.session, info=secagg._info(b"mask", min(v, victim), max(v, victim)))
        mask = crypto.prg(seed, params.length, PRIME)
        z = secagg._ring_sub(z, mask, PRIME) if v > victim else secagg._ring_add(z, mask, PRIME)
    return FP.decode(z)


def _rebuild(params, owner, shares):
    """The secret of ``owner`` from ``{holder: share}`` (Lagrange at 0, as the server does)."""
    holders = sorted(shares)[: params.threshold]
    elements = secagg.reconstruct(np.stack([shares[u] for u in holders]),
                                  np.array([params.point(u, owner) for u in holders]), modulus=PRIME)
    return secagg._elements_to_secret(elements, "secret")


# ------------------------------------------------------------------- (a) key substitution

def _substitute_keys(make_victim):
    """The server plays sites 1-4 itself (keys it generated, signed with keys of its own) against victim 0."""
    params = SecAggParams((0, 1, 2, 3, 4), 3, FP, M, b"substitution")
    x0 = _inputs((0,), seed=1)[0]
    victim = make_victim(params)
    fake_keys = {v: crypto.generate_signing_key() for v in (1, 2, 3, 4)}
    fake_roster = {0: ROSTER[0], **{v: k.public_key() for v, k in fake_keys.items()}}
    fakes = {v: SecAggSite(v, params, signing_key=fake_keys[v], roster=fake_roster) for v in (1, 2, 3, 4)}
    server = SecAggServer(params)
    sent = []  # what the victim lets out
    keys = server.collect_keys({0: victim.advertise_keys(), **{v: s.advertise_keys() for v, s in fakes.items()}})
    sent.append(victim.share_keys(keys))
    routed = server.route_shares({0: sent[-1], **{v: s.share_keys(keys) for v, s in fakes.items()}})
    sent.append(victim.masked_input(x0, routed[0]))
    y0 = decode(params.masked_spec, sent[-1])["y"]
    for v, fake in fakes.items():
        fake.masked_input(np.zeros(M), routed[v])
    # the fake sites decrypted the victim's shares: t of them rebuild b_0 and s_0^SK
    states = {v: decode(params.spec("site-state", v), s.to_state()) for v, s in fakes.items()}
    held = {v: states[v]["held_0"] for v in (1, 2, 3)}
    b0 = _rebuild(params, 0, {v: h[: secagg.SECRET_ELEMENTS] for v, h in held.items()})
    s0 = crypto.private_key_from_bytes(_rebuild(params, 0, {v: h[secagg.SECRET_ELEMENTS :] for v, h in held.items()}))
    public = {v: server._public[v][1] for v in params.sites}
    return _unmask_victim(params, y0, 0, b0, s0, public), x0


def test_key_substitution_makes_the_victim_abort_before_it_shares_anything():
    with pytest.raises(SecAggProtocolError, match="site 0: the keys listed for site 1 are not signed by its key in the roster"):
        _substitute_keys(lambda params: _honest(0, params))


def test_key_substitution_recovers_the_input_of_a_site_without_a_roster():
    # the same attack against a site that takes the server's key list on trust (the site before signatures)
    class Trusting(SecAggSite):
        def share_keys(self, key_list):
            self._roster = dict.fromkeys(self.params.sites, _Anything())
            return super().share_keys(key_list)

    recovered, x0 = _substitute_keys(lambda params: Trusting(0, params, signing_key=KEYS[0], roster=ROSTER))
    np.testing.assert_allclose(recovered, x0, atol=FP.precision)


class _Anything:
    """A public key that accepts every signature (what a site without a roster effectively checks against)."""

    def verify(self, *args):
        return None


# ------------------------------------------------------------ (b) the dropped-victim lie

def _lie(params, sites, x, victim, told_dropped):
    """Run the session honestly up to the masked inputs, then tell ``told_dropped`` that the victim dropped
    and everyone else that it did not; rebuild the victim's secrets from both kinds of share."""
    server = SecAggServer(params)
    keys = server.collect_keys({u: s.advertise_keys() for u, s in sites.items()})
    routed = server.route_shares({u: s.share_keys(keys) for u, s in sites.items()})
    masked = {u: sites[u].masked_input(x[u], routed[u]) for u in sites}
    y = decode(params.masked_spec, masked[victim])["y"]
    truth = np.ones(len(params.sites), dtype=bool)
    lie = truth.copy()
    lie[params.sites.index(victim)] = False
    listing = {u: secagg.encode(params.survivors_spec, {"included": lie if u in told_dropped else truth}) for u in sites}
    # each group's signatures go to that group only: within a group everything looks consistent
    signed = {u: sites[u].sign_survivors(listing[u]) for u in sites}
    sigs = {u: decode(params.consistency_spec, data)["sig"] for u, data in signed.items()}
    b_shares, sk_shares = {}, {}
    for u, site in sites.items():
        group = [v for v in sites if (v in told_dropped) == (u in told_dropped)]
        msg = decode(params.spec("unmask", u),
                     site.unmask(secagg.encode(params.spec("signatures", u), {f"sig_{v}": sigs[v] for v in group})))
        if f"b_{victim}" in msg:
            b_shares[u] = msg[f"b_{victim}"]
        if f"sk_{victim}" in msg:
            sk_shares[u] = msg[f"sk_{victim}"]
    b = _rebuild(params, victim, b_shares)
    s_key = crypto.private_key_from_bytes(_rebuild(params, victim, sk_shares))
    return _unmask_victim(params, y, victim, b, s_key, {v: server._public[v][1] for v in params.sites})


def test_the_dropped_victim_lie_with_half_the_sites_as_threshold_is_refused_by_the_sites():
    # t = n / 2 = 2 of 4: each half alone holds t shares, of b_0 and of s_0 -- the sites refuse such a session
    with pytest.raises(ValueError, match="threshold must be more than half of the 4 sites"):
        SecAggParams((0, 1, 2, 3), 2, FP, M, b"lie")


def test_the_dropped_victim_lie_works_when_a_half_holds_the_threshold():
    # power: with t = n / 2 (as a coordinator would set it, were the sites to accept it) the lie recovers x_0,
    # signatures and consistency round notwithstanding -- hence the sites' t > n / 2
    params = SecAggParams.__new__(SecAggParams)
    object.__setattr__(params, "sites", (0, 1, 2, 3))
    for name, value in (("threshold", 2), ("fixed_point", FP), ("length", M), ("session", b"lie"), ("neighbours", None)):
        object.__setattr__(params, name, value)
    x = _inputs(params.sites, seed=2)
    recovered = _lie(params, {u: _honest(u, params) for u in params.sites}, x, victim=0, told_dropped={2, 3})
    np.testing.assert_allclose(recovered, x[0], atol=FP.precision)


def test_the_dropped_victim_lie_makes_the_victim_abort_with_a_majority_threshold():
    # t = 3 of 5: the coordinator tells sites 2, 3 and 4 that the victim dropped.  Those three agree with each
    # other, but the victim's group ({0, 1}) sees only two signatures on its own list, fewer than t, and aborts
    # before revealing a share of b_0: the key shares of s_0 alone leave x_0 under its self mask.
    params = SecAggParams((0, 1, 2, 3, 4), 3, FP, M, b"lie")
    x = _inputs(params.sites, seed=3)
    with pytest.raises(InsufficientSitesError, match="step 'unmask': 2 site\\(s\\) remain \\[0, 1\\]"):
        _lie(params, {u: _honest(u, params) for u in params.sites}, x, victim=0, told_dropped={2, 3, 4})


def test_a_forwarded_signature_on_another_list_is_refused():
    # the coordinator hands the victim the signatures of sites told another list: they do not verify on its own
    params = SecAggParams((0, 1, 2, 3, 4), 3, FP, M, b"lie")
    sites = {u: _honest(u, params) for u in params.sites}
    server = SecAggServer(params)
    keys = server.collect_keys({u: s.advertise_keys() for u, s in sites.items()})
    routed = server.route_shares({u: s.share_keys(keys) for u, s in sites.items()})
    x = _inputs(params.sites, seed=4)
    for u in sites:
        sites[u].masked_input(x[u], routed[u])
    truth = secagg.encode(params.survivors_spec, {"included": np.ones(5, dtype=bool)})
    lie = secagg.encode(params.survivors_spec, {"included": np.array([False, True, True, True, True])})
    sigs = {u: decode(params.consistency_spec, sites[u].sign_survivors(truth if u < 2 else lie))["sig"] for u in sites}
    with pytest.raises(SecAggProtocolError, match="site 0: site 2 did not sign the survivor list this site was given"):
        sites[0].unmask(secagg.encode(params.spec("signatures", 0), {f"sig_{v}": sigs[v] for v in sites}))


# ----------------------------------------------------------------- (c) the repeated round

def _context(broadcast: bytes) -> bytes:
    """What a site computes from the analysis and the broadcast it was sent (never from the coordinator's word)."""
    return hashlib.sha256(b"analysis-1\0reply\0" + broadcast).digest()


def _sum(params, sites, x):
    server = SecAggServer(params)
    keys = server.collect_keys({u: s.advertise_keys() for u, s in sites.items()})
    routed = server.route_shares({u: s.share_keys(keys) for u, s in sites.items()})
    listing = server.collect_masked({u: sites[u].masked_input(x[u], routed[u]) for u in sites})
    signed = server.collect_signatures({u: sites[u].sign_survivors(listing) for u in sites})
    return server.unmask({u: sites[u].unmask(signed) for u in sites})


def _repeat_round(make_site):
    """Round r with every site, then the same broadcast again (fresh session label) without the victim."""
    broadcast = b"the global parameters of round r"
    x = _inputs((0, 1, 2, 3, 4), seed=5)  # each site's reply to that broadcast
    journals = {u: set() for u in x}
    first = SecAggParams((0, 1, 2, 3, 4), 3, FP, M, b"fedhier/reply/round-7")
    total = _sum(first, {u: make_site(u, first, journals[u], _context(broadcast)) for u in x}, x)
    again = SecAggParams((1, 2, 3, 4), 3, FP, M, b"fedhier/reply/round-7-again")
    rest = _sum(again, {u: make_site(u, again, journals[u], _context(broadcast)) for u in again.sites}, x)
    return total - rest, x[0]


def test_a_repeated_round_is_refused_by_the_sites_that_already_answered_it():
    with pytest.raises(SecAggProtocolError, match="site 1: this site already answered this reply to this broadcast"):
        _repeat_round(lambda u, params, journal, context: _honest(u, params, journal=journal, context=context))


def test_a_repeated_round_recovers_the_victim_from_sites_that_keep_no_journal():
    recovered, x0 = _repeat_round(lambda u, params, journal, context: _honest(u, params))
    np.testing.assert_allclose(recovered, x0, atol=5 * FP.precision)


def test_a_repeated_broadcast_is_refused_in_a_simulated_fit():
    # SecureAggregator keeps each simulated site's journal: the same context twice is refused
    spec = MessageSpec("reply", {"s": Field((3,), "float64")})
    replies = {u: {"s": np.full(3, float(u))} for u in range(3)}
    aggregator = SecureAggregator(3)
    aggregator.sum(spec, replies, 1, None, context=b"run-1/broadcast-digest")
    with pytest.raises(SecAggProtocolError, match="already answered"):
        aggregator.sum(spec, {u: replies[u] for u in (1, 2)}, 2, None, context=b"run-1/broadcast-digest")


# ----------------------------------------------------------- honest sums are unchanged

def test_honest_secure_sums_equal_plain_sums_with_dropouts():
    spec = MessageSpec("reply", {"mean": Field((4,), "float64"), "scatter": Field((4, 4), "float64")})
    rng = np.random.default_rng(6)
    replies = {u: {"mean": rng.normal(scale=50.0, size=4), "scatter": rng.normal(scale=50.0, size=(4, 4))} for u in range(7)}
    aggregator = SecureAggregator(7, frac_bits=36, drop_before_masking={1: [5]}, drop_after_masking={1: [2, 6]})
    total, _, contributors = aggregator.sum(spec, replies, 1, None, context=b"run")
    assert contributors == [0, 1, 2, 3, 4, 6]  # site 5 dropped before masking; 2 and 6 after, and still count
    for key in spec.fields:
        np.testing.assert_allclose(total[key], sum(replies[u][key] for u in contributors), rtol=0, atol=1e-9)
    # and on a sparse graph with a site dropping after masking
    x = {u: rng.normal(scale=50.0, size=M) for u in range(30)}
    result = secure_sum(x, threshold=4, fixed_point=FixedPoint(frac_bits=36, max_abs=2.0**14), neighbours=6, drop_after_masking=[3])
    np.testing.assert_allclose(result.total, sum(x.values()), rtol=0, atol=1e-9)


def test_honest_secure_fits_equal_plain_fits_with_dropouts_in_simulation():
    """FedLin's EP and Fed-mv-PPCA, two rounds summed securely with a site dropping after its masked input in
    round 2: the same global parameters as plain sums, to 1e-9 (relative, for Fed-mv-PPCA's large precisions)."""
    from fedhier.data.schema import ViewSchema
    from fedhier.models.fedlin.hierarchy import GaussianHierarchy
    from fedhier.models.fedlin.stats import SiteStats
    from fedhier.protocol.fedlin import EPProtocol
    from fedhier.protocol.mvppca import MVPPCAProtocol
    from fedhier.runtime.simulate import simulate

    rng = np.random.default_rng(4)
    stats = []
    for _ in range(5):  # linear regressions y = X theta_k + noise, one per site
        X = rng.standard_normal((30, 2))
        stats.append(SiteStats.from_data(X, X @ (np.array([1.0, -0.5]) + 0.5 * rng.standard_normal(2)) + 0.3 * rng.standard_normal(30)))
    ep = EPProtocol(GaussianHierarchy(2, covariance="fixed", tau=[0.5, 0.5], noise=0.09), max_rounds=2)
    views = {"a": 4, "b": 3}
    W = {v: rng.uniform(-0.3, 0.3, size=(d, 2)) for v, d in views.items()}
    blocks = [{v: 0.5 + rng.normal(size=(40, 2)) @ W[v].T + 0.05 * rng.normal(size=(40, d)) for v, d in views.items()}
              for _ in range(5)]
    ppca = MVPPCAProtocol(ViewSchema(tuple(views), tuple(views.values())), 2, n_local_iter=2, n_first_iter=3)
    for protocol, data, keys in ((ep, stats, ("Q", "r")), (ppca, blocks, None)):
        plain = simulate(protocol, data, n_rounds=2, random_state=0)
        secure = simulate(protocol, data, n_rounds=2, random_state=0, aggregation="secure",
                          aggregator=SecureAggregator(5, frac_bits=40, drop_after_masking={2: [3]}))
        assert secure.history[1].sites == [0, 1, 2, 3, 4]  # site 3's masked input is still in the sum
        for key in keys or plain.broadcast:
            np.testing.assert_allclose(secure.broadcast[key], plain.broadcast[key], rtol=1e-9, atol=1e-9, err_msg=key)
