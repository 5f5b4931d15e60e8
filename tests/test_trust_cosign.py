"""docs/trust.md kept true by cosign itself: the real cosign (Debian's 2.5.0, ci/cosign.sh), offline and by key,
on the demo's two-platform image as `image --push` signs it, and carry on what cosign signs.

- cosign accepts what carry signs: `cosign verify` of the index and of each platform, `cosign verify-attestation
  --type cyclonedx` and `--type slsaprovenance1` of each platform, and `cosign download attestation` gives statements
  about the platform digests; with a key from `carry keygen` (encrypted) and with cosign's own `cosign.key` as
  carry's signing key. `verify-attestation --type urn:carry:upstream-suite:v1` accepts the suite report carry
  attests (and refuses another key); `verify --require suite` passes that image and fails one without.
- cosign refuses another key, an image re-pushed unsigned under the tag, a tampered `.att` layer and an SBOM
  statement about another digest.
- carry accepts what cosign signs: `cosign sign --recursive` and `cosign attest --type cyclonedx` on an image carry
  pushed unsigned; `verify IMAGE --key cosign.pub` checks both and names what differs from carry's own.
- No key and no passphrase on any command line, in any output, log, label or attachment.

One module fixture pushes the demo three times into one repository (the second and third pushes rebuild nothing):
signed with cosign.key, unsigned (then signed by cosign), and signed with carry's key, last, so that the tags are
that image's, as a user would verify it. Each check of cosign asserts its exit code and reads its output."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

import cosign_tool
import dockerenv
from carry.trust import attach, kinds
from helpers import ROOT, Result, carry, find_in_tree
from procwatch import command_lines

CYCLONEDX, SLSA_PROVENANCE = kinds.SBOM.predicate_type, kinds.PROVENANCE.predicate_type
SUITE = kinds.KINDS["suite"].predicate_type

pytestmark = [pytest.mark.docker, pytest.mark.slow]

PLATFORMS = ("linux/amd64", "linux/arm64")
CARRY_PASSWORD = "carry-key-pass-" + os.urandom(8).hex()
COSIGN_PASSWORD = "cosign-key-pass-" + os.urandom(8).hex()
TYPES = {"cyclonedx": CYCLONEDX, "slsaprovenance1": SLSA_PROVENANCE}
SIGNERS = ("carry-key", "cosign-key")
VERIFIED = "The signatures were verified against the specified public key"


@dataclasses.dataclass(frozen=True)
class Pushed:
    """One `image --push` of both platforms: the index's digest, each platform's, and what carry said."""

    index: str
    platforms: dict[str, str]
    result: Result


def push(signed: dict, key: Path | None, password: str | None, which: str) -> Pushed:
    """`image --push` of both platforms, its config labelled `which`: the images are reproducible (the same inputs
    give the same digests), so each push names another image by that label alone (no build stage runs again)."""
    section = signed["env"].image_section(signed["name"], PLATFORMS, f"  labels:\n    org.example.push: {which}\n")
    dockerenv.set_image_section(signed["project"] / "build.yaml", section)
    env = dict(signed["run_env"])
    if key is not None:
        env.update(CARRY_SIGNING_KEY=str(key), CARRY_SIGNING_KEY_PASSWORD=password or "")
    project, name, version = signed["project"], signed["name"], signed["version"]
    argv = ["--config", str(project / "build.yaml"), "image", "--push", "--hermetic"]
    for platform in PLATFORMS:
        argv += ["--platform", platform]
    result = carry(*argv, env=env, cwd=project, timeout=3000)
    # each push moves the tags to its own images: the earlier ones keep no tag, so forget() would not find them
    signed["made"].update(image.id for image in dockerenv.docker_client().images.list(name=name))
    assert result.code == 0, result.out + result.err
    rows = {line.split("  ")[0]: line.split("  ")[1:] for line in result.out.splitlines() if line.startswith(name)}
    digests = {p: rows[f"{name}:{version}-{p.split('/')[1]}"][0] for p in PLATFORMS}
    return Pushed(rows[f"{name}:{version}"][0], digests, result)


@pytest.fixture(scope="module")
def signed(tmp_path_factory):
    env = dockerenv.require()
    base = tmp_path_factory.mktemp("cosign")
    project = base / "demo"
    shutil.copytree(ROOT / "examples" / "demo", project)
    name = f"{env.registry}/carry-cosign-{os.urandom(3).hex()}"
    dockerenv.set_image_section(project / "build.yaml", env.image_section(name, PLATFORMS))
    (base / "docker-config").mkdir()
    found = {
        "env": env,
        "base": base,
        "project": project,
        "name": name,
        "made": set(),  # every local image a push made (the third push's tags leave the first two untagged)
        "version": (project / "VERSION").read_text().strip(),
        "run_env": {
            "CARRY_CACHE": str(base / "cache"),
            "CARRY_DOCKER": dockerenv.DOCKER_CLI,
            "DOCKER_HOST": env.docker_host,
            "DOCKER_CONFIG": str(base / "docker-config"),
            "CARRY_REGISTRY_USER": env.registry_user,
            "CARRY_REGISTRY_PASSWORD": env.registry_password(),
        },
    }
    with cosign_tool.logged_in(env) as cosign:
        found["cosign"] = cosign
        try:
            with command_lines() as seen:
                made = carry("keygen", str(base / "carry"), env={"CARRY_SIGNING_KEY_PASSWORD": CARRY_PASSWORD})
                assert made.code == 0, made.err
                assert carry("keygen", str(base / "other"), env={"CARRY_SIGNING_KEY_PASSWORD": ""}).code == 0
                cosign_key, cosign_pub = cosign.generate_key_pair(base / "cosign", COSIGN_PASSWORD)
                pushes = {
                    "cosign-key": push(found, cosign_key, COSIGN_PASSWORD, "cosign-key"),
                    "unsigned": push(found, None, None, "unsigned"),
                }
                found["by_cosign"] = by_cosign(found, cosign, pushes["unsigned"], cosign_key)
                found["suites"] = suite_reports(found)  # beside the fixed wheels: the last push attests them
                pushes["carry-key"] = push(found, base / "carry" / "carry.key", CARRY_PASSWORD, "carry-key")  # the tags
            digests = [d for p in pushes.values() for d in (p.index, *p.platforms.values())]
            assert len(set(digests)) == len(digests), f"each push names images of its own (its label): {pushes}"
            found.update(
                seen=seen,
                pushes=pushes,
                keys={"carry-key": base / "carry" / "carry.pub", "cosign-key": cosign_pub},
                private={"carry-key": base / "carry" / "carry.key", "cosign-key": cosign_key},
                other=base / "other" / "carry.pub",
            )
            yield found
        finally:
            dockerenv.forget(name, found["made"])


def by_cosign(found: dict, cosign: cosign_tool.Cosign, unsigned: Pushed, key: Path) -> dict[str, cosign_tool.Ran]:
    """cosign signs the unsigned push (the index and, --recursive, each platform) and attests each platform's SBOM,
    the file `image --push` wrote to dist/."""
    name, version = found["name"], found["version"]
    runs = {"sign": cosign.sign(key, f"{name}@{unsigned.index}", COSIGN_PASSWORD, "--recursive")}
    for platform, digest in unsigned.platforms.items():
        sbom = found["project"] / "dist" / f"pledemo-{version}-linux-{platform.split('/')[1]}.cdx.json"
        runs[platform] = cosign.attest(key, f"{name}@{digest}", "cyclonedx", sbom, COSIGN_PASSWORD)
    for what, ran in runs.items():
        assert ran.code == 0, (what, ran.text())
    return runs


def suite_reports(found: dict) -> dict[str, dict]:
    """A suite report beside each platform's fixed wheel in dist/ (where `carry suite` writes it), about that wheel:
    its file name and sha256 from the SBOM the earlier pushes wrote (the image is reproducible, the wheel too)."""
    from packageurl import PackageURL

    from carry.trust import sbom

    reports = {}
    for platform in PLATFORMS:
        dist = found["project"] / "dist"
        arch = platform.split("/")[1]
        document = json.loads((dist / f"pledemo-{found['version']}-linux-{arch}.cdx.json").read_text())
        fixed = sbom.pedigreed(document)
        assert fixed is not None, document
        name = PackageURL.from_string(fixed["purl"]).qualifiers[sbom.PURL_FILE]
        sha256 = next(h["content"] for h in fixed["hashes"] if h["alg"] == "SHA-256")
        reports[platform] = {
            "kind": "carry-upstream-suite",
            "verdict": "PASS",
            "line": "3 same (3 passed both) · 0 regressed · 0 fixed",
            "wheel": {"name": name, "sha256": f"sha256:{sha256}"},
            "against": {"name": "pledemo-0.3.0-py3-none-any.whl"},
        }
        (dist / f"{name}.suite.json").write_text(json.dumps(reports[platform]))
    return reports


def refs(signed: dict, signer: str) -> dict[str, tuple[str, str]]:
    """(reference, the digest it names) of the index and each platform: carry's key by the tags a user pulls (its
    push was the last), cosign's key by digest."""
    pushed, name, version = signed["pushes"][signer], signed["name"], signed["version"]
    if signer == "carry-key":
        found = {"index": (f"{name}:{version}", pushed.index)}
        found.update({p: (f"{name}:{version}-{p.split('/')[1]}", d) for p, d in pushed.platforms.items()})
        return found
    return {"index": (f"{name}@{pushed.index}", pushed.index)} | {
        p: (f"{name}@{d}", d) for p, d in pushed.platforms.items()
    }


