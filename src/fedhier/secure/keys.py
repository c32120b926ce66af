"""Key agreement, key derivation, share encryption and mask expansion for secure summation.

Primitives (all from the ``cryptography`` package):

* **key agreement** -- X25519 (RFC 7748); a site's key pair is 32 private and 32 public bytes;
* **key derivation** -- HKDF-SHA256 (RFC 5869) of the X25519 shared secret, with the
  session label as salt and a context string naming the purpose and the two sites as info;
* **authenticated encryption** -- AES-256-GCM.  Every share-encryption key is derived for
  one direction ``sender -> recipient`` of one session and encrypts exactly one message,
  so the fixed all-zero nonce never repeats under a key (RFC 5116 §3.1);
* **signatures** -- a site's long-term key (Ed25519, or the ECDSA P-384 key of ``fedhier
  flower key``) signs its key advertisement and the survivor list of each secure sum; the
  other sites check it against the :class:`Roster` the operators agreed on;
* **PRG** -- AES-256 in counter mode from a zero counter block, keyed by a 32-byte seed;
  the keystream is read as little-endian 64-bit words, truncated to ``bit_length(q)``
  bits and rejection-sampled, so each mask entry is uniform on ``[0, q)``.

Randomness: ``rng=None`` uses the operating system (``os.urandom`` /
``X25519PrivateKey.generate``); a :class:`numpy.random.Generator` makes keys and seeds
reproducible for tests and simulations and is **not** cryptographically secure.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Union

import numpy as np
from cryptography.exceptions import InvalidSignature, InvalidTag, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature, encode_dss_signature
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.hazmat.primitives.serialization import (
    Encoding, NoEncryption, PrivateFormat, PublicFormat, load_pem_private_key, load_ssh_private_key, load_ssh_public_key,
)

__all__ = [
    "KEY_BYTES", "random_bytes", "generate_private_key", "private_bytes", "public_bytes",
    "private_key_from_bytes", "agree", "encrypt", "decrypt", "prg",
    "SIGNATURE_BYTES", "generate_signing_key", "load_signing_key", "public_key_text", "sign", "verify", "Roster",
]

#: Size of X25519 keys, derived keys and seeds.
KEY_BYTES = 32
_ZERO_NONCE = bytes(12)
#: A site's long-term signing key: Ed25519, or the ECDSA P-384 key ``fedhier flower key`` makes.
SigningKey = Union[Ed25519PrivateKey, ec.EllipticCurvePrivateKey]


def random_bytes(n: int, rng: np.random.Generator | None = None) -> bytes:
    """``n`` random bytes: ``os.urandom`` if ``rng`` is None, else ``rng.bytes`` (not secure)."""
    return os.urandom(n) if rng is None else rng.bytes(n)


def generate_private_key(rng: np.random.Generator | None = None) -> X25519PrivateKey:
    """A fresh X25519 private key (from ``rng`` bytes when given, for reproducibility)."""
    if rng is None:
        return X25519PrivateKey.generate()
    return X25519PrivateKey.from_private_bytes(rng.bytes(KEY_BYTES))


def private_bytes(key: X25519PrivateKey) -> bytes:
    """The 32 raw private bytes of an X25519 key (what gets Shamir-shared)."""
    return key.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())


def public_bytes(key: X25519PrivateKey | X25519PublicKey) -> bytes:
    """The 32 raw public bytes of an X25519 key (or of the public half of a private key)."""
    if isinstance(key, X25519PrivateKey):
        key = key.public_key()
    return key.public_bytes(Encoding.Raw, PublicFormat.Raw)


def private_key_from_bytes(data: bytes) -> X25519PrivateKey:
    """Rebuild an X25519 private key from its 32 raw bytes."""
    return X25519PrivateKey.from_private_bytes(bytes(data))


def agree(private: X25519PrivateKey, peer_public: bytes, *, salt: bytes, info: bytes) -> bytes:
    """HKDF-SHA256(X25519(private, peer_public)) -> 32 bytes; both parties obtain the same key.

    Raises
    ------
    ValueError
        If ``peer_public`` is not a valid 32-byte X25519 public key.
    """
    try:
        peer = X25519PublicKey.from_public_bytes(bytes(peer_public))
        shared = private.exchange(peer)
    except ValueError as exc:
        raise ValueError(f"invalid X25519 public key: {exc}") from exc
    return HKDF(algorithm=hashes.SHA256(), length=KEY_BYTES, salt=salt, info=info).derive(shared)


def encrypt(key: bytes, plaintext: bytes, associated: bytes) -> bytes:
    """AES-256-GCM encryption under a single-use key (zero nonce); returns ciphertext + 16-byte tag."""
    return AESGCM(key).encrypt(_ZERO_NONCE, plaintext, associated)


def decrypt(key: bytes, ciphertext: bytes, associated: bytes) -> bytes:
    """Inverse of :func:`encrypt`.

    Raises
    ------
    ValueError
        If the ciphertext or its associated data was altered, or the key is wrong.
    """
    try:
        return AESGCM(key).decrypt(_ZERO_NONCE, bytes(ciphertext), associated)
    except InvalidTag as exc:
        raise ValueError("authentication failed: ciphertext altered or wrong key") from exc


def prg(seed: bytes, length: int, modulus: int) -> np.ndarray:
    """Expand a 32-byte seed into ``length`` independent uniform integers in ``[0, modulus)``.

    AES-256-CTR keystream, 64-bit little-endian words masked to ``bit_length(modulus)``
    bits, words ``>= modulus`` rejected and replaced by later keystream words.

    Returns
    -------
    ndarray of int64, shape (length,)
    """
    if len(seed) != KEY_BYTES:
        raise ValueError(f"PRG seed must be {KEY_BYTES} bytes, got {len(seed)}")
    stream = Cipher(algorithms.AES(bytes(seed)), modes.CTR(bytes(16))).encryptor()
    top = np.uint64((1 << int(modulus).bit_length()) - 1)
    q = np.uint64(modulus)
    out = np.empty(length, dtype=np.uint64)
    filled = 0
    while filled < length:
        need = length - filled
        words = np.frombuffer(stream.update(bytes(8 * need)), dtype="<u8") & top
        words = words[words < q]
        out[filled : filled + words.size] = words
        filled += words.size
    return out.astype(np.int64)


# --------------------------------------------------------------------------- long-term site keys: signatures

#: Size of a signature on the wire: Ed25519 (64 bytes, zero-padded) or ECDSA P-384 (r and s, 48 bytes each).
SIGNATURE_BYTES = 96


def generate_signing_key() -> Ed25519PrivateKey:
    """A fresh long-term Ed25519 site key from the operating system (what :func:`fedhier.runtime.simulate` uses)."""
    return Ed25519PrivateKey.generate()


def load_signing_key(path) -> SigningKey:
    """A site's long-term private key from a file: OpenSSH or PEM, Ed25519 or ECDSA P-384 (``fedhier flower key``).

    Raises
    ------
    ValueError
        If the file holds no such key (the text names the file only).
    """
    data = Path(path).read_bytes()
    try:
        key = (load_ssh_private_key if data.startswith(b"-----BEGIN OPENSSH") else load_pem_private_key)(data, None)
    except (ValueError, TypeError, UnsupportedAlgorithm) as exc:
        raise ValueError(f"{path}: not an unencrypted Ed25519 or ECDSA P-384 private key") from exc
    _check_key_type(key.public_key(), str(path))
    return key


def public_key_text(key) -> str:
    """The OpenSSH text of a (private or public) site key: the line's key part in a roster file."""
    if isinstance(key, (Ed25519PrivateKey, ec.EllipticCurvePrivateKey)):
        key = key.public_key()
    return key.public_bytes(Encoding.OpenSSH, PublicFormat.OpenSSH).decode()


