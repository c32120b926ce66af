"""Secure summation with dropout recovery (Bonawitz et al. 2017) and its crypto primitives."""

from fractions import Fraction

import numpy as np
import pytest
from scipy import stats

from fedhier.secure import keys as crypto
from fedhier.secure.fixedpoint import PRIME, FixedPoint
from fedhier.secure import secagg
from fedhier.secure.secagg import (
    InsufficientSitesError, SecAggParams, SecAggProtocolError, SecAggServer, SecAggSite, default_neighbours,
    harary_graph, secure_sum, to_site,
)
from fedhier.protocol.messages import decode, encode

FP = FixedPoint(frac_bits=24)
SITES = (0, 1, 2, 3, 4)
#: every test site's long-term key, and the roster of their public keys the operators agreed on
KEYS = {u: crypto.generate_signing_key() for u in range(80)}
ROSTER = {u: key.public_key() for u, key in KEYS.items()}


def _site(u, params, rng=None):
    return SecAggSite(u, params, rng, signing_key=KEYS[u], roster=ROSTER)


def _resume(params, data):
    return SecAggSite.from_state(params, data, signing_key=KEYS[secagg._state_site(data)], roster=ROSTER)


def _inputs(m=300, seed=0, scale=50.0):
    rng = np.random.default_rng(seed)
    return {u: rng.normal(scale=scale, size=m) for u in SITES}


def _grid_sum(vectors, sites):
    """Sum of the fixed-point roundings, computed exactly with Python fractions."""
    cols = zip(*[vectors[u] for u in sites])
    return np.array([float(sum(Fraction(round(Fraction(v) * 2**24), 2**24) for v in col)) for col in cols])


class Session:
    """The class-based API driven by hand, keeping every message (what a runtime would do)."""

    def __init__(self, vectors, threshold=3, seed=0):
        self.vectors = vectors
        self.params = SecAggParams(tuple(vectors), threshold, FP, len(next(iter(vectors.values()))))
        rngs = np.random.default_rng(seed).spawn(len(self.params.sites))
        self.sites = {u: _site(u, self.params, r) for u, r in zip(self.params.sites, rngs)}
        self.server = SecAggServer(self.params)
        self.sent = {u: [] for u in self.params.sites}

    def _send(self, replies):
        for u, data in replies.items():
            self.sent[u].append(data)
        return replies

    def run_to_masked(self, drop_before=()):
        key_list = self.server.collect_keys(self._send({u: s.advertise_keys() for u, s in self.sites.items()}))
        routed = self.server.route_shares(self._send({u: s.share_keys(key_list) for u, s in self.sites.items()}))
        masked = {u: self.sites[u].masked_input(self.vectors[u], routed[u]) for u in routed if u not in drop_before}
        self.listing = self.server.collect_masked(self._send(masked))
        return {u: decode(self.params.masked_spec, data)["y"] for u, data in masked.items()}

    def sign(self, drop_after=()):
        signed = {u: self.sites[u].sign_survivors(self.listing) for u in self.server.survivors if u not in drop_after}
        self.signatures = self.server.collect_signatures(self._send(signed))
        return self.signatures

    def unmask_messages(self, drop_after=()):
        self.sign(drop_after)
        return {u: self.sites[u].unmask(self.signatures) for u in self.server.survivors if u not in drop_after}


# -------------------------------------------------------------------- correctness
def test_no_drop_equals_plain_sum_to_fixed_point_precision():
    x = _inputs()
    result = secure_sum(x, threshold=3, fixed_point=FP, rng=1)
    assert result.survivors == SITES and result.unmasked_by == SITES
    np.testing.assert_array_equal(result.total, _grid_sum(x, SITES))
    assert np.abs(result.total - sum(x.values())).max() <= 5 * FP.precision / 2


def test_one_of_five_drops_after_masking_and_is_still_counted():
    x = _inputs(seed=1)
    result = secure_sum(x, threshold=3, fixed_point=FP, drop_after_masking=[2], rng=2)
    assert result.survivors == SITES and result.unmasked_by == (0, 1, 3, 4)
    np.testing.assert_array_equal(result.total, _grid_sum(x, SITES))