def registry(signed: dict):
    from carry.image import registryhttp

    auth = {"username": signed["env"].registry_user, "password": signed["env"].registry_password()}
    return registryhttp.Repository.of(signed["name"], auth)


def repush(signed: dict, source: str, tag: str) -> str:
    """What someone with push rights does: `source` again under `tag` with one label more (a new config, the same
    layers), so a new digest without a signature; returns that digest."""
    repo = registry(signed)
    media, body = repo.get_manifest(source)
    manifest = json.loads(body)
    config = json.loads(repo.get_blob(manifest["config"]["digest"]))
    config["config"]["Labels"]["org.example.repushed"] = tag
    data = json.dumps(config).encode()
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    repo.upload_bytes(data, digest)
    manifest["config"] = {**manifest["config"], "digest": digest, "size": len(data)}
    return repo.put_manifest(tag, json.dumps(manifest).encode(), media)


# -- the cosign used -------------------------------------------------------------------------------------------------


def test_the_cosign_is_debians_2_5_0_and_the_docs_name_the_versions_verified_against():
    stamp = cosign_tool.package().split()
    assert stamp[0] == "cosign" and stamp[1].startswith("2.5.0-") and stamp[4] == "trixie", stamp
    assert re.fullmatch(r"[0-9a-f]{64}", stamp[3]), stamp
    skopeo = subprocess.run(["skopeo", "--version"], capture_output=True, text=True, check=True).stdout
    assert "1.9.3" in skopeo, skopeo
    text = (ROOT / "docs" / "trust.md").read_text()
    assert "cosign 2.5.0" in text and "skopeo 1.9.3" in text


