"""Signing, SBOM and provenance without a registry (carry/trust): the key pair `keygen` writes and the keys carry
refuses (exit 2, before any work); cosign's simple-signing payload; DSSE envelopes checked by securesystemslib's
verifier (not carry's); the SBOM validated against the CycloneDX 1.6 schema, with the carried patches as the fixed
package's pedigree; the SLSA provenance read back; the `.sig` / `.att` attachments in an in-memory store, and each
way verify names what failed (missing, wrong key, tampered envelope, keyless). The registry and skopeo half is in
tests/test_verify_locked.py (signed images) and tests/test_secrets.py (the key never leaks); the real cosign's, both
ways, in tests/test_trust_cosign.py."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import stat
from pathlib import Path

import pytest

from carry.trust import attach, keys, kinds, provenance, sbom, signing
from carry.trust.facts import CarriedPatch, ImageFacts, Source, Wheel
from carry.util import reporter
from helpers import ROOT, assert_bad_input, carry

CYCLONEDX, SLSA_PROVENANCE = kinds.SBOM.predicate_type, kinds.PROVENANCE.predicate_type

PASSWORD = "pass-" + os.urandom(6).hex()
SUITE = kinds.KINDS["suite"].predicate_type
HELD = (kinds.SBOM.predicate_type, kinds.PROVENANCE.predicate_type)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    directory = tmp_path_factory.mktemp("keys") / "k"
    result = carry("keygen", str(directory), env={"CARRY_SIGNING_KEY_PASSWORD": ""})
    assert result.code == 0, result.err
    return directory, result


def test_keygen_writes_a_p256_pair_and_prints_the_public_key_last(pair):
    directory, result = pair
    private, public = directory / "carry.key", directory / "carry.pub"
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    assert private.read_bytes().startswith(b"-----BEGIN PRIVATE KEY-----")  # PKCS#8, not encrypted
    assert public.read_bytes().startswith(b"-----BEGIN PUBLIC KEY-----")  # SubjectPublicKeyInfo
    assert result.out.strip().splitlines()[-1] == str(public)
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    loaded = serialization.load_pem_private_key(private.read_bytes(), None)
    assert isinstance(loaded.curve, ec.SECP256R1)
    assert keys.load_private(private, None).public.pem() == public.read_bytes()


def test_keygen_never_overwrites(pair):
    directory, _ = pair
    before = (directory / "carry.key").read_bytes()
    assert_bad_input(carry("keygen", str(directory)), "carry.key exists", "never overwrites")
    assert (directory / "carry.key").read_bytes() == before


def test_keygen_encrypts_with_the_password_and_a_wrong_one_is_bad_input(tmp_path):
    result = carry("keygen", str(tmp_path / "enc"), env={"CARRY_SIGNING_KEY_PASSWORD": PASSWORD})
    assert result.code == 0, result.err
    private = tmp_path / "enc" / "carry.key"
    assert private.read_bytes().startswith(b"-----BEGIN ENCRYPTED PRIVATE KEY-----")
    assert PASSWORD not in result.out + result.err
    assert keys.load_private(private, PASSWORD).public.pem() == (tmp_path / "enc" / "carry.pub").read_bytes()
    with pytest.raises(keys.BadInput, match="wrong passphrase"):
        keys.load_private(private, "not-" + PASSWORD)
    with pytest.raises(keys.BadInput, match="encrypted; set \\$CARRY_SIGNING_KEY_PASSWORD"):
        keys.load_private(private, None)


def test_keys_carry_refuses(tmp_path):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec, rsa

    rsa_key = tmp_path / "rsa.pem"
    rsa_key.write_bytes(
        rsa.generate_private_key(65537, 2048).private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    p384 = tmp_path / "p384.pem"
    p384.write_bytes(
        ec.generate_private_key(ec.SECP384R1()).private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    (tmp_path / "garbage.pem").write_text("-----BEGIN PRIVATE KEY-----\nnot base64\n-----END PRIVATE KEY-----\n")
    with pytest.raises(keys.BadInput, match="carry signs with ECDSA P-256"):
        keys.load_private(rsa_key, None)
    with pytest.raises(keys.BadInput, match="secp384r1"):
        keys.load_private(p384, None)
    with pytest.raises(keys.BadInput, match="not a readable private key"):
        keys.load_private(tmp_path / "garbage.pem", None)
    with pytest.raises(keys.BadInput, match="cannot read it"):
        keys.load_private(tmp_path / "missing.pem", None)
    with pytest.raises(keys.BadInput, match="this is a private key"):
        keys.load_public(p384)


def test_a_bad_key_or_passphrase_stops_image_push_before_any_work(tmp_path, pair):
    """`image --push` loads $CARRY_SIGNING_KEY first: exit 2, one line, no build, nothing pushed."""
    project = tmp_path / "demo"
    shutil.copytree(ROOT / "examples" / "demo", project, ignore=shutil.ignore_patterns("upstream"))
    config = project / "build.yaml"
    env = {"CARRY_CACHE": str(tmp_path / "cache"), "CARRY_SIGNING_KEY": str(tmp_path / "nope.key")}
    assert_bad_input(carry("--config", str(config), "image", "--push", env=env), "$CARRY_SIGNING_KEY", "nope.key")
    encrypted = carry("keygen", str(tmp_path / "enc"), env={"CARRY_SIGNING_KEY_PASSWORD": PASSWORD})
    assert encrypted.code == 0
    env.update(CARRY_SIGNING_KEY=str(tmp_path / "enc" / "carry.key"), CARRY_SIGNING_KEY_PASSWORD="wrong")
    result = carry("--config", str(config), "image", "--push", env=env)
    assert_bad_input(result, "wrong passphrase")
    assert "wrong" not in result.err.split("wrong passphrase", 1)[1], "the passphrase itself is never shown"
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").rglob("image-*.log"))


def test_an_unknown_attestation_is_bad_input_naming_the_known_ones(tmp_path):
    """`image --attest NAME` with a name not in carry.trust.kinds: exit 2, one line, nothing built or written."""
    project = tmp_path / "demo"
    shutil.copytree(ROOT / "examples" / "demo", project, ignore=shutil.ignore_patterns("upstream"))
    env = {"CARRY_CACHE": str(tmp_path / "cache")}
    result = carry("--config", str(project / "build.yaml"), "image", "--push", "--attest", "spdx=x", env=env)
    assert_bad_input(result, "--attest 'spdx'", "sbom, provenance")
    assert not (tmp_path / "cache").exists() and not (project / "dist").exists()


def test_the_kinds_table_names_each_predicate_type_and_resolves_attest():
    """One table: each kind's name, title and in-toto predicate type round trip; `--attest` adds to the defaults
    or leaves one out, in the table's order."""
    assert list(kinds.KINDS) == ["sbom", "provenance", "suite"]
    assert [(k.predicate_type, kinds.title(k.predicate_type)) for k in kinds.KINDS.values()] == [
        ("https://cyclonedx.org/bom", "SBOM"),
        ("https://slsa.dev/provenance/v1", "provenance"),
        ("urn:carry:upstream-suite:v1", "suite"),
    ]
    assert kinds.title("https://example.com/other") == "https://example.com/other"
    assert kinds.chosen(()) == kinds.DEFAULT == (("sbom", ""), ("provenance", ""), ("suite", ""))
    assert kinds.chosen(("provenance", "sbom=off", "suite=off")) == (("provenance", ""),)
    for bad, needle in (
        ("spdx", "'spdx'.*sbom, provenance, suite"),
        ("sbom=x", "takes no ARG"),
        ("suite=/no", "no such"),
    ):
        with pytest.raises(kinds.BadInput, match=needle):
            kinds.chosen((bad,))