@pytest.mark.parametrize("before,after", [([4], []), ([0, 3], []), ([1], [3])])
def test_drops_before_masking_are_excluded_from_the_sum(before, after):
    x = _inputs(seed=2)
    result = secure_sum(x, threshold=3, fixed_point=FP, drop_before_masking=before, drop_after_masking=after, rng=3)
    included = tuple(u for u in SITES if u not in before)
    assert result.survivors == included
    np.testing.assert_array_equal(result.total, _grid_sum(x, included))


def test_matrix_inputs_with_cryptographic_randomness():
    rng = np.random.default_rng(4)
    x = {u: rng.uniform(-1, 1, size=(3, 4)) for u in (10, 20, 30)}
    result = secure_sum(x, threshold=2, fixed_point=FP)
    assert result.total.shape == (3, 4)
    assert np.abs(result.total - sum(x.values())).max() <= 3 * FP.precision / 2


@pytest.mark.parametrize("before,after,step", [([0, 1, 2], [], "collect_masked"), ([], [0, 1, 2], "collect_signatures"),
                                               ([0, 1], [2], "collect_signatures")])
def test_too_many_drops_abort_without_a_total(before, after, step):
    with pytest.raises(InsufficientSitesError) as info:
        secure_sum(_inputs(), threshold=3, fixed_point=FP, drop_before_masking=before, drop_after_masking=after, rng=5)
    assert info.value.step == step and len(info.value.remaining) == 2 and info.value.threshold == 3


def test_aborted_server_releases_nothing_afterwards():
    session = Session(_inputs())
    with pytest.raises(InsufficientSitesError):
        session.run_to_masked(drop_before=[0, 1, 2])
    with pytest.raises(SecAggProtocolError, match="aborted"):
        session.server.unmask({})


# ----------------------------------------------------------- what the server sees
def test_masked_input_is_uniform_and_independent_of_the_data():
    m = 20000
    rng = np.random.default_rng(6)
    data = {u: rng.normal(loc=1000.0, scale=10.0, size=m) for u in SITES}
    zeros = {u: np.zeros(m) for u in SITES}
    y_data = Session(data, seed=7).run_to_masked()[2] / PRIME
    y_zero = Session(zeros, seed=8).run_to_masked()[2] / PRIME
    for y in (y_data, y_zero):
        assert stats.kstest(y, "uniform").pvalue > 1e-3
        assert stats.chisquare(np.histogram(y, bins=64, range=(0, 1))[0]).pvalue > 1e-3
    assert stats.ks_2samp(y_data, y_zero).pvalue > 1e-3
    assert abs(stats.pearsonr(data[2], y_data).statistic) < 4 / np.sqrt(m)
    # the same tests do detect an unmasked encoding: they have power
    assert stats.kstest(FP.encode(data[2]) / PRIME, "uniform").pvalue < 1e-6


def test_transcripts_of_different_inputs_have_identical_sizes():
    a = Session(_inputs(seed=9), seed=10)
    b = Session({u: np.zeros(300) for u in SITES}, seed=11)
    a.run_to_masked(), b.run_to_masked()
    for u in SITES:
        assert [len(d) for d in a.sent[u]] == [len(d) for d in b.sent[u]]


def test_server_never_stores_an_individual_masked_or_plain_input():
    session = Session(_inputs(seed=12))
    masked = session.run_to_masked()
    held = [v for v in vars(session.server).values() if isinstance(v, np.ndarray)]
    assert len(held) == 1  # only the running sum of masked inputs
    exact = [sum(int(masked[u][i]) for u in SITES) % PRIME for i in range(300)]
    assert held[0].tolist() == exact


# ------------------------------------------------------------- refusing misconduct
def test_revealing_both_shares_for_one_peer_is_refused():
    session = Session(_inputs(seed=13))
    session.run_to_masked(drop_before=[4])
    messages = session.unmask_messages()
    honest = decode(session.params.unmask_spec, messages[1])
    assert "b_0" in honest and "sk_0" not in honest and "sk_4" in honest and "b_4" not in honest
    cheat = dict(honest, **{"sk_0": honest["b_0"]})
    messages[1] = encode(session.params.unmask_spec, cheat)
    with pytest.raises(SecAggProtocolError, match="both"):
        session.server.unmask(messages)