# -- cosign accepts what carry signs -----------------------------------------------------------------------------


@pytest.mark.parametrize("signer", SIGNERS)
def test_cosign_verifies_the_index_and_each_platform(signed, signer):
    for what, (ref, digest) in refs(signed, signer).items():
        ran = signed["cosign"].verify(signed["keys"][signer], ref)
        assert ran.code == 0, (what, ran.text())
        assert VERIFIED in ran.err, ran.text()
        (payloads,) = ran.json_lines()
        assert {json.dumps(p["critical"], sort_keys=True) for p in payloads} == {
            json.dumps(
                {
                    "identity": {"docker-reference": signed["name"]},
                    "image": {"docker-manifest-digest": digest},
                    "type": "cosign container image signature",
                },
                sort_keys=True,
            )
        }, ran.out


@pytest.mark.parametrize("signer", SIGNERS)
@pytest.mark.parametrize("kind", sorted(TYPES))
def test_cosign_verifies_the_sbom_and_the_provenance_of_each_platform(signed, signer, kind):
    for platform in PLATFORMS:
        ref, digest = refs(signed, signer)[platform]
        ran = signed["cosign"].verify_attestation(signed["keys"][signer], ref, kind)
        assert ran.code == 0, ran.text()
        assert VERIFIED in ran.err
        (statement,) = ran.statements()
        assert statement["_type"] == "https://in-toto.io/Statement/v1"
        assert statement["predicateType"] == TYPES[kind]
        assert statement["subject"] == [{"name": signed["name"], "digest": {"sha256": digest.split(":", 1)[1]}}]
        predicate = statement["predicate"]
        if kind == "cyclonedx":
            assert predicate["bomFormat"] == "CycloneDX" and predicate["specVersion"] == "1.6"
            assert {c["name"] for c in predicate["components"]} >= {"pledemo"}
        else:
            assert predicate["buildDefinition"]["externalParameters"]["platform"] == platform
            assert predicate["runDetails"]["builder"]["id"] == "urn:carry:builder"


