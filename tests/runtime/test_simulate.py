"""The in-process runtime on a toy protocol whose answer is known in closed form."""

import numpy as np
import pytest

from fedhier.protocol.base import RoundProtocol
from fedhier.protocol.messages import Field, MessageSpec, encode
from fedhier.runtime.simulate import RoundFailed, SiteFailedWarning, simulate


class NoisyMean(RoundProtocol):
    """Sites reply (sum, count) of their values plus a little seeded noise; global = mean."""

    name = "noisy-mean"
    combine = "sum"

    def __init__(self, dim=3, noise=1e-3, fail_site=None):
        self.dim, self.noise, self.fail_site = dim, noise, fail_site

    @property
    def reply_spec(self):
        return MessageSpec("noisy-mean-reply", {"total": Field((self.dim,)), "count": Field(())})

    @property
    def broadcast_spec(self):
        return MessageSpec("noisy-mean-broadcast", {"mean": Field((self.dim,))})

    def initial_broadcast(self):
        return {"mean": np.zeros(self.dim)}

    def site_step(self, ctx, broadcast):
        if ctx.site == self.fail_site:
            raise RuntimeError("disk full")
        ctx.state["rounds_seen"] = np.asarray(ctx.state.get("rounds_seen", 0) + 1, dtype="int64")
        x = ctx.data
        return {"total": x.sum(0) + self.noise * ctx.rng.normal(size=self.dim), "count": float(len(x))}

    def global_step(self, combined, round, previous):
        return {"mean": combined["total"] / combined["count"]}

    def round_metrics(self, combined, round):
        return {"n": float(combined["count"])}


def make_sites(n_sites=4, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.normal(size=(rng.integers(5, 20), 3)) + s for s in range(n_sites)]


def test_global_step_sees_the_pooled_mean():
    sites = make_sites()
    res = simulate(NoisyMean(noise=0.0), sites, n_rounds=2, random_state=1)
    np.testing.assert_allclose(res.broadcast["mean"], np.vstack(sites).mean(0), rtol=1e-13)
    assert [r.round for r in res.history] == [1, 2]
    assert all(r.sites == [0, 1, 2, 3] for r in res.history)
    assert all(s["rounds_seen"] == 2 for s in res.site_states)


def test_bytes_are_the_encoded_sizes():
    res = simulate(NoisyMean(), make_sites(), n_rounds=1, random_state=1)
    rec = res.history[0]
    # header + 3 floats + 1 float payload
    assert all(b > 32 for b in rec.bytes_up.values())
    assert len(set(rec.bytes_up.values())) == 1
    assert sorted(rec.bytes_down) == [0, 1, 2, 3] and len(set(rec.bytes_down.values())) == 1
    assert rec.bytes_down[0] == len(encode(NoisyMean().broadcast_spec, res.broadcast))


class OwnColumn(RoundProtocol):
    """The server keeps one column per site; each site is sent only its own column."""

    name = "own-column"
    combine = "gather"

    def __init__(self, n_sites=3, dim=2):
        self.n_sites, self.dim = n_sites, dim

    @property
    def reply_spec(self):
        return MessageSpec("own-column-reply", {"column": Field((self.dim,))})

    @property
    def broadcast_spec(self):
        return MessageSpec("own-column-broadcast", {"table": Field((self.dim, self.n_sites))})

    @property
    def site_broadcast_spec(self):
        return MessageSpec("own-column-site", {"column": Field((self.dim,))})

    def site_broadcast(self, broadcast, site):
        return {"column": broadcast["table"][:, site]}

    def initial_broadcast(self):
        return {"table": np.arange(self.dim * self.n_sites, dtype=float).reshape(self.dim, self.n_sites)}

    def site_step(self, ctx, broadcast):
        assert set(broadcast) == {"column"} and broadcast["column"].shape == (self.dim,)
        return {"column": broadcast["column"] + ctx.data}

    def global_step(self, combined, round, previous):
        table = previous["table"].copy()
        for s, reply in combined.items():
            table[:, s] = reply["column"]
        return {"table": table}


@pytest.mark.parametrize("n_jobs", [1, 2])
def test_each_site_is_sent_only_its_part_of_the_broadcast(n_jobs):
    proto = OwnColumn()
    res = simulate(proto, [10.0 * (s + 1) for s in range(3)], n_rounds=2, random_state=0, n_jobs=n_jobs)
    start = proto.initial_broadcast()["table"]
    np.testing.assert_array_equal(res.broadcast["table"], start + 2 * np.array([10.0, 20.0, 30.0]))
    one_column = len(encode(proto.site_broadcast_spec, {"column": np.zeros(proto.dim)}))
    assert all(rec.bytes_down == {0: one_column, 1: one_column, 2: one_column} for rec in res.history)
    assert one_column < len(encode(proto.broadcast_spec, res.broadcast))


def test_same_seed_same_bits_with_and_without_pool():
    sites = make_sites()
    a = simulate(NoisyMean(), sites, n_rounds=3, random_state=7)
    b = simulate(NoisyMean(), sites, n_rounds=3, random_state=7)
    c = simulate(NoisyMean(), sites, n_rounds=3, random_state=7, n_jobs=2)
    d = simulate(NoisyMean(), sites, n_rounds=3, random_state=8)
    assert a.broadcast["mean"].tobytes() == b.broadcast["mean"].tobytes() == c.broadcast["mean"].tobytes()
    assert a.broadcast["mean"].tobytes() != d.broadcast["mean"].tobytes()
    assert [s["rounds_seen"] for s in c.site_states] == [3, 3, 3, 3]