def test_verify_key_with_a_wheel_or_an_unreadable_key_is_bad_input(tmp_path, pair):
    directory, _ = pair
    wheel = tmp_path / "x-1.0-py3-none-any.whl"
    wheel.write_bytes(b"")
    result = carry("verify", str(wheel), "--key", str(directory / "carry.pub"), cwd=tmp_path)
    assert result.code == 2 and "--key checks an image's signature" in result.err, result.err
    result = carry("verify", "127.0.0.1:1/x:1", "--key", str(tmp_path / "missing.pub"), cwd=tmp_path)
    assert_bad_input(result, "--key", "missing.pub", "cannot read it")


# -- the signed forms --------------------------------------------------------------------------------------------


def test_simple_signing_payload_is_cosigns(pair):
    directory, _ = pair
    key = keys.load_private(directory / "carry.key", None)
    digest = "sha256:" + "ab" * 32
    payload = signing.simple_signing_payload("127.0.0.1:5055/carry-x", digest)
    assert json.loads(payload) == {
        "critical": {
            "identity": {"docker-reference": "127.0.0.1:5055/carry-x"},
            "image": {"docker-manifest-digest": digest},
            "type": "cosign container image signature",
        },
        "optional": None,
    }
    signature = signing.sign_simple(key, payload)
    assert signing.verify_simple(key.public, payload, signature)
    assert not signing.verify_simple(key.public, payload.replace(b"ab", b"cd"), signature)
    # the signature is plain ECDSA over SHA-256 (ASN.1 DER), as any verifier checks it
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    public = serialization.load_pem_public_key((directory / "carry.pub").read_bytes())
    public.verify(base64.b64decode(signature), payload, ec.ECDSA(hashes.SHA256()))


