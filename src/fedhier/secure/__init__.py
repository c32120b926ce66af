"""Secure summation: a coordinator or a peer learns a sum of the sites' replies and nothing else.

Layering (docs/architecture.md): this package knows nothing about any model and nothing about differential
privacy (``fedhier.privacy``).  A reply is encoded in fixed point (:mod:`.fixedpoint`) over a prime field
(:mod:`.field`), then summed under pairwise masks with dropout recovery (:mod:`.secagg`, for star protocols;
:mod:`.secure_round` wraps a declared round) or split into Shamir shares (:mod:`.shamir`, for peer graphs).
Site keys (:mod:`.keys`) sign and agree on what the masks are derived from.
"""