@pytest.mark.parametrize("signer", SIGNERS)
def test_cosign_downloads_statements_about_the_platform_digests(signed, signer):
    index_ref, _ = refs(signed, signer)["index"]
    for platform in PLATFORMS:
        _, digest = refs(signed, signer)[platform]
        ran = signed["cosign"].download_attestation(index_ref, "--platform", platform)
        assert ran.code == 0, ran.text()
        statements = ran.statements()
        suite = [SUITE] if signer == "carry-key" else []  # the suite report is written before carry's push only
        assert sorted(s["predicateType"] for s in statements) == sorted([*TYPES.values(), *suite])
        for statement in statements:
            assert [s["digest"]["sha256"] for s in statement["subject"]] == [digest.split(":", 1)[1]], platform


# -- cosign refuses ---------------------------------------------------------------------------------------------


def test_cosign_refuses_another_key(signed):
    cosign = signed["cosign"]
    for what, (ref, _) in refs(signed, "carry-key").items():
        ran = cosign.verify(signed["other"], ref)
        assert ran.code == 12 and "no matching signatures" in ran.err, (what, ran.text())
        assert ran.json_lines() == []
    ref, _ = refs(signed, "carry-key")["linux/amd64"]
    for kind in TYPES:
        ran = cosign.verify_attestation(signed["other"], ref, kind)
        assert ran.code == 1 and "no matching attestations" in ran.err, ran.text()
        assert ran.json_lines() == []
    # carry's key is not cosign's: the cosign-key push does not verify with carry.pub either
    ran = cosign.verify(signed["keys"]["carry-key"], refs(signed, "cosign-key")["index"][0])
    assert ran.code == 12, ran.text()


def test_cosign_verifies_the_suite_report_and_verify_require_suite_holds_to_it(signed, tmp_path):
    cosign, name, version = signed["cosign"], signed["name"], signed["version"]
    for platform in PLATFORMS:
        ref, digest = refs(signed, "carry-key")[platform]
        ran = cosign.verify_attestation(signed["keys"]["carry-key"], ref, SUITE)
        assert ran.code == 0, ran.text()
        (statement,) = ran.statements()
        assert statement["predicateType"] == SUITE and statement["predicate"] == signed["suites"][platform]
        assert statement["subject"] == [{"name": name, "digest": {"sha256": digest.split(":", 1)[1]}}]
        refused = cosign.verify_attestation(signed["other"], ref, SUITE)
        assert refused.code == 1 and "no matching attestations" in refused.err, refused.text()
    env = signed["env"]
    login = {"CARRY_REGISTRY_USER": env.registry_user, "CARRY_REGISTRY_PASSWORD": env.registry_password()}
    asked = ("--platform", "linux/amd64", "--require", "suite")
    held = carry(
        "verify", f"{name}:{version}", "--key", str(signed["keys"]["carry-key"]), *asked, cwd=tmp_path, env=login
    )
    assert held.code == 0, held.out + held.err
    assert "suite: signed report of the fixed wheel, PASS: 3 same" in held.out, held.out
    ref, digest = refs(signed, "cosign-key")["linux/amd64"]  # pushed before the report was written
    lacking = carry("verify", ref, "--key", str(signed["keys"]["cosign-key"]), *asked, cwd=tmp_path, env=login)
    assert lacking.code == 1, lacking.out + lacking.err
    tag = attach.att_tag(digest)
    assert f"FAIL suite: no {SUITE} attestation under {tag}" in lacking.out, lacking.out