def test_dsse_envelopes_verify_with_securesystemslib(pair):
    from securesystemslib.dsse import Envelope
    from securesystemslib.exceptions import VerificationError
    from securesystemslib.signer import SSlibKey

    directory, _ = pair
    key = keys.load_private(directory / "carry.key", None)
    body = signing.statement("127.0.0.1:5055/x", "sha256:" + "12" * 32, SLSA_PROVENANCE, {"a": 1})
    data = signing.envelope(key, body)
    from cryptography.hazmat.primitives.serialization import load_pem_public_key

    pem = (directory / "carry.pub").read_bytes()
    trusted = SSlibKey.from_crypto(load_pem_public_key(pem), scheme="ecdsa-sha2-nistp256")
    trusted = SSlibKey("", trusted.keytype, trusted.scheme, trusted.keyval)  # cosign's envelopes name no keyid
    envelope = Envelope.from_dict(json.loads(data))
    assert envelope.payload_type == "application/vnd.in-toto+json"
    assert set(envelope.verify([trusted], 1)) == {""}
    statement = json.loads(envelope.payload)
    assert statement["_type"] == "https://in-toto.io/Statement/v1"
    assert statement["subject"] == [{"name": "127.0.0.1:5055/x", "digest": {"sha256": "12" * 32}}]
    tampered = json.loads(data)
    tampered["payload"] = base64.b64encode(body.replace(b'"a":1', b'"a":2')).decode()
    with pytest.raises(VerificationError):
        Envelope.from_dict(tampered).verify([trusted], 1)


# -- the SBOM and the provenance ---------------------------------------------------------------------------------


def demo_facts(patches_dir: Path = ROOT / "patches") -> ImageFacts:
    from carry.source import series

    loaded = series.load(patches_dir)
    wheels = tuple(
        Wheel(f"dep_{i}", f"1.{i}", f"dep_{i}-1.{i}-py3-none-any.whl", hashlib.sha256(b"%d" % i).hexdigest())
        for i in range(5)
    )
    return ImageFacts(
        repository="127.0.0.1:5055/carry-trust",
        version="20261201.1",
        platform="linux/arm64",
        created="2026-12-01T10:00:00Z",
        base_ref="carry-test/runtime-base:arm64",
        base_digest="sha256:" + "cd" * 32,
        distributions=wheels,
        fixed=Wheel("vllm", "0.33.0+carry.20261201.1", "vllm-0.33.0+carry.20261201.1-cp38-abi3-x.whl", "ef" * 32),
        release=Wheel("vllm", "0.33.0", "vllm-0.33.0-cp38-abi3-manylinux_2_31_aarch64.whl", "01" * 32),
        upstream_url="https://git.example/vllm.git",
        upstream_commit="f561eca6ca4f3f79808a696b1521cb76dc8aafa2",
        upstream_pr=53899,
        series_hash=loaded.hash,
        patches=tuple(
            CarriedPatch(p.name, p.sha256, p.path.read_text(), p.subject, str(p.upstream_status), p.forwarded)
            for p in loaded.patches
        ),
        carry_version="0.1.0",
        config=Source("build.yaml", "44" * 32, "upstream:\n  url: x\n"),
        lock=Source("runtime-lock/linux-arm64.txt", "55" * 32),
    )


def test_the_sbom_is_valid_cyclonedx_with_the_patches_as_pedigree():
    facts = demo_facts()
    document = sbom.make(facts)
    assert sbom.validate(document) is None
    assert sbom.make(facts) == document, "the same facts give the same bytes"
    found = json.loads(document)
    assert found["bomFormat"] == "CycloneDX" and found["specVersion"] == "1.6"
    assert found["metadata"]["tools"]["components"] == [{"name": "carry", "type": "application", "version": "0.1.0"}]
    image = found["metadata"]["component"]
    assert image["type"] == "container" and image["version"] == "20261201.1"
    (base,) = image["pedigree"]["ancestors"]
    assert base["name"] == facts.base_ref and base["hashes"] == [{"alg": "SHA-256", "content": "cd" * 32}]
    assert len(found["components"]) == len(facts.distributions) + 1
    assert sbom.installed(found)[("dep-3", "1.3")] == facts.distributions[3].sha256
    dep = next(c for c in found["components"] if c["name"] == "dep_0")
    assert dep["purl"] == "pkg:pypi/dep-0@1.0?file_name=dep_0-1.0-py3-none-any.whl"
    fixed = next(c for c in found["components"] if c.get("pedigree"))
    assert fixed["purl"].startswith("pkg:pypi/vllm@0.33.0%2Bcarry.20261201.1?file_name=")
    pedigree = fixed["pedigree"]
    assert {a["version"] for a in pedigree["ancestors"]} == {"0.33.0", facts.upstream_commit}
    assert pedigree["commits"] == [{"uid": facts.upstream_commit, "url": facts.upstream_url}]
    assert len(pedigree["patches"]) == len(facts.patches) == 2
    by_text = {p["diff"]["text"]["content"]: p for p in pedigree["patches"]}
    for patch in facts.patches:
        entry = by_text[patch.text]  # the whole patch file, its diff included
        assert entry["type"] == "unofficial"  # Upstream-Status: Submitted
        (resolved,) = entry["resolves"]
        assert (
            resolved["source"]["url"] == patch.forwarded and resolved["id"] == "#" + patch.forwarded.rsplit("/", 1)[1]
        )
    broken = json.loads(document)
    broken["components"][0]["hashes"][0]["alg"] = "SHA-257"
    assert sbom.validate(json.dumps(broken).encode()) is not None