def test_revealing_the_key_share_of_a_surviving_site_is_refused():
    session = Session(_inputs(seed=14))
    session.run_to_masked()
    messages = session.unmask_messages()
    honest = decode(session.params.unmask_spec, messages[3])
    cheat = {k: v for k, v in honest.items() if k != "b_0"}
    cheat["sk_0"] = honest["b_0"]
    messages[3] = encode(session.params.unmask_spec, cheat)
    with pytest.raises(SecAggProtocolError, match="mask-key share of site 0"):
        session.server.unmask(messages)


def test_a_site_unmasks_only_once_and_checks_the_survivor_list():
    session = Session(_inputs(seed=15))
    session.run_to_masked(drop_before=[4])
    session.unmask_messages()
    with pytest.raises(SecAggProtocolError, match="out of order"):
        session.sites[0].unmask(session.signatures)
    session = Session(_inputs(seed=15))
    session.run_to_masked(drop_before=[4])
    forged = encode(session.params.survivors_spec, {"included": np.array([True, False, True, True, False])})
    with pytest.raises(SecAggProtocolError, match="omits this site"):
        session.sites[1].sign_survivors(forged)


def _resumed_session(params, x, drop_before_sharing, drop_after_masking):
    """A session whose every site step runs on a site resumed from its saved state (a fresh process each step)."""
    saved = {}

    def step(u, name, *args):
        site = _site(u, params) if name == "advertise_keys" else _resume(params, saved[u])
        message = getattr(site, name)(*args)
        saved[u] = site.to_state()
        return message

    server = SecAggServer(params)
    key_list = server.collect_keys({u: step(u, "advertise_keys") for u in params.sites})
    routed = server.route_shares({u: step(u, "share_keys", to_site(key_list, u)) for u in params.sites
                                  if u not in drop_before_sharing})
    listing = server.collect_masked({u: step(u, "masked_input", x[u], routed[u]) for u in routed})
    answering = [u for u in routed if u not in drop_after_masking]
    signed = server.collect_signatures({u: step(u, "sign_survivors", listing) for u in answering})
    total = server.unmask({u: step(u, "unmask", to_site(signed, u)) for u in answering})
    return total, saved, signed, routed


def test_a_site_saved_and_resumed_between_steps_gives_the_same_total():
    # what a runtime that runs every step in a fresh process does (the Flower ClientApp)
    x = _inputs(m=50)
    params = SecAggParams(SITES, 3, FP, 50)
    total, saved, listing, routed = _resumed_session(params, x, [4], [1])  # 4 drops before sharing, 1 after masking
    np.testing.assert_array_equal(total, _grid_sum(x, (0, 1, 2, 3)))
    resumed = _resume(params, saved[0])
    with pytest.raises(SecAggProtocolError, match="out of order"):
        resumed.unmask(listing)  # the saved step counter forbids a second reveal
    with pytest.raises(SecAggProtocolError, match="no secrets to keep"):
        _site(0, params).to_state()
    with pytest.raises(SecAggProtocolError, match="expected a 'secagg.site-state' message"):
        SecAggSite.from_state(params, routed[0], signing_key=KEYS[0], roster=ROSTER)


def test_a_site_dropping_before_sharing_is_left_out_and_cannot_be_listed():
    session = Session(_inputs(seed=23))
    key_list = session.server.collect_keys({u: s.advertise_keys() for u, s in session.sites.items()})
    routed = session.server.route_shares({u: session.sites[u].share_keys(key_list) for u in (0, 1, 2, 3)})
    assert sorted(routed) == [0, 1, 2, 3]
    listing = session.server.collect_masked({u: session.sites[u].masked_input(session.vectors[u], routed[u])
                                             for u in routed})
    signed = session.server.collect_signatures({u: session.sites[u].sign_survivors(listing) for u in (0, 1, 2)})
    total = session.server.unmask({u: session.sites[u].unmask(signed) for u in (0, 1, 2)})
    np.testing.assert_array_equal(total, _grid_sum(session.vectors, (0, 1, 2, 3)))
    forged = encode(session.params.survivors_spec, {"included": np.ones(5, dtype=bool)})
    with pytest.raises(SecAggProtocolError, match="never shared"):
        session.sites[3].sign_survivors(forged)