def test_cosign_refuses_an_image_repushed_unsigned_under_the_tag(signed):
    cosign, key, repo = signed["cosign"], signed["keys"]["carry-key"], registry(signed)
    ref = f"{signed['name']}:repushed"
    amd64 = signed["pushes"]["carry-key"].platforms["linux/amd64"]
    media, body = repo.get_manifest(amd64)
    assert repo.put_manifest("repushed", body, media) == amd64  # the tag names the signed manifest: accepted
    before = cosign.verify(key, ref)
    assert before.code == 0, before.text()
    digest = repush(signed, amd64, "repushed")
    after = cosign.verify(key, ref)
    assert after.code == 10 and "no signatures found" in after.err, after.text()
    attested = cosign.verify_attestation(key, ref, "cyclonedx")
    assert attested.code == 1 and "no matching attestations" in attested.err, attested.text()
    assert repo.get_manifest(attach.sig_tag(digest)) is None


def test_cosign_refuses_a_tampered_att_layer(signed):
    """A copy of the amd64 image attested with carry's key (cosign accepts it), then its SBOM envelope's statement
    changed with the signature left as it was."""
    import base64

    from carry.trust import keys

    cosign, key, repo = signed["cosign"], signed["keys"]["carry-key"], registry(signed)
    amd64 = signed["pushes"]["carry-key"].platforms["linux/amd64"]
    digest = repush(signed, amd64, "tampered")
    sbom = attach.read_statements(repo, None, amd64, (CYCLONEDX,)).by_type[CYCLONEDX]["predicate"]
    private = keys.load_private(signed["private"]["carry-key"], CARRY_PASSWORD)
    attach.attest(repo, private, signed["name"], digest, [(CYCLONEDX, sbom)])
    ref = f"{signed['name']}@{digest}"
    before = cosign.verify_attestation(key, ref, "cyclonedx")
    assert before.code == 0, before.text()
    assert [len(s["predicate"]["components"]) for s in before.statements()] == [len(sbom["components"])]
    tag = attach.att_tag(digest)
    manifest = json.loads(repo.get_manifest(tag)[1])
    (layer,) = manifest["layers"]
    envelope = json.loads(repo.get_blob(layer["digest"]))
    statement = json.loads(base64.b64decode(envelope["payload"]))
    statement["predicate"]["components"] = statement["predicate"]["components"][1:]
    envelope["payload"] = base64.b64encode(json.dumps(statement).encode()).decode()
    forged = json.dumps(envelope).encode()
    manifest["layers"] = [{**layer, "digest": "sha256:" + hashlib.sha256(forged).hexdigest(), "size": len(forged)}]
    repo.upload_bytes(forged, manifest["layers"][0]["digest"])
    repo.put_manifest(tag, json.dumps(manifest).encode(), attach.OCI_MANIFEST)
    after = cosign.verify_attestation(key, ref, "cyclonedx")
    assert after.code == 1 and "no matching attestations" in after.err, after.text()
    assert after.json_lines() == []


def test_cosign_refuses_an_sbom_statement_about_another_digest(signed):
    """A new image under a tag whose `.att` holds carry's statements, signed with the key, about another digest."""
    cosign, key, repo = signed["cosign"], signed["keys"]["carry-key"], registry(signed)
    amd64 = signed["pushes"]["carry-key"].platforms["linux/amd64"]
    digest = repush(signed, amd64, "other-subject")
    media, body = repo.get_manifest(attach.att_tag(amd64))
    repo.put_manifest(attach.att_tag(digest), body, media)
    for kind in TYPES:
        ran = cosign.verify_attestation(key, f"{signed['name']}:other-subject", kind)
        assert ran.code == 1 and "no matching subject digest found" in ran.err, ran.text()
        assert ran.json_lines() == []


# -- carry accepts what cosign signs -----------------------------------------------------------------------------