def test_the_provenance_names_commit_patches_wheels_lock_and_base():
    facts = demo_facts()
    predicate = provenance.make(facts, True, "2026-12-01T10:00:00Z", "2026-12-01T10:01:00Z")
    assert predicate["runDetails"]["builder"] == {"id": "urn:carry:builder", "version": {"carry": "0.1.0"}}
    external = predicate["buildDefinition"]["externalParameters"]
    assert external["version"] == "20261201.1" and external["config"]["text"] == facts.config.text
    digests = [d["digest"] for d in predicate["buildDefinition"]["resolvedDependencies"]]
    assert {"gitCommit": facts.upstream_commit} in digests
    assert all({"sha256": p.sha256} in digests for p in facts.patches)
    assert {"sha256": "ef" * 32} in digests and {"sha256": "01" * 32} in digests  # fixed + precompiled wheels
    assert {"sha256": "55" * 32} in digests and {"sha256": "cd" * 32} in digests  # lock, base image
    found = provenance.read(predicate)
    assert found.commit == facts.upstream_commit and found.series_hash == facts.series_hash
    assert provenance.series_hash(found.patches) == facts.series_hash
    fixed = next(c for c in json.loads(sbom.make(facts))["components"] if c.get("pedigree"))
    labels = {"io.carry.upstream.commit": facts.upstream_commit, "io.carry.series.hash": facts.series_hash}
    assert provenance.self_consistent(found, fixed, labels, "linux/arm64") == []
    other = dict(labels, **{"io.carry.upstream.commit": "0" * 40})
    assert provenance.self_consistent(found, fixed, other, "linux/amd64") != []


# -- the attachments, in a store that keeps them in memory --------------------------------------------------------


class MemoryStore:
    """The four calls carry.trust.attach makes of a registry, on dicts."""

    def __init__(self):
        self.blobs: dict[str, bytes] = {}
        self.manifests: dict[str, tuple[str, bytes]] = {}

    def upload_bytes(self, data: bytes, digest: str) -> bool:
        assert digest == "sha256:" + hashlib.sha256(data).hexdigest()
        new = digest not in self.blobs
        self.blobs[digest] = data
        return new

    def put_manifest(self, reference: str, body: bytes, media_type: str) -> str:
        self.manifests[reference] = (media_type, body)
        return "sha256:" + hashlib.sha256(body).hexdigest()

    def get_manifest(self, reference: str):
        return self.manifests.get(reference)

    def get_blob(self, digest: str) -> bytes:
        return self.blobs[digest]


def test_attachments_are_cosigns_shape_and_each_failure_is_named(pair, tmp_path):
    directory, _ = pair
    key = keys.load_private(directory / "carry.key", None)
    other = keys.keygen(tmp_path / "other", {})[0]
    stranger = keys.load_private(other, None)
    store, repo, digest = MemoryStore(), "127.0.0.1:5055/carry-trust", "sha256:" + "9a" * 32
    signed = attach.sign(store, key, repo, digest)
    assert signed.tag == "sha256-" + "9a" * 32 + ".sig" and signed.action == "pushed"
    media, body = store.manifests[signed.tag]
    manifest = json.loads(body)
    assert media == manifest["mediaType"] == "application/vnd.oci.image.manifest.v1+json"
    assert manifest["config"]["mediaType"] == "application/vnd.oci.image.config.v1+json"
    (layer,) = manifest["layers"]
    assert layer["mediaType"] == "application/vnd.dev.cosign.simplesigning.v1+json"
    assert set(layer["annotations"]) == {"dev.cosignproject.cosign/signature"}
    assert attach.sign(store, key, repo, digest).action == "already signed"
    assert attach.sign(store, stranger, repo, digest).layers == 2, "another key's signature is added beside"
    assert attach.check_signature(store, key.public, repo, digest).ok
    assert (
        "not 127.0.0.1:5055/other"
        in attach.check_signature(store, key.public, "127.0.0.1:5055/other", digest).problems[0]
    )
    missing = attach.check_signature(store, key.public, repo, "sha256:" + "00" * 32)
    assert not missing.ok and "no signature" in missing.problems[0]

    facts = demo_facts()
    predicates = [(CYCLONEDX, json.loads(sbom.make(facts))), (SLSA_PROVENANCE, {"x": 1})]
    attested = attach.attest(store, key, repo, digest, predicates)
    att = json.loads(store.manifests[attested.tag][1])
    assert [(x["mediaType"], x["annotations"]) for x in att["layers"]] == [
        ("application/vnd.dsse.envelope.v1+json", {"dev.cosignproject.cosign/signature": "", "predicateType": t})
        for t in (CYCLONEDX, SLSA_PROVENANCE)
    ]
    assert attach.attest(store, key, repo, digest, predicates).layers == 2, "carry's own are replaced, not piled up"
    read = attach.read_statements(store, key.public, digest, (CYCLONEDX, SLSA_PROVENANCE))
    assert read.problems == () and read.by_type[SLSA_PROVENANCE]["predicate"] == {"x": 1}
    wrong = attach.read_statements(store, stranger.public, digest, (CYCLONEDX,))
    assert (
        "SBOM: the https://cyclonedx.org/bom envelope" in wrong.problems[0] and "does not verify" in wrong.problems[0]
    )

    # an SBOM envelope whose statement was changed after signing (its signature left as it was)
    envelope = json.loads(store.blobs[att["layers"][0]["digest"]])
    statement = json.loads(base64.b64decode(envelope["payload"]))
    statement["predicate"]["components"].pop()
    envelope["payload"] = base64.b64encode(json.dumps(statement).encode()).decode()
    forged = json.dumps(envelope).encode()
    att["layers"][0] = {
        **att["layers"][0],
        "digest": "sha256:" + hashlib.sha256(forged).hexdigest(),
        "size": len(forged),
    }
    store.upload_bytes(forged, att["layers"][0]["digest"])
    store.put_manifest(attested.tag, json.dumps(att).encode(), attach.OCI_MANIFEST)
    read = attach.read_statements(store, key.public, digest, (CYCLONEDX, SLSA_PROVENANCE))
    assert read.problems and read.problems[0].startswith("SBOM:") and SLSA_PROVENANCE in read.by_type

    # a keyless signature (a certificate, as cosign writes in a workflow): --key cannot check it, and says so
    keyless = MemoryStore()
    payload = signing.simple_signing_payload(repo, digest)
    layer = attach.Layer(
        attach.SIMPLE_SIGNING,
        payload,
        {attach.SIGNATURE_ANNOTATION: signing.sign_simple(stranger, payload), attach.CERTIFICATE_ANNOTATION: "PEM"},
    )
    attach._push(keyless, attach.sig_tag(digest), [layer])
    found = attach.check_signature(keyless, key.public, repo, digest)
    assert not found.ok and found.keyless == 1 and "cosign verify --certificate-identity" in found.problems[0]


