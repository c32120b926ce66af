"""Key agreement, key derivation, share encryption and mask expansion for secure summation.

Primitives (all from the ``cryptography`` package):

* **key agreement** -- X25519 (RFC 7748); a site's key pair is 32 private and 32 public bytes;
* **key derivation** -- HKDF-SHA256 (RFC 5869) of the X25519 shared secret, with the
  session label as salt and a context string naming the purpose and the two sites as info;
* **authenticated encryption** -- AES-256-GCM.  Every share-encryption key is derived for
  one direction ``sender -> recipient`` of one session and encrypts exactly one message,
  so the fixed all-zero nonce never repeats under a key (RFC 5116 §3.1);
* **PRG** -- AES-256 in counter mode from a zero counter block, keyed by a 32-byte seed;
  the keystream is read as little-endian 64-bit words, truncated to ``bit_length(q)``
  bits and rejection-sampled, so each mask entry is uniform on ``[0, q)``.

Randomness: ``rng=None`` uses the operating system (``os.urandom`` /
``X25519PrivateKey.generate``); a :class:`numpy.random.Generator` makes keys and seeds
reproducible for tests and simulations and is **not** cryptographically secure.
"""

from __future__ import annotations

import os

import numpy as np
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat, PublicFormat

__all__ = [
    "KEY_BYTES", "random_bytes", "generate_private_key", "private_bytes", "public_bytes",
    "private_key_from_bytes", "agree", "encrypt", "decrypt", "prg",
]

#: Size of X25519 keys, derived keys and seeds.
KEY_BYTES = 32
_ZERO_NONCE = bytes(12)


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