def test_carry_verifies_cosigns_signature_and_statement_and_names_what_differs(signed, tmp_path):
    unsigned, name, key = signed["pushes"]["unsigned"], signed["name"], signed["keys"]["cosign-key"]
    cosign = signed["cosign"]
    checked = cosign.verify(key, f"{name}@{unsigned.index}")
    assert checked.code == 0, checked.text()
    for digest in unsigned.platforms.values():
        checked = cosign.verify_attestation(key, f"{name}@{digest}", "cyclonedx")
        assert checked.code == 0, checked.text()
        (statement,) = checked.statements()
        assert statement["_type"] == "https://in-toto.io/Statement/v0.1", "what cosign 2.5 writes"
    env = signed["env"]
    login = {"CARRY_REGISTRY_USER": env.registry_user, "CARRY_REGISTRY_PASSWORD": env.registry_password()}
    result = carry("verify", f"{name}@{unsigned.index}", "--key", str(key), cwd=tmp_path, env=login)
    assert result.code == 1, result.out + result.err  # no provenance: cosign attested the SBOM only
    blocks = result.out.split(f"{name}@{unsigned.index} ")[1:]
    assert [b.split(" ", 1)[0] for b in blocks] == list(PLATFORMS), result.out
    for platform, block in zip(PLATFORMS, blocks, strict=True):
        digest = unsigned.platforms[platform]
        hexdigest = digest.split(":", 1)[1]
        index_tag = attach.sig_tag(unsigned.index)
        assert f"signature: the index {index_tag} verifies with the key" in block, block
        assert f"signature: sha256-{hexdigest}.sig verifies with the key" in block, block
        assert (
            "SBOM: signed, CycloneDX 1.6, 3 components = the 3 distributions the layers install; the fixed "
            "package's pedigree carries 2 patch(es); its statement is https://in-toto.io/Statement/v0.1 "
            "(carry's own are Statement v1)" in block
        ), block
        fails = [line.strip() for line in block.splitlines() if line.strip().startswith("FAIL")]
        assert fails == [
            f"FAIL provenance: no https://slsa.dev/provenance/v1 attestation under sha256-{hexdigest}.att (it holds "
            "https://cyclonedx.org/bom only)"
        ], block


# -- no secret anywhere ----------------------------------------------------------------------------------------------


def secrets(signed: dict) -> list[str]:
    """Both keys' passphrases, every base64 line of both private keys' PEM, and the registry password."""
    pems = [line for key in signed["private"].values() for line in key.read_text().splitlines()[1:-1]]
    return [CARRY_PASSWORD, COSIGN_PASSWORD, signed["env"].registry_password(), *pems]


def test_no_key_or_passphrase_in_any_argv_output_log_label_or_attachment(signed):
    needles = secrets(signed)
    assert signed["private"]["cosign-key"].read_text().startswith("-----BEGIN ENCRYPTED SIGSTORE PRIVATE KEY-----")
    assert signed["private"]["carry-key"].read_text().startswith("-----BEGIN ENCRYPTED PRIVATE KEY-----")
    runs = signed["cosign"].runs
    assert {r.argv[1] for r in runs} >= {"generate-key-pair", "sign", "attest", "verify", "verify-attestation"}
    seen = signed["seen"]
    assert any("cosign sign --key" in line for line in seen), "the /proc scan saw cosign sign"
    assert any("image --push" in line for line in seen), "the /proc scan saw the pushes"
    said = [r.text() for r in runs] + [p.result.out + p.result.err for p in signed["pushes"].values()]
    for needle in needles:
        assert not [line for line in seen if needle in line]
        assert not [text for text in said if needle in text]
    base, cosign = signed["base"], signed["cosign"]
    for tree in (base / "cache", base / "docker-config", base / "demo", cosign.home, cosign.docker_config):
        assert find_in_tree(tree, needles) == [], tree
    assert list((base / "cache" / "logs").glob("image-*.log")), "the logs were scanned"
    held = held_by_the_registry(signed)
    assert b"cosign container image signature" in held and b"org.opencontainers.image.created" in held
    for needle in needles:
        assert needle.encode() not in held


def held_by_the_registry(signed: dict) -> bytes:
    """Every manifest under every tag of the repository, each image's config (its labels) and every layer of the
    signatures and attestations."""
    repo = registry(signed)
    status, _, body = repo.request("GET", f"/v2/{repo.name}/tags/list")
    assert status == 200, body
    held = b""
    for tag in json.loads(body)["tags"]:
        _, manifest = repo.get_manifest(tag)
        held += manifest
        found = json.loads(manifest)
        if "config" in found:
            held += repo.get_blob(found["config"]["digest"])
        if tag.endswith((".sig", ".att")):
            held += b"".join(repo.get_blob(layer["digest"]) for layer in found["layers"])
    return held