def test_a_statement_v0_1_as_cosign_attest_writes_it_is_read_and_named(pair):
    """cosign 2.5's `attest` writes in-toto Statement v0.1 (tests/test_trust_cosign.py runs it): read like v1, and
    verify names the difference; a missing predicate type names what the `.att` holds instead."""

    key = keys.load_private(pair[0] / "carry.key", None)
    store, digest = MemoryStore(), "sha256:" + "7c" * 32
    statement = {
        "_type": "https://in-toto.io/Statement/v0.1",
        "subject": [{"name": "127.0.0.1:5055/x", "digest": {"sha256": "7c" * 32}}],
        "predicateType": CYCLONEDX,
        "predicate": {"bomFormat": "CycloneDX"},
    }
    annotations = {attach.SIGNATURE_ANNOTATION: "", attach.PREDICATE_ANNOTATION: CYCLONEDX}
    envelope = signing.envelope(key, json.dumps(statement).encode())
    attach._push(store, attach.att_tag(digest), [attach.Layer(attach.DSSE_ENVELOPE, envelope, annotations)])
    read = attach.read_statements(store, key.public, digest, (CYCLONEDX, SLSA_PROVENANCE))
    assert read.by_type[CYCLONEDX] == statement
    assert read.problems == (
        f"provenance: no {SLSA_PROVENANCE} attestation under {attach.att_tag(digest)} (it holds {CYCLONEDX} only)",
    )
    assert kinds._other_statement_type(statement) == (
        "; its statement is https://in-toto.io/Statement/v0.1 (carry's own are Statement v1)"
    )
    assert kinds._other_statement_type({"_type": signing.STATEMENT_TYPE}) == ""
    unknown = signing.envelope(key, json.dumps({**statement, "_type": "https://in-toto.io/Statement/v9"}).encode())
    with pytest.raises(ValueError, match="not an in-toto Statement"):
        signing.open_envelope(unknown, key.public)


# -- cosign's own key format ------------------------------------------------------------------------------------

# go-securesystemslib's `encrypted` test vector (the library cosign seals its keys with): "supersecret" opens it
# to "reallyimportant".
SSL_VECTOR = (
    b'{"kdf":{"name":"scrypt","params":{"N":32768,"r":8,"p":1},"salt":"N9a7x5JFGbrtB2uBR81jPwp0eiLR4A7FV3mjVAQrg1g="},'
    b'"cipher":{"name":"nacl/secretbox","nonce":"2h8HxMmgRfuYdpswZBQaU3xJ1nkA/5Ik"},'
    b'"ciphertext":"SEW6sUh0jf2wfdjJGPNS9+bkk2uB+Cxamf32zR8XkQ=="}'
)