def _check_key_type(public, where: str) -> None:
    if isinstance(public, Ed25519PublicKey):
        return
    if isinstance(public, ec.EllipticCurvePublicKey) and isinstance(public.curve, ec.SECP384R1):
        return
    raise ValueError(f"{where}: a site key must be Ed25519 or ECDSA P-384")


def sign(private: SigningKey, statement: bytes) -> bytes:
    """Sign ``statement`` with a site's long-term key; :data:`SIGNATURE_BYTES` bytes."""
    if isinstance(private, Ed25519PrivateKey):
        return private.sign(statement).ljust(SIGNATURE_BYTES, b"\0")
    r, s = decode_dss_signature(private.sign(statement, ec.ECDSA(hashes.SHA384())))
    return r.to_bytes(48, "big") + s.to_bytes(48, "big")


def verify(public, signature: bytes, statement: bytes) -> bool:
    """True when ``signature`` (from :func:`sign`) is the key's signature of ``statement``."""
    signature = bytes(signature)
    if len(signature) != SIGNATURE_BYTES:
        return False
    try:
        if isinstance(public, Ed25519PublicKey):
            if any(signature[64:]):
                return False
            public.verify(signature[:64], statement)
        else:
            r, s = int.from_bytes(signature[:48], "big"), int.from_bytes(signature[48:], "big")
            public.verify(encode_dss_signature(r, s), statement, ec.ECDSA(hashes.SHA384()))
    except (InvalidSignature, ValueError):
        return False
    return True


class Roster(Mapping):
    """The site keys the operators agree on: site name -> long-term public key.

    Every site is given the same roster file out of band (never through the coordinator).
    A site accepts a key advertisement of a secure sum only when it is signed by the key
    the roster holds for the site that claims it.  File format, one site a line (``#``
    starts a comment)::

        hospital-a ecdsa-sha2-nistp384 AAAAE2VjZHNh... (the content of hospital-a's key.pub)
        hospital-b ssh-ed25519 AAAAC3NzaC1lZDI1NTE5...
    """

    def __init__(self, keys: Mapping[str, Any]):
        self._keys = {}
        for name, key in keys.items():
            if isinstance(key, (Ed25519PrivateKey, ec.EllipticCurvePrivateKey)):
                key = key.public_key()
            _check_key_type(key, f"roster entry {name!r}")
            self._keys[str(name)] = key

    @classmethod
    def read(cls, path) -> "Roster":
        """Read a roster file; raises ValueError naming the file and line of a malformed entry."""
        keys: dict[str, Any] = {}
        for number, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
            text = line.split("#", 1)[0].strip()
            if not text:
                continue
            parts = text.split()
            if len(parts) < 3:
                raise ValueError(f"{path}, line {number}: expected 'site-name key-type key', got {len(parts)} word(s)")
            if parts[0] in keys:
                raise ValueError(f"{path}, line {number}: site {parts[0]!r} is listed twice")
            try:
                keys[parts[0]] = load_ssh_public_key(" ".join(parts[1:3]).encode())
            except (ValueError, UnsupportedAlgorithm) as exc:
                raise ValueError(f"{path}, line {number}: not an OpenSSH public key") from exc
        if not keys:
            raise ValueError(f"{path}: the roster lists no site")
        return cls(keys)

    def write(self, path) -> None:
        """Write the roster file (readable by :meth:`read`)."""
        Path(path).write_text("".join(f"{name} {public_key_text(key)}\n" for name, key in self._keys.items()), encoding="utf-8")

    def __getitem__(self, name: str):
        return self._keys[name]

    def __iter__(self):
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._keys)
