"""Signatures and attestations attached to an image the way cosign attaches them, in the image's own repository:

- `sha256-<hex>.sig`: an OCI manifest whose layers are simple-signing payloads, each with its base64 signature in the
  layer annotation `dev.cosignproject.cosign/signature` (what skopeo and podman read);
- `sha256-<hex>.att`: the same shape, whose layers are DSSE envelopes annotated with an empty signature and their
  `predicateType`, as `cosign attest` stores them.

Others' signatures under a tag are kept; carry's own, of the same payload or predicate type, are replaced. The
registry is reached through `store` (carry.image.registryhttp.Repository: `upload_bytes`, `put_manifest`,
`get_manifest`, `get_blob`)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import TYPE_CHECKING, Protocol

from carry.trust import signing
from carry.trust.keys import PublicKey, SigningKey
from carry.trust.kinds import title
from carry.util.errors import Failed

if TYPE_CHECKING:

    class Registry(Protocol):
        """What attach reaches the registry through (carry.image.registryhttp.Repository)."""

        def upload_bytes(self, data: bytes, digest: str) -> object: ...

        def put_manifest(self, reference: str, body: bytes, media_type: str) -> str: ...

        def get_manifest(self, reference: str) -> tuple[str, bytes] | None: ...

        def get_blob(self, digest: str) -> bytes: ...


OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
SIMPLE_SIGNING = "application/vnd.dev.cosign.simplesigning.v1+json"
DSSE_ENVELOPE = "application/vnd.dsse.envelope.v1+json"
SIGNATURE_ANNOTATION = "dev.cosignproject.cosign/signature"
CERTIFICATE_ANNOTATION = "dev.sigstore.cosign/certificate"
BUNDLE_ANNOTATION = "dev.sigstore.cosign/bundle"
PREDICATE_ANNOTATION = "predicateType"
EPOCH = "0001-01-01T00:00:00Z"


def sig_tag(digest: str) -> str:
    return digest.replace(":", "-", 1) + ".sig"


def att_tag(digest: str) -> str:
    return digest.replace(":", "-", 1) + ".att"


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


@dataclasses.dataclass(frozen=True)
class Layer:
    media_type: str
    data: bytes
    annotations: dict[str, str]

    def descriptor(self) -> dict:
        return {
            "mediaType": self.media_type,
            "size": len(self.data),
            "digest": _digest(self.data),
            "annotations": dict(self.annotations),
        }


@dataclasses.dataclass(frozen=True)
class Attached:
    """One attachment pushed: its tag, the digest of its manifest, how many layers it holds, what was done."""

    kind: str  # signature | sbom | provenance
    tag: str
    digest: str
    layers: int
    action: str  # pushed | already signed

    def line(self, subject: str) -> str:
        return f"{self.kind:<10} {subject[:19]}  {self.tag}  {self.digest}  ({self.layers} layer(s), {self.action})"


def read_layers(store: Registry, tag: str) -> list[Layer]:
    """The layers under `tag` (none when the tag does not exist), each blob checked against its digest."""
    found = store.get_manifest(tag)
    if found is None:
        return []
    _, body = found
    try:
        manifest = json.loads(body)
        descriptors = manifest.get("layers") or []
    except (ValueError, AttributeError):
        raise Failed(f"{tag}: not a readable OCI manifest") from None
    layers = []
    for descriptor in descriptors:
        data = store.get_blob(descriptor["digest"])
        if _digest(data) != descriptor["digest"]:
            raise Failed(f"{tag}: a layer's bytes hash to {_digest(data)[:19]}…, not {descriptor['digest'][:19]}…")
        layers.append(Layer(descriptor.get("mediaType", ""), data, dict(descriptor.get("annotations") or {})))
    return layers


def _push(store: Registry, tag: str, layers: list[Layer]) -> str:
    config = json.dumps(
        {
            "architecture": "",
            "created": EPOCH,
            "history": [{"created": EPOCH} for _ in layers],
            "os": "",
            "rootfs": {"type": "layers", "diff_ids": [_digest(layer.data) for layer in layers]},
            "config": {},
        },
        separators=(",", ":"),
    ).encode()
    for layer in layers:
        store.upload_bytes(layer.data, _digest(layer.data))
    store.upload_bytes(config, _digest(config))
    manifest = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "config": {"mediaType": OCI_CONFIG, "size": len(config), "digest": _digest(config)},
            "layers": [layer.descriptor() for layer in layers],
        },
        separators=(",", ":"),
    ).encode()
    store.put_manifest(tag, manifest, OCI_MANIFEST)
    return _digest(manifest)


def sign(store: Registry, key: SigningKey, repository: str, digest: str) -> Attached:
    """A simple-signing signature of `repository@digest` under `sha256-<hex>.sig`."""
    tag = sig_tag(digest)
    payload = signing.simple_signing_payload(repository, digest)
    existing = read_layers(store, tag)
    public = key.public
    for layer in existing:
        if layer.data == payload and signing.verify_simple(
            public, payload, layer.annotations.get(SIGNATURE_ANNOTATION, "")
        ):
            found = store.get_manifest(tag)
            return Attached("signature", tag, _digest(found[1]) if found else "", len(existing), "already signed")
    ours = Layer(SIMPLE_SIGNING, payload, {SIGNATURE_ANNOTATION: signing.sign_simple(key, payload)})
    layers = existing + [ours]
    return Attached("signature", tag, _push(store, tag, layers), len(layers), "pushed")


def attest(store: Registry, key: SigningKey, subject: str, digest: str, predicates: list[tuple[str, dict]]) -> Attached:
    """Signed DSSE envelopes of in-toto statements about `digest` (one per predicate type) under `sha256-<hex>.att`;
    carry's earlier envelopes of the same types are replaced, unless each says the same but for the run's times."""
    tag = att_tag(digest)
    public = key.public
    wanted = {kind: json.loads(signing.statement(subject, digest, kind, predicate)) for kind, predicate in predicates}
    existing = read_layers(store, tag)
    kept, same = [], set()
    for layer in existing:
        kind = layer.annotations.get(PREDICATE_ANNOTATION)
        if kind in wanted:
            try:
                statement, ours = signing.open_envelope(layer.data, public)
            except (ValueError, KeyError, TypeError):
                statement, ours = {}, False
            if ours:
                if kind not in same and _timeless(statement) == _timeless(wanted[kind]):
                    same.add(kind)
                    kept.append(layer)
                continue
        kept.append(layer)
    if same == set(wanted) and len(kept) == len(existing):
        found = store.get_manifest(tag)
        return Attached("attestation", tag, _digest(found[1]) if found else "", len(existing), "already attested")
    for predicate_type, predicate in predicates:
        if predicate_type in same:
            continue
        body = signing.statement(subject, digest, predicate_type, predicate)
        annotations = {SIGNATURE_ANNOTATION: "", PREDICATE_ANNOTATION: predicate_type}
        kept.append(Layer(DSSE_ENVELOPE, signing.envelope(key, body), annotations))
    return Attached("attestation", tag, _push(store, tag, kept), len(kept), "pushed")


def _timeless(statement: dict) -> dict:
    """A statement without the times of the run that made it (SLSA's runDetails.metadata: startedOn, finishedOn)."""
    copy = json.loads(json.dumps(statement))
    run = (copy.get("predicate") or {}).get("runDetails")
    if isinstance(run, dict):
        run.pop("metadata", None)
    return copy


# -- reading back (verify) ----------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class SignatureCheck:
    """What the `.sig` of one digest holds for one key: whether a signature verifies for it, and what else is there."""

    digest: str
    tag: str
    ok: bool
    layers: int
    keyless: int
    problems: tuple[str, ...]


def check_signature(store: Registry, key: PublicKey, repository: str, digest: str) -> SignatureCheck:
    tag = sig_tag(digest)
    layers = [layer for layer in read_layers(store, tag) if layer.media_type == SIMPLE_SIGNING]
    keyless = sum(1 for layer in layers if layer.annotations.get(CERTIFICATE_ANNOTATION))
    problems = []
    for layer in layers:
        if not signing.verify_simple(key, layer.data, layer.annotations.get(SIGNATURE_ANNOTATION, "")):
            continue
        found = signing.read_simple(layer.data)
        if found is None:
            problems.append(f"{tag}: a payload signed with the key is not a simple-signing payload")
        elif found[1] != digest:
            problems.append(f"{tag}: the signed payload names {found[1]}, not {digest}")
        elif found[0] != repository:
            problems.append(f"{tag}: the signature is for {found[0]}, not {repository}")
        else:
            return SignatureCheck(digest, tag, True, len(layers), keyless, ())
    if not layers:
        problems.append(f"no signature: the registry has no {tag} for {digest}")
    elif not problems:
        problems.append(
            f"{tag}: none of its {len(layers)} signature(s) verifies with the key {key.fingerprint[:19]}…"
            + (
                f"; {keyless} is keyless (a certificate from a workflow's identity): a public key cannot check "
                f"it, `cosign verify --certificate-identity … --certificate-oidc-issuer …` does"
                if keyless
                else ""
            )
        )
    return SignatureCheck(digest, tag, False, len(layers), keyless, tuple(problems))


@dataclasses.dataclass(frozen=True)
class Statements:
    """The `.att` statements on one digest, by predicate type, verifying with the key (without one: all); problems."""

    by_type: dict[str, dict]
    problems: tuple[str, ...]
    layers: int


def read_statements(store: Registry, key: PublicKey | None, digest: str, wanted: tuple[str, ...]) -> Statements:
    tag = att_tag(digest)
    layers = read_layers(store, tag)
    found: dict[str, dict] = {}
    unsigned: dict[str, int] = {}
    problems = []
    for layer in layers:
        if layer.media_type != DSSE_ENVELOPE:
            continue
        try:
            statement, good = signing.open_envelope(layer.data, key)
        except (ValueError, KeyError, TypeError) as exc:
            problems.append(f"{tag}: an envelope is not readable ({exc})")
            continue
        kind = statement.get("predicateType", "")
        if key is not None and not good:
            unsigned[kind] = unsigned.get(kind, 0) + 1
            continue
        subjects = [s.get("digest", {}).get("sha256") for s in statement.get("subject") or []]
        if digest.split(":", 1)[1] not in subjects:
            problems.append(f"{tag}: a {kind} statement is about {subjects}, not {digest}")
            continue
        found.setdefault(kind, statement)
    held = sorted({*found, *unsigned})
    for kind in wanted:
        if kind in found:
            continue
        if unsigned.get(kind):
            problems.append(
                f"{title(kind)}: the {kind} envelope under {tag} does not verify with the key (tampered, or "
                f"signed with another key)"
            )
        else:
            problems.append(
                f"{title(kind)}: no {kind} attestation under {tag}"
                + (f" (it holds {', '.join(held)} only)" if held else "")
            )
    return Statements(found, tuple(problems), len(layers))