def test_tampered_share_ciphertext_is_detected_by_its_recipient():
    session = Session(_inputs(seed=16))
    key_list = session.server.collect_keys({u: s.advertise_keys() for u, s in session.sites.items()})
    routed = session.server.route_shares({u: s.share_keys(key_list) for u, s in session.sites.items()})
    msg = decode(session.params.routed_spec, routed[0])
    msg["from_1"] = msg["from_1"] ^ np.uint64(1)
    with pytest.raises(SecAggProtocolError, match="share bundle from site 1"):
        session.sites[0].masked_input(session.vectors[0], encode(session.params.routed_spec, msg))


# ---------------------------------------------------------------------- accounting
def test_byte_counts_are_the_sizes_of_the_messages_sent():
    x = _inputs(seed=17)
    result = secure_sum(x, threshold=3, fixed_point=FP, drop_after_masking=[1], rng=18)
    session = Session(x, seed=18)
    session.run_to_masked()
    session._send(session.unmask_messages(drop_after=[1]))
    assert result.bytes_sent == {u: sum(len(d) for d in session.sent[u]) for u in SITES}
    assert all(result.bytes_sent[u] > 8 * 300 for u in SITES)
    assert result.bytes_received[1] < result.bytes_received[0]


def test_reproducible_with_a_seed():
    x = _inputs(seed=19)
    a = Session(x, seed=20).run_to_masked()
    b = Session(x, seed=20).run_to_masked()
    c = Session(x, seed=21).run_to_masked()
    np.testing.assert_array_equal(a[0], b[0])
    assert not np.array_equal(a[0], c[0])


def test_bad_arguments_are_refused():
    x = _inputs()
    with pytest.raises(ValueError, match="threshold"):
        secure_sum(x, threshold=1, fixed_point=FP)
    with pytest.raises(ValueError, match="threshold"):
        secure_sum(x, threshold=6, fixed_point=FP)
    with pytest.raises(ValueError, match="more than half"):
        secure_sum(x, threshold=2, fixed_point=FP)
    with pytest.raises(ValueError, match="site 3: input has shape"):
        secure_sum({**x, 3: np.zeros(4)}, threshold=3, fixed_point=FP)
    with pytest.raises(ValueError, match="unknown sites"):
        secure_sum(x, threshold=3, fixed_point=FP, drop_after_masking=[7])
    with pytest.raises(ValueError, match="both"):
        secure_sum(x, threshold=3, fixed_point=FP, drop_before_masking=[1], drop_after_masking=[1])
    with pytest.raises(OverflowError, match="max_abs"):
        secure_sum({**x, 0: np.full(300, 1e9)}, threshold=3, fixed_point=FP)
    with pytest.raises(ValueError, match="max_summands"):
        SecAggParams(tuple(range(5)), 3, FixedPoint(frac_bits=0, modulus=101, max_abs=20), 4)


# -------------------------------------------------------------------- primitives
def test_prg_is_deterministic_uniform_and_seed_dependent():
    seed = bytes(range(32))
    a = crypto.prg(seed, 50000, 101)
    np.testing.assert_array_equal(a, crypto.prg(seed, 50000, 101))
    assert a.min() >= 0 and a.max() < 101
    assert stats.chisquare(np.bincount(a, minlength=101)).pvalue > 1e-3
    b = crypto.prg(bytes(32), 50000, PRIME)
    assert stats.kstest(b / PRIME, "uniform").pvalue > 1e-3
    assert not np.array_equal(b[:100] % 101, a[:100])


def test_key_agreement_is_symmetric_and_encryption_authenticated():
    rng = np.random.default_rng(22)
    k1, k2 = crypto.generate_private_key(rng), crypto.generate_private_key(rng)
    shared = crypto.agree(k1, crypto.public_bytes(k2), salt=b"s", info=b"i")
    assert shared == crypto.agree(k2, crypto.public_bytes(k1), salt=b"s", info=b"i")
    assert shared != crypto.agree(k2, crypto.public_bytes(k1), salt=b"s", info=b"other")
    ct = crypto.encrypt(shared, b"share", b"ad")
    assert crypto.decrypt(shared, ct, b"ad") == b"share"
    with pytest.raises(ValueError, match="authentication"):
        crypto.decrypt(shared, ct, b"other ad")
    restored = crypto.private_key_from_bytes(crypto.private_bytes(k1))
    assert crypto.public_bytes(restored) == crypto.public_bytes(k1)


