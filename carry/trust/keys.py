"""The signing key pair: ECDSA P-256, as cosign uses it. `keygen` writes a new pair (PKCS#8 PEM, mode 0600,
encrypted with $CARRY_SIGNING_KEY_PASSWORD when set; the public key SubjectPublicKeyInfo PEM); `load_private` reads
the key $CARRY_SIGNING_KEY names (PKCS#8 or SEC1 PEM, maybe encrypted), `load_public` the key of `verify --key`.

The key's bytes and passphrase stay in this process: never in argv, a log line, a layer or a label. An unreadable
key or a wrong passphrase is bad input (exit 2), found before anything is pushed."""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from carry.util.errors import BadInput

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.types import PrivateKeyTypes, PublicKeyTypes

KEY_ENV = "CARRY_SIGNING_KEY"
PASSWORD_ENV = "CARRY_SIGNING_KEY_PASSWORD"
PRIVATE_NAME = "carry.key"
PUBLIC_NAME = "carry.pub"
COSIGN_MARKERS = (b"ENCRYPTED SIGSTORE PRIVATE KEY", b"ENCRYPTED COSIGN PRIVATE KEY")


@dataclasses.dataclass(frozen=True)
class SigningKey:
    """A loaded private key: signs bytes (ECDSA P-256 over SHA-256, ASN.1 DER, as cosign does)."""

    _key: object = dataclasses.field(repr=False)
    source: str  # where it came from (a path), for messages

    def sign(self, data: bytes) -> bytes:
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.asymmetric import ec

        return self._key.sign(data, ec.ECDSA(hashes.SHA256()))  # type: ignore[attr-defined]

    @property
    def public(self) -> PublicKey:
        return PublicKey(self._key.public_key(), self.source)  # type: ignore[attr-defined]


@dataclasses.dataclass(frozen=True)
class PublicKey:
    _key: object = dataclasses.field(repr=False)
    source: str

    def verifies(self, signature: bytes, data: bytes) -> bool:
        from cryptography.exceptions import InvalidSignature
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.asymmetric import ec

        try:
            self._key.verify(signature, data, ec.ECDSA(hashes.SHA256()))  # type: ignore[attr-defined]
        except (InvalidSignature, ValueError):
            return False
        return True

    def pem(self) -> bytes:
        return self._info("PEM")

    @property
    def fingerprint(self) -> str:
        """sha256 of the DER SubjectPublicKeyInfo: names the key in output without showing it."""
        return "sha256:" + hashlib.sha256(self._info("DER")).hexdigest()

    def _info(self, encoding: str) -> bytes:
        """The SubjectPublicKeyInfo, as PEM or DER."""
        from cryptography.hazmat.primitives import serialization

        info = serialization.PublicFormat.SubjectPublicKeyInfo
        return self._key.public_bytes(getattr(serialization.Encoding, encoding), info)  # type: ignore[attr-defined]


def _p256(key: PrivateKeyTypes | PublicKeyTypes, where: str) -> None:
    from cryptography.hazmat.primitives.asymmetric import ec

    if isinstance(key, (ec.EllipticCurvePrivateKey, ec.EllipticCurvePublicKey)) and isinstance(key.curve, ec.SECP256R1):
        return
    kind = getattr(getattr(key, "curve", None), "name", None) or type(key).__name__.lstrip("_")
    raise BadInput(f"{where}: a {kind} key; carry signs with ECDSA P-256 (make one with `carry keygen DIR`)")