def test_cosign_keys_are_read(tmp_path):
    import nacl.secret
    import nacl.utils
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    assert keys.decrypt_secretbox(SSL_VECTOR, "supersecret", "vector") == b"reallyimportant"
    with pytest.raises(keys.BadInput, match="wrong passphrase"):
        keys.decrypt_secretbox(SSL_VECTOR, "supersecreT", "vector")
    # a P-256 key sealed as `cosign generate-key-pair` seals it, in its PEM block
    key = ec.generate_private_key(ec.SECP256R1())
    der = key.private_bytes(serialization.Encoding.DER, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    salt, nonce = os.urandom(32), nacl.utils.random(24)
    secret = hashlib.scrypt(PASSWORD.encode(), salt=salt, n=32768, r=8, p=1, maxmem=64 << 20, dklen=32)
    sealed = nacl.secret.SecretBox(secret).encrypt(der, nonce).ciphertext
    document = {
        "kdf": {"name": "scrypt", "params": {"N": 32768, "r": 8, "p": 1}, "salt": base64.b64encode(salt).decode()},
        "cipher": {"name": "nacl/secretbox", "nonce": base64.b64encode(nonce).decode()},
        "ciphertext": base64.b64encode(sealed).decode(),
    }
    body = base64.encodebytes(json.dumps(document).encode()).decode()
    path = tmp_path / "cosign.key"
    path.write_text(
        f"-----BEGIN ENCRYPTED SIGSTORE PRIVATE KEY-----\n{body}-----END ENCRYPTED SIGSTORE PRIVATE KEY-----\n"
    )
    loaded = keys.load_private(path, PASSWORD)
    assert loaded.public.pem() == key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    with pytest.raises(keys.BadInput, match="wrong passphrase"):
        keys.load_private(path, "not-it")


# -- the push side and the verify side together, on a memory store: what image --push attaches, verify reads -------


@pytest.fixture
def pushed_demo(tmp_path, pair):
    """A demo project's facts as `image --push` gathers them (its config, series and lock on disk, locked wheels in
    a download store laid out by sha256, the fixed and the release wheel), published with the key."""
    import zipfile

    from carry.config import load
    from carry.image.attest import Attester, PlatformFacts, wheel_of
    from carry.image.locked import runtimelock
    from carry.platforms import Platform
    from carry.source import series

    project = tmp_path / "demo"
    shutil.copytree(ROOT / "examples" / "demo", project, ignore=shutil.ignore_patterns("upstream", "*.bundle"))
    config = load(project / "build.yaml")

    def wheel(directory: Path, name: str, version: str) -> Path:
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"{name}-{version}-py3-none-any.whl"
        with zipfile.ZipFile(path, "w") as archive:
            archive.writestr(f"{name}/__init__.py", f"V = {version!r}\n")
        return path

    store, wheels, packages = tmp_path / "store", {}, []
    for name, version in (("alpha", "1.0"), ("beta_pkg", "2.1")):
        made = wheel(tmp_path / "made", name, version)
        sha = hashlib.sha256(made.read_bytes()).hexdigest()
        (store / sha).mkdir(parents=True)
        wheels[name.replace("_", "-")] = made.rename(store / sha / made.name)
        packages.append(runtimelock.Locked(name.replace("_", "-"), version, (f"sha256:{sha}",)))
    lock_path = project / "runtime-lock" / "linux-amd64.txt"
    lock_path.parent.mkdir()
    lock_path.write_text("# a lock\n")
    lock = runtimelock.Lock(
        lock_path, Platform.LINUX_AMD64, "3.11.2", "x86_64-manylinux_2_36", "base", "", "", "", tuple(packages)
    )
    fixed = wheel(project / "dist", "pledemo", "0.3.0+carry.20261130.1")
    release = wheel(tmp_path / "release", "pledemo", "0.3.0")
    key = keys.load_private(pair[0] / "carry.key", None)
    attester = Attester(key, config, series.load(config.patches_dir), "20261130.1", "0.1.0", project / "dist")
    labels = {
        "io.carry.upstream.url": "https://git.example/pledemo.git",
        "io.carry.upstream.commit": config.upstream.commit,
        "io.carry.series.hash": attester.series.hash,
        "io.carry.version": "20261130.1",
    }
    subject = PlatformFacts(
        platform=Platform.LINUX_AMD64,
        labels=labels,
        fixed=wheel_of(fixed),
        release=release,
        base_ref="carry-test/runtime-base:x",
        base={"Id": "sha256:" + "77" * 32},
        lock=lock,
        wheels=wheels,
    )
    facts = attester.facts(subject)
    store_ = MemoryStore()
    digest = "sha256:" + "5e" * 32
    with reporter.recording() as said:
        published = attester.platform(store_, facts, digest, locked=True)
        attester.index(store_, "sha256:" + "1d" * 32)
    installed = [("alpha", "1.0"), ("beta-pkg", "2.1"), ("pledemo", "0.3.0+carry.20261130.1")]
    return {
        "attester": attester,
        "said": said,
        "published": published,
        "store": store_,
        "digest": digest,
        "key": key,
        "labels": labels,
        "installed": installed,
        "facts": facts,
        "subject": subject,
        "expected": provenance.Expected(
            config.upstream.commit,
            tuple((p.name, p.sha256) for p in attester.series.patches),
            "20261130.1",
            hashlib.sha256(fixed.read_bytes()).hexdigest(),
            (lock_path.name, hashlib.sha256(lock_path.read_bytes()).hexdigest()),
        ),
    }


class CountingStore(MemoryStore):
    """A MemoryStore that keeps the order of its manifest PUTs and counts what it was sent, as registryhttp does."""

    def __init__(self):
        super().__init__()
        self.puts: list[str] = []
        self.sent = 0

    def upload_bytes(self, data: bytes, digest: str) -> bool:
        self.sent += len(data)
        return super().upload_bytes(data, digest)

    def put_manifest(self, reference: str, body: bytes, media_type: str) -> str:
        self.puts.append(reference)
        self.sent += len(body)
        return super().put_manifest(reference, body, media_type)

    def manifest_digest(self, reference: str) -> str | None:
        found = self.manifests.get(reference)
        return "sha256:" + hashlib.sha256(found[1]).hexdigest() if found else None


def test_the_publish_stage_keeps_the_push_order(pushed_demo):
    """Both families hand each platform to carry.image.publish.Stage: its manifest by digest, then its signature and
    attestations, then the records, then the list and its signature, the tags last; a rerun PUTs nothing again."""
    import dataclasses

    from carry.image import publish
    from carry.image.registryhttp import DOCKER_MANIFEST
    from carry.platforms import Platform

    attester = dataclasses.replace(pushed_demo["attester"], published=[])
    store, name = CountingStore(), "127.0.0.1:5055/carry-trust"
    arm = dataclasses.replace(pushed_demo["subject"], platform=Platform.LINUX_ARM64)
    manifests = [
        publish.Manifest(platform, json.dumps({"p": str(platform)}).encode(), DOCKER_MANIFEST, (f"{name}:{tag}",))
        for platform, tag in ((Platform.LINUX_AMD64, "v-amd64"), (Platform.LINUX_ARM64, "v-arm64"))
    ]
    digests = [manifest.digest for manifest in manifests]
    stage = publish.Stage(store, attester, locked=True)
    with reporter.silenced():
        stage.platform(manifests[0], pushed_demo["subject"])
        stage.platform(manifests[1], lambda: arm)
        sent, signed = stage.record(digests[0].replace(":", "-") + ".cache", [b"facts"], b"{}", "application/json")
        pushed = stage.tags((f"{name}:v", f"{name}:latest"))
    index = pushed[f"{name}:v"]
    sig, att = attach.sig_tag, attach.att_tag
    record = digests[0].replace(":", "-") + ".cache"
    assert store.puts == [
        *(digests[0], sig(digests[0]), att(digests[0])),
        *(digests[1], sig(digests[1]), att(digests[1])),
        *(record, sig("sha256:" + hashlib.sha256(b"{}").hexdigest())),
        *(index, sig(index)),
        *("v-amd64", "v-arm64", "v", "latest"),
    ]
    assert signed and sent > 0 and 0 < stage.trust_sent < store.sent
    assert pushed == {
        f"{name}:v-amd64": digests[0],
        f"{name}:v-arm64": digests[1],
        f"{name}:v": index,
        f"{name}:latest": index,
    }
    assert [done.platform for done in attester.published] == ["linux/amd64", "linux/arm64", "index"]
    store.puts.clear()
    with reporter.silenced():
        publish.Stage(store, None).tags((f"{name}:v",), manifests)
    assert store.puts == [], "a rerun finds every manifest and tag: nothing is PUT"


def check(demo, installed=None, expected="same", labels=None, key=None, require=()):
    from carry.image.inspect import trustcheck
    from carry.platforms import Platform

    manifest = trustcheck.Manifest(
        repository=demo["facts"].repository,
        digest=demo["digest"],
        platform=Platform.LINUX_AMD64,
        labels=labels if labels is not None else demo["labels"],
    )
    return trustcheck.check_platform(
        demo["store"],
        (key or demo["key"]).public,
        manifest,
        installed if installed is not None else demo["installed"],
        demo["expected"] if expected == "same" else expected,
        require=require,
    )


def test_what_push_attaches_verify_proves(pushed_demo):
    published = pushed_demo["published"]
    assert Path(published.to_json()["sbom"]).name == "pledemo-20261130.1-linux-amd64.cdx.json"
    assert published.to_json()["components"] == 3 and [a.kind for a in published.attached] == [
        "signature",
        "attestation",
    ]
    lines = pushed_demo["attester"].lines()
    assert any(line.startswith("sbom       linux/amd64:") for line in lines)
    assert sum(".sig  sha256:" in line for line in lines) == 2  # the platform manifest and the index
    assert [line for line in pushed_demo["said"] if not line.startswith(("sign: ", "trust: "))] == []  # no note
    timings = pushed_demo["attester"].timings
    assert timings.kinds["sbom"] > 0 and timings.signatures > 0 and timings.total < 30
    proven, problems = check(pushed_demo)
    assert problems == [], problems
    text = "\n".join(proven)
    assert "verifies with the key" in text and "SBOM: signed, CycloneDX 1.6, 3 components" in text
    assert "equal to this repository's commit, series, fixed wheel and lock" in text
    document = json.loads(Path(published.to_json()["sbom"]).read_bytes())
    assert sbom.installed(document)[("alpha", "1.0")] == pushed_demo["facts"].distributions[0].sha256


def test_verify_names_what_differs(pushed_demo, tmp_path):
    import dataclasses

    # the layers install a package the SBOM does not list, and lack one it lists
    installed = [("alpha", "1.0"), ("gamma", "3.0"), ("pledemo", "0.3.0+carry.20261130.1")]
    _, problems = check(pushed_demo, installed=installed)
    assert "SBOM: gamma 3.0 is installed in the layers but not in the SBOM" in problems
    assert "SBOM: lists beta-pkg 2.1, which the layers do not install" in problems
    # this repository moved on: another pin, another patch, another wheel in dist/, another lock
    moved = dataclasses.replace(
        pushed_demo["expected"],
        commit="0" * 40,
        patches=pushed_demo["expected"].patches[:1],
        fixed_sha256="ab" * 32,
        lock=("linux-amd64.txt", "cd" * 32),
        version="20261201.9",
    )
    _, problems = check(pushed_demo, expected=moved)
    found = "\n".join(problems)
    for needle in ("upstream commit", "patches 0001", "VERSION 20261130.1", "fixed wheel sha256", "lock sha256"):
        assert f"provenance: {needle}" in found, (needle, found)
    # labels that disagree with the provenance
    _, problems = check(pushed_demo, labels={**pushed_demo["labels"], "io.carry.series.hash": "f" * 64})
    assert any("io.carry.series.hash label" in p for p in problems)
    # another key: neither the signature nor the attestations verify
    other = keys.load_private(keys.keygen(tmp_path / "o", {})[0], None)
    _, problems = check(pushed_demo, key=other)
    assert problems[0].startswith("signature: sha256-") and "verifies with the key" in problems[0]
    assert any(p.startswith("SBOM: the https://cyclonedx.org/bom envelope") for p in problems)
    assert any(p.startswith("provenance: the https://slsa.dev/provenance/v1 envelope") for p in problems)


def test_without_a_key_nothing_is_attached_and_image_says_so(pushed_demo, tmp_path):
    import dataclasses

    store = MemoryStore()
    attester = dataclasses.replace(pushed_demo["attester"], key=None, published=[], dist=tmp_path)
    with reporter.silenced():
        done = dataclasses.replace(attester, published=[]).platform(
            store, pushed_demo["facts"], "sha256:" + "ee" * 32, True
        )
    assert done.attached == () and store.manifests == {} and Path(done.to_json()["sbom"]).exists()
    with reporter.recording() as said:  # two platforms published: the note is said once, with the first
        for digest in ("sha256:" + "ee" * 32, "sha256:" + "ef" * 32):
            attester.platform(store, pushed_demo["facts"], digest, locked=True)
    assert store.manifests == {}
    assert [line for line in said if not line.startswith("trust: ")] == [
        "not signed, nothing attached: set $CARRY_SIGNING_KEY to a key (`carry keygen DIR`)"
    ]


def test_the_suite_report_beside_the_fixed_wheel_is_attested_and_verify_shows_it(pushed_demo):
    """`<wheel>.suite.json` beside the fixed wheel in dist/ goes to the `.att` with the others; verify names its
    summary, and refuses one about another wheel than the provenance's fixed one."""
    facts, attester, store = pushed_demo["facts"], pushed_demo["attester"], pushed_demo["store"]
    report = {
        "kind": "carry-upstream-suite",
        "verdict": "PASS",
        "line": "3 same (3 passed both) · 0 regressed · 1 fixed",
        "wheel": {"name": facts.fixed.filename, "sha256": f"sha256:{facts.fixed.sha256}"},
        "against": {"name": "pledemo-0.3.0-py3-none-any.whl"},
    }
    path = attester.dist / f"{facts.fixed.filename}.suite.json"
    _, problems = check(pushed_demo, require=("suite",))  # verify --require suite: none attached yet
    tag = attach.att_tag(pushed_demo["digest"])
    assert problems == [f"suite: no {SUITE} attestation under {tag} (it holds {', '.join(sorted(HELD))} only)"]
    path.write_text(json.dumps(report))
    published = attester.platform(store, facts, pushed_demo["digest"], locked=True)
    assert published.attached[1].layers == 3
    assert any(line.startswith("suite      linux/amd64: ") and "PASS" in line for line in published.lines())
    proven, problems = check(pushed_demo)
    assert problems == [], problems
    assert any(line.startswith("suite: signed report of the fixed wheel, PASS: 3 same") for line in proven)
    assert check(pushed_demo, require=("suite",))[1] == []
    failed = {**report, "verdict": "FAIL", "line": "2 same · 1 regressed"}
    attach.attest(store, pushed_demo["key"], facts.repository, pushed_demo["digest"], [(SUITE, failed)])
    assert check(pushed_demo)[1] == []  # a signed report that did not pass is shown, and fails only when required
    assert check(pushed_demo, require=("suite",))[1] == [
        "suite: --require suite, and the signed report says FAIL: 2 same · 1 regressed"
    ]
    other = {**report, "wheel": {"name": "other.whl", "sha256": "sha256:" + "00" * 32}}
    path.write_text(json.dumps(other))
    with reporter.recording() as said:
        attester.platform(MemoryStore(), facts, pushed_demo["digest"], locked=True)
    assert f"linux/amd64: no suite report: {path} is not about {facts.fixed.filename}" in said
    attach.attest(store, pushed_demo["key"], facts.repository, pushed_demo["digest"], [(SUITE, other)])
    _, problems = check(pushed_demo)
    assert problems == [f"suite: the report is about other.whl, the image installs {facts.fixed.filename}"]