# ------------------------------------------------------------ SecAgg+: a sparse graph

SPARSE = tuple(range(40))


def _sparse_inputs(sites=SPARSE, m=60, seed=0):
    rng = np.random.default_rng(seed)
    return {u: rng.normal(scale=20.0, size=m) for u in sites}


def test_the_sparse_graph_is_public_regular_and_fresh_per_session():
    graph = harary_graph(SPARSE, 6, b"round-1")
    assert graph == harary_graph(reversed(SPARSE), 6, b"round-1")  # a function of public facts only
    assert all(len(nbhd) == 7 and u in nbhd for u, nbhd in graph.items())
    assert all(u in graph[v] for u, nbhd in graph.items() for v in nbhd)  # symmetric
    assert graph != harary_graph(SPARSE, 6, b"round-2")
    assert default_neighbours(100) is None and default_neighbours(300) == 26 and default_neighbours(1000) == 30
    for bad in (5, 0, 40):
        with pytest.raises(ValueError, match="even"):
            harary_graph(SPARSE, bad, b"x")
    with pytest.raises(ValueError, match="neighbours \\+ 1"):
        SecAggParams(SPARSE, 8, FP, 3, neighbours=6)


def test_sparse_secure_sum_equals_the_plain_sum():
    x = _sparse_inputs()
    result = secure_sum(x, threshold=4, fixed_point=FP, neighbours=6, rng=30)
    assert result.survivors == SPARSE
    np.testing.assert_array_equal(result.total, _grid_sum(x, SPARSE))
    assert np.abs(result.total - sum(x.values())).max() <= len(SPARSE) * FP.precision / 2


def test_sparse_secure_sum_recovers_from_drops_before_and_after_masking():
    x = _sparse_inputs(seed=1)
    graph = harary_graph(SPARSE, 8, b"fedhier-secagg")
    drops = []  # 7 of 40 sites, spread so that every neighbourhood keeps t = 5 holders
    for u in np.random.default_rng(2).permutation(SPARSE):
        if len(drops) < 7 and min(len(set(n) - {*drops, u}) for n in graph.values()) >= 5:
            drops.append(int(u))
    before, after = drops[:3], drops[3:]
    result = secure_sum(x, threshold=5, fixed_point=FP, neighbours=8, drop_before_masking=before,
                        drop_after_masking=after, rng=31)
    included = tuple(u for u in SPARSE if u not in before)
    assert result.survivors == included
    np.testing.assert_array_equal(result.total, _grid_sum(x, included))


def test_a_neighbourhood_with_too_few_holders_aborts_without_a_total():
    params = SecAggParams(SPARSE, 4, FP, 60, b"fedhier-secagg", 6)
    victim = 5
    others = [v for v in params.neighbourhood(victim) if v != victim]
    with pytest.raises(InsufficientSitesError):  # 4 of its 6 neighbours drop after masking: 3 holders < t = 4
        secure_sum(_sparse_inputs(seed=2), threshold=4, fixed_point=FP, neighbours=6, drop_after_masking=others[:4])


def test_bytes_per_site_follow_the_neighbourhood_not_the_number_of_sites():
    def per_site(n, k):
        res = secure_sum(_sparse_inputs(tuple(range(n)), seed=3), threshold=3 if k else n // 2 + 1, fixed_point=FP,
                         neighbours=k)
        return np.mean([res.bytes_sent[u] + res.bytes_received[u] for u in res.survivors])

    sparse_40, sparse_80 = per_site(40, 4), per_site(80, 4)
    complete_20, complete_40 = per_site(20, None), per_site(40, None)
    assert abs(sparse_80 / sparse_40 - 1) < 0.05  # same k: the same work per site
    assert complete_40 / complete_20 > 1.5         # the complete graph grows with S