def keygen(directory: Path, environ: Mapping[str, str]) -> tuple[Path, Path]:
    """A new pair in `directory`: carry.key (PKCS#8 PEM, 0600, maybe encrypted) and carry.pub; never overwrites."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    private, public = directory / PRIVATE_NAME, directory / PUBLIC_NAME
    for path in (private, public):
        if path.exists() or path.is_symlink():
            raise BadInput(f"{path} exists; carry keygen never overwrites a key: choose another directory")
    if directory.exists() and not directory.is_dir():
        raise BadInput(f"{directory} is not a directory; name a directory for carry.key and carry.pub")
    directory.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    password = environ.get(PASSWORD_ENV, "")
    encryption = serialization.BestAvailableEncryption(password.encode()) if password else serialization.NoEncryption()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption)
    with os.fdopen(os.open(private, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as handle:
        handle.write(pem)
    try:
        with os.fdopen(os.open(public, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644), "wb") as handle:
            handle.write(PublicKey(key.public_key(), str(public)).pem())
    except BaseException:
        private.unlink(missing_ok=True)
        raise
    return private, public


def from_environment(environ: Mapping[str, str]) -> SigningKey | None:
    """The key $CARRY_SIGNING_KEY names (with $CARRY_SIGNING_KEY_PASSWORD), or None when it is not set."""
    path = environ.get(KEY_ENV, "")
    return load_private(Path(path), environ.get(PASSWORD_ENV) or None, f"${KEY_ENV}") if path else None


def load_private(path: Path, password: str | None, named_by: str = "the key") -> SigningKey:
    from cryptography.hazmat.primitives import serialization

    where = f"{named_by} ({path})"
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise BadInput(f"{where}: cannot read it ({exc.strerror}); name an ECDSA P-256 private key file") from None
    if any(marker in data for marker in COSIGN_MARKERS):
        der = _cosign_private(data, password, where)
        try:
            key = serialization.load_der_private_key(der, None)
        except ValueError:
            raise BadInput(f"{where}: cosign's key holds no readable private key") from None
        _p256(key, where)
        return SigningKey(key, str(path))
    if b"PRIVATE KEY-----" not in data:
        raise BadInput(f"{where}: not a PEM private key; use a PKCS#8 PEM ECDSA P-256 key (`carry keygen DIR`)")
    encrypted = b"ENCRYPTED PRIVATE KEY" in data or b"Proc-Type: 4,ENCRYPTED" in data
    if encrypted and not password:
        raise BadInput(f"{where}: the key is encrypted; set ${PASSWORD_ENV} to its passphrase")
    try:
        key = serialization.load_pem_private_key(data, password.encode() if password and encrypted else None)
    except Exception as exc:  # ValueError, TypeError, and cryptography's UnsupportedAlgorithm and kin
        if encrypted and isinstance(exc, (ValueError, TypeError)):
            raise BadInput(f"{where}: wrong passphrase in ${PASSWORD_ENV} (the key does not decrypt)") from None
        raise BadInput(f"{where}: not a readable private key ({_short(exc)})") from None
    _p256(key, where)
    return SigningKey(key, str(path))


def load_public(path: Path) -> PublicKey:
    """The public key `verify --key` checks with: SubjectPublicKeyInfo PEM (carry.pub, cosign.pub)."""
    from cryptography.hazmat.primitives import serialization

    where = f"--key {path}"
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise BadInput(f"{where}: cannot read it ({exc.strerror}); name the public key file (carry.pub)") from None
    if b"PRIVATE KEY" in data:
        raise BadInput(f"{where}: this is a private key; pass the public one (carry.pub), which is all verify needs")
    try:
        key = serialization.load_pem_public_key(data)
    except (ValueError, TypeError) as exc:
        raise BadInput(f"{where}: not a PEM public key ({_short(exc)}); pass carry.pub or cosign.pub") from None
    except Exception as exc:
        raise BadInput(f"{where}: not a readable public key ({_short(exc)})") from None
    _p256(key, where)
    return PublicKey(key, str(path))


def _cosign_private(data: bytes, password: str | None, where: str) -> bytes:
    """cosign's own format (`cosign generate-key-pair`): a PEM block (`ENCRYPTED SIGSTORE PRIVATE KEY`, earlier
    `ENCRYPTED COSIGN PRIVATE KEY`) of go-securesystemslib's encrypted JSON around the PKCS#8 DER key."""
    body = b"".join(line for line in data.splitlines() if line and not line.startswith(b"-----"))
    try:
        document = base64.b64decode(body)
    except ValueError:
        raise BadInput(f"{where}: not a readable cosign key (its PEM is not base64)") from None
    return decrypt_secretbox(document, password, where)


def decrypt_secretbox(document: bytes, password: str | None, where: str) -> bytes:
    """go-securesystemslib's `encrypted` format: {"kdf": {"name": "scrypt", "params": {"N", "r", "p"}, "salt"},
    "cipher": {"name": "nacl/secretbox", "nonce"}, "ciphertext"}, byte fields base64; the key is scrypt(password,
    salt, N, r, p, 32) and the ciphertext NaCl's secretbox (XSalsa20-Poly1305) of the plaintext."""
    import json

    try:
        found = json.loads(document)
        kdf, cipher = found["kdf"], found["cipher"]
        params = kdf["params"]
        salt = base64.b64decode(kdf["salt"])
        nonce = base64.b64decode(cipher["nonce"])
        ciphertext = base64.b64decode(found["ciphertext"])
        n, r, p = int(params["N"]), int(params["r"]), int(params["p"])
    except (ValueError, KeyError, TypeError):
        raise BadInput(f"{where}: not a readable cosign key (its PEM does not hold cosign's JSON)") from None
    if kdf.get("name") != "scrypt" or cipher.get("name") != "nacl/secretbox" or len(nonce) != 24:
        raise BadInput(f"{where}: cosign key with kdf {kdf.get('name')} / cipher {cipher.get('name')}: not supported")
    try:
        import nacl.exceptions
        import nacl.secret
    except ImportError:
        raise BadInput(
            f"{where}: a cosign-format key needs PyNaCl (pip install pynacl); or sign with a PKCS#8 key "
            f"(`carry keygen DIR`), which cosign imports with `cosign import-key-pair`"
        ) from None
    try:
        secret = hashlib.scrypt((password or "").encode(), salt=salt, n=n, r=r, p=p, maxmem=512 << 20, dklen=32)
    except ValueError:
        raise BadInput(f"{where}: unsupported scrypt parameters N={n} r={r} p={p}") from None
    try:
        return nacl.secret.SecretBox(secret).decrypt(ciphertext, nonce)
    except nacl.exceptions.CryptoError:
        raise BadInput(f"{where}: wrong passphrase in ${PASSWORD_ENV} (cosign's key does not decrypt)") from None


def _short(exc: Exception) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:120] if text else type(exc).__name__
