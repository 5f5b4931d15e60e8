"""The two signed forms cosign writes, made and checked here with the key pair of carry.trust.keys:

- **simple signing** (the `.sig` attachment): the payload naming the repository and manifest digest, signed as it is
  (ECDSA P-256, SHA-256, DER); skopeo and podman accept exactly these fields.
- **DSSE** (the `.att` attachment): an envelope of an in-toto Statement v1, signed over its PAE. Read back, a Statement
  v0.1 is accepted too: `cosign attest` (2.5) writes that type, with the same subject, predicateType and predicate."""

from __future__ import annotations

import base64
import json

from carry.trust.keys import PublicKey, SigningKey

SIMPLE_SIGNING_TYPE = "cosign container image signature"
IN_TOTO_PAYLOAD = "application/vnd.in-toto+json"
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
STATEMENT_V01 = "https://in-toto.io/Statement/v0.1"  # what `cosign attest` writes
READ_STATEMENT_TYPES = (STATEMENT_TYPE, STATEMENT_V01)


def simple_signing_payload(repository: str, digest: str) -> bytes:
    """The payload cosign signs for `repository@digest` (field order and spacing as cosign's Go encoder writes)."""
    return json.dumps(
        {
            "critical": {
                "identity": {"docker-reference": repository},
                "image": {"docker-manifest-digest": digest},
                "type": SIMPLE_SIGNING_TYPE,
            },
            "optional": None,
        },
        separators=(",", ":"),
    ).encode()


def sign_simple(key: SigningKey, payload: bytes) -> str:
    return base64.b64encode(key.sign(payload)).decode()


def read_simple(payload: bytes) -> tuple[str, str] | None:
    """(docker-reference, docker-manifest-digest) of a simple-signing payload; None if it is not one."""
    try:
        found = json.loads(payload)
        critical = found["critical"]
        if critical["type"] != SIMPLE_SIGNING_TYPE:
            return None
        return str(critical["identity"]["docker-reference"]), str(critical["image"]["docker-manifest-digest"])
    except (ValueError, KeyError, TypeError):
        return None


def verify_simple(key: PublicKey, payload: bytes, signature_b64: str) -> bool:
    try:
        signature = base64.b64decode(signature_b64, validate=True)
    except ValueError:
        return False
    return key.verifies(signature, payload)


def pae(payload_type: str, body: bytes) -> bytes:
    """DSSE v1's pre-authentication encoding."""
    kind = payload_type.encode()
    return b"DSSEv1 %d %s %d %s" % (len(kind), kind, len(body), body)


def statement(subject_name: str, digest: str, predicate_type: str, predicate: dict) -> bytes:
    """An in-toto Statement v1 about one subject (`digest` as `sha256:<hex>`)."""
    algorithm, _, value = digest.partition(":")
    return json.dumps(
        {
            "_type": STATEMENT_TYPE,
            "subject": [{"name": subject_name, "digest": {algorithm: value}}],
            "predicateType": predicate_type,
            "predicate": predicate,
        },
        separators=(",", ":"),
    ).encode()


def envelope(key: SigningKey, body: bytes, payload_type: str = IN_TOTO_PAYLOAD) -> bytes:
    """A signed DSSE envelope of `body`, as JSON bytes (keyid empty, as cosign writes it)."""
    signature = key.sign(pae(payload_type, body))
    return json.dumps(
        {
            "payloadType": payload_type,
            "payload": base64.b64encode(body).decode(),
            "signatures": [{"keyid": "", "sig": base64.b64encode(signature).decode()}],
        },
        separators=(",", ":"),
    ).encode()


def open_envelope(data: bytes, key: PublicKey | None) -> tuple[dict, bool]:
    """(the statement in a DSSE envelope, whether a signature verifies under `key`); ValueError for unreadable JSON."""
    document = json.loads(data)
    payload_type = document["payloadType"]
    body = base64.b64decode(document["payload"])
    good = key is not None and any(
        verify_simple(key, pae(payload_type, body), entry.get("sig", "")) for entry in document.get("signatures") or []
    )
    if payload_type != IN_TOTO_PAYLOAD:
        raise ValueError(f"payloadType {payload_type!r}, not {IN_TOTO_PAYLOAD}")
    found = json.loads(body)
    if not isinstance(found, dict) or found.get("_type") not in READ_STATEMENT_TYPES:
        raise ValueError("not an in-toto Statement (v1, or v0.1 as cosign attest writes it)")
    return found, good