class SparseSession:
    """A SecAgg+ session run by hand, keeping what the server saw."""

    def __init__(self, x, k, t, seed):
        self.params = SecAggParams(tuple(x), t, FP, len(next(iter(x.values()))), b"attack", k)
        rngs = np.random.default_rng(seed).spawn(len(x))
        self.sites = {u: _site(u, self.params, r) for u, r in zip(self.params.sites, rngs)}
        self.server = SecAggServer(self.params)
        key_list = self.server.collect_keys({u: s.advertise_keys() for u, s in self.sites.items()})
        routed = self.server.route_shares({u: s.share_keys(to_site(key_list, u)) for u, s in self.sites.items()})
        masked = {u: self.sites[u].masked_input(x[u], routed[u]) for u in routed}
        self.y = {u: decode(self.params.masked_spec, data)["y"] for u, data in masked.items()}
        listing = self.server.collect_masked(masked)
        signed = self.server.collect_signatures({u: self.sites[u].sign_survivors(listing) for u in self.server.survivors})
        self.unmasked = {u: self.sites[u].unmask(to_site(signed, u)) for u in self.server.survivors}
        self.total = self.server.unmask(self.unmasked)


def _residual_after_attack(session, victim, coalition):
    """What the server and ``coalition`` (neighbours of ``victim``, handing over their whole
    state) can strip from ``victim``'s masked input: the self mask (revealed at unmasking),
    their own pairwise masks with it, and -- if their key shares rebuild its mask key --
    every other pairwise mask too."""
    p, q = session.params, PRIME
    nbhd = p.neighbourhood(victim)
    b_shares = {}
    for u, data in session.unmasked.items():
        msg = decode(p.spec("unmask", u), data)
        if f"b_{victim}" in msg:
            b_shares[u] = msg[f"b_{victim}"]
    holders = sorted(b_shares)[: p.threshold]
    b = secagg._elements_to_secret(secagg.reconstruct(np.stack([b_shares[u] for u in holders]),
                                                      np.array([p.point(u, victim) for u in holders])), "b")
    y = secagg._ring_sub(session.y[victim], crypto.prg(b, p.length, q), q)
    states = {c: decode(p.spec("site-state", c), session.sites[c].to_state()) for c in coalition}
    s_pk_victim = secagg._raw(states[coalition[0]][f"s_pk_{victim}"])
    keys = {c: crypto.private_key_from_bytes(secagg._raw(states[c]["s_sk"])) for c in coalition}
    sk_shares = np.stack([states[c][f"held_{victim}"][secagg.SECRET_ELEMENTS:] for c in coalition])
    guess = secagg.reconstruct(sk_shares, np.array([p.point(c, victim) for c in coalition]))
    try:
        victim_key = crypto.private_key_from_bytes(secagg._elements_to_secret(guess, "key"))
        if crypto.public_bytes(victim_key) != s_pk_victim:
            victim_key = None
    except SecAggProtocolError:
        victim_key = None
    for v in nbhd:
        if v == victim:
            continue
        if v in keys:
            seed = crypto.agree(keys[v], s_pk_victim, salt=p.session, info=secagg._info(b"mask", min(v, victim), max(v, victim)))
        elif victim_key is not None:
            s_pk_v = secagg._raw(states[coalition[0]][f"s_pk_{v}"]) if f"s_pk_{v}" in states[coalition[0]] else None
            if s_pk_v is None:  # a key the coalition has not seen: ask the server's key list
                s_pk_v = session.server._public[v][1]
            seed = crypto.agree(victim_key, s_pk_v, salt=p.session, info=secagg._info(b"mask", min(v, victim), max(v, victim)))
        else:
            continue
        mask = crypto.prg(seed, p.length, q)
        y = secagg._ring_sub(y, mask, q) if v > victim else secagg._ring_add(y, mask, q)
    return y, victim_key is not None


def test_fewer_than_threshold_colluding_neighbours_learn_nothing_and_threshold_many_learn_the_input():
    m, victim = 20000, 7
    rng = np.random.default_rng(40)
    sites = tuple(range(30))
    x = {u: rng.normal(loc=100.0, scale=5.0, size=m) for u in sites}
    session = SparseSession(x, k=6, t=4, seed=41)
    assert np.abs(session.total - sum(x.values())).max() <= len(sites) * FP.precision / 2
    neighbours = [v for v in session.params.neighbourhood(victim) if v != victim]
    residual, has_key = _residual_after_attack(session, victim, neighbours[:3])  # t - 1 = 3 colluders
    assert not has_key
    r = residual / PRIME
    assert stats.kstest(r, "uniform").pvalue > 1e-3
    assert abs(stats.pearsonr(x[victim], r).statistic) < 4 / np.sqrt(m)
    # with t colluders the same attack recovers the victim's input exactly: the test has power
    residual, has_key = _residual_after_attack(session, victim, neighbours[:4])
    assert has_key
    np.testing.assert_array_equal(residual, FP.encode(x[victim]))