def test_partial_participation_uses_only_the_sites_that_replied():
    sites = make_sites()
    res = simulate(NoisyMean(noise=0.0), sites, n_rounds=2, random_state=0, participation={2: [1, 3]})
    assert res.history[1].sites == [0, 2] and res.history[1].absent == [1, 3]
    np.testing.assert_allclose(res.broadcast["mean"], np.vstack([sites[0], sites[2]]).mean(0), rtol=1e-13)
    assert res.history[1].metrics["n"] == len(sites[0]) + len(sites[2])


def test_random_participation_is_seeded():
    sites = make_sites(8)
    a = simulate(NoisyMean(), sites, n_rounds=4, random_state=3, participation=0.5)
    b = simulate(NoisyMean(), sites, n_rounds=4, random_state=3, participation=0.5)
    assert [r.sites for r in a.history] == [r.sites for r in b.history]
    assert any(len(r.sites) < 8 for r in a.history)


def test_a_failing_site_is_dropped_and_reported_and_too_few_sites_stop_the_fit(caplog):
    sites = make_sites()
    with pytest.warns(SiteFailedWarning, match=r"round 1: site 2 failed .*RuntimeError at the site") as caught:
        res = simulate(NoisyMean(noise=0.0, fail_site=2), sites, n_rounds=3, random_state=0)
    assert len(caught) == 1  # the first failure of each site; the history has all of them
    assert [r.sites for r in res.history] == [[0, 1, 3]] * 3 and all(2 in r.failed for r in res.history)
    # the runner learns the category; the error's own text stays in the site's log
    assert "disk full" not in res.history[0].failed[2] and "RuntimeError" in res.history[0].failed[2]
    assert any("disk full" in r.getMessage() for r in caplog.records if r.name == "fedhier.site")
    with pytest.raises(RoundFailed, match="3 site\\(s\\) replied, at least 4 needed.*site 2: RuntimeError at the site"):
        simulate(NoisyMean(fail_site=2), sites, n_rounds=1, random_state=0, min_sites=4)


def test_resume_from_a_checkpoint_gives_the_same_result(tmp_path):
    sites = make_sites()

    def tag(record, broadcast):  # a callback adding a metric: saved with the round it was added to
        record.metrics["tagged"] = float(record.round)

    full = simulate(NoisyMean(), sites, n_rounds=4, random_state=5, callbacks=[tag])
    path = tmp_path / "run.ckpt.npz"
    simulate(NoisyMean(), sites, n_rounds=2, random_state=5, checkpoint=path, callbacks=[tag])  # "interrupted" after round 2
    rest = simulate(NoisyMean(), sites, n_rounds=4, random_state=5, checkpoint=path, callbacks=[tag])
    assert rest.broadcast["mean"].tobytes() == full.broadcast["mean"].tobytes()
    assert [r.round for r in rest.history] == [1, 2, 3, 4]
    assert [r.metrics for r in rest.history] == [r.metrics for r in full.history]
    assert [s["rounds_seen"] for s in rest.site_states] == [4, 4, 4, 4]
    with np.load(path, allow_pickle=False) as data:  # no pickled object inside
        assert "__meta__" in data.files
    with pytest.raises(ValueError, match="seed 5, not 6"):
        simulate(NoisyMean(), sites, n_rounds=5, random_state=6, checkpoint=path)
    with pytest.raises(ValueError, match="after round 4, beyond this run's n_rounds=3"):
        simulate(NoisyMean(), sites, n_rounds=3, random_state=5, checkpoint=path)
    with pytest.raises(ValueError, match="written by a differently configured 'noisy-mean' fit"):
        simulate(NoisyMean(dim=4), sites, n_rounds=5, random_state=5, checkpoint=path)
    # a checkpointed run that had met its stopping rule runs no further round when resumed
    stopped = tmp_path / "stopped.ckpt.npz"
    simulate(NoisyMean(), sites, n_rounds=4, random_state=5, checkpoint=stopped, stop=lambda r, b: r.round == 2)
    again = simulate(NoisyMean(), sites, n_rounds=4, random_state=5, checkpoint=stopped, stop=lambda r, b: r.round == 2)
    assert [r.round for r in again.history] == [1, 2]
    for content in (b"not a checkpoint", None):
        other = tmp_path / "other.npz"
        if content is None:
            np.save(other, np.zeros(3), allow_pickle=False)
            other = tmp_path / "other.npz.npy"
        else:
            other.write_bytes(content)
        with pytest.raises(ValueError, match="not a fedhier checkpoint"):
            simulate(NoisyMean(), sites, n_rounds=5, random_state=5, checkpoint=other)


@pytest.mark.parametrize(
    "kwargs, words",
    [
        (dict(n_rounds=0), "n_rounds"),
        (dict(n_rounds=1, n_jobs=0), "n_jobs"),
        (dict(n_rounds=1, min_sites=9), "min_sites"),
        (dict(n_rounds=1, participation=1.5), "probability"),
        (dict(n_rounds=1, aggregation="magic"), "aggregation"),
    ],
)
def test_bad_arguments_are_refused(kwargs, words):
    with pytest.raises(ValueError, match=words):
        simulate(NoisyMean(), make_sites(), **kwargs)