def test_a_sparse_site_saved_and_resumed_between_steps_gives_the_same_total():
    x = _sparse_inputs(m=20, seed=5)
    total, _, _, _ = _resumed_session(SecAggParams(SPARSE, 4, FP, 20, b"resume", 6), x, [], [11])
    np.testing.assert_array_equal(total, _grid_sum(x, SPARSE))


def test_a_secure_fit_on_a_sparse_graph_equals_the_plain_fit():
    from fedhier.secure.secure_round import SecureAggregator
    from fedhier.runtime.simulate import simulate
    from tests.runtime.test_simulate import NoisyMean, make_sites

    sites = make_sites(n_sites=12, seed=6)
    aggregator = SecureAggregator(12, neighbours=4, frac_bits=30)
    assert aggregator.threshold == 3
    secure = simulate(NoisyMean(), sites, n_rounds=2, random_state=2, aggregation="secure", aggregator=aggregator)
    plain = simulate(NoisyMean(), sites, n_rounds=2, random_state=2)
    np.testing.assert_allclose(secure.broadcast["mean"], plain.broadcast["mean"], rtol=0, atol=1e-6)


def test_site_keys_sign_and_the_roster_file_round_trips(tmp_path):
    from cryptography.hazmat.primitives.asymmetric import ec

    from fedhier.cli.flower import make_site_key

    private, public = make_site_key(tmp_path / "hospital-a-key")  # ECDSA P-384, as `fedhier flower key` makes it
    ecdsa = crypto.load_signing_key(private)
    assert isinstance(ecdsa, ec.EllipticCurvePrivateKey)
    ed = crypto.generate_signing_key()
    path = tmp_path / "roster.txt"
    path.write_text(f"# agreed on 2026-11-28\nhospital-a {public.read_text().strip()}\n\nhospital-b {crypto.public_key_text(ed)}\n")
    roster = crypto.Roster.read(path)
    assert list(roster) == ["hospital-a", "hospital-b"]
    for name, key in (("hospital-a", ecdsa), ("hospital-b", ed)):
        sig = crypto.sign(key, b"statement")
        assert len(sig) == crypto.SIGNATURE_BYTES
        assert crypto.verify(roster[name], sig, b"statement")
        assert not crypto.verify(roster[name], sig, b"another statement")
        assert not crypto.verify(roster[name], bytes([sig[0] ^ 1]) + sig[1:], b"statement")
        assert not crypto.verify(roster["hospital-b" if name == "hospital-a" else "hospital-a"], sig, b"statement")
    roster.write(tmp_path / "copy.txt")
    assert {n: crypto.public_key_text(k) for n, k in crypto.Roster.read(tmp_path / "copy.txt").items()} == \
        {n: crypto.public_key_text(k) for n, k in roster.items()}
    for text, message in (("hospital-a\n", "line 1: expected 'site-name key-type key'"),
                          (f"a {crypto.public_key_text(ed)}\na {crypto.public_key_text(ed)}\n", "line 2: site 'a' is listed twice"),
                          ("a ssh-ed25519 AAAAnotakey\n", "line 1: not an OpenSSH public key"), ("# nobody\n", "lists no site")):
        path.write_text(text)
        with pytest.raises(ValueError, match=message):
            crypto.Roster.read(path)
    with pytest.raises(ValueError, match="the roster has no key for sites \\[5\\]"):
        SecAggSite(0, SecAggParams(SITES + (5,), 4, FP, 3), signing_key=KEYS[0], roster={u: ROSTER[u] for u in SITES})
    with pytest.raises(ValueError, match="its signing key is not the key the roster holds for it"):
        SecAggSite(0, SecAggParams(SITES, 3, FP, 3), signing_key=KEYS[1], roster=ROSTER)
