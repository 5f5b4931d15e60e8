"""No credential leaks: not an upstream token in upstream.url, not the registry password, not a build secret.

tests/test_image.py checks the registry password and a build secret against carry's output, the logs, the
image history and labels, and a sampled argv. This file adds: credentials in upstream.url (offline, through a
real file:// URL with a user part, which git accepts), and for a push, every docker argv recorded by a
wrapper (no sampling gaps), a tight /proc scan, every file of the cache, the user's Docker config and temp
dir, the whole exported image filesystem and the manifest and config the registry actually holds.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import urllib.request
import zipfile
from pathlib import Path

import pytest
import yaml

import dockerenv
from helpers import ROOT, assert_bad_input, carry, find_in_tree, git
from procwatch import command_lines

TOKEN = "upstream-token-" + os.urandom(8).hex()
BUILD_SECRET = "build-secret-" + os.urandom(8).hex()
KEY_PASSWORD = "key-password-" + os.urandom(8).hex()


def stable_id(value: object) -> str | None:
    """A parametrized test's id without the random token (pytest-xdist's workers must collect the same ids)."""
    return value.replace(TOKEN, "TOKEN") if isinstance(value, str) else None


ARCHES = "9.0,12.1"


def recorder(directory: Path, name: str, real: str, log: Path) -> Path:
    """An executable `name` in `directory` that appends its arguments to `log`, then runs `real`."""
    directory.mkdir(parents=True, exist_ok=True)
    wrapper = directory / name
    wrapper.write_text(f'#!/bin/sh\nprintf \'%s \' {name} "$@" >> {log}\necho >> {log}\nexec {real} "$@"\n')
    wrapper.chmod(0o755)
    return wrapper


# -- credentials in upstream.url, offline --------------------------------------------------------------------


@pytest.mark.parametrize(
    "url, public",
    [
        ("https://bot:s3cret@git.example/org/repo.git", "https://git.example/org/repo.git"),
        ("https://ghp_onlytoken@git.example/org/repo.git", "https://git.example/org/repo.git"),
        ("ssh://git:pw@git.example:2222/org/repo.git", "ssh://git.example:2222/org/repo.git"),
        ("file://user:pw@localhost/srv/repo.git", "file://localhost/srv/repo.git"),
        ("HTTPS://u:p@git.example/x", "HTTPS://git.example/x"),
        ("https://git.example/org/repo.git", "https://git.example/org/repo.git"),
        ("https://git.example/path/with@sign", "https://git.example/path/with@sign"),
        ("https://u:p@ss@git.example/x?next=a@b", "https://git.example/x?next=a@b"),
        ("git@git.example:org/repo.git", "git@git.example:org/repo.git"),
        ("/srv/upstream.bundle", "/srv/upstream.bundle"),
    ],
)
def test_public_url_drops_only_the_user_part(url, public):
    from carry.config.reader import public_url, strip_credentials

    assert public_url(url) == public
    assert strip_credentials(f"upstream:\n  url: {url}  # pinned\n") == f"upstream:\n  url: {public}  # pinned\n"


def test_a_given_secret_is_masked_as_written_and_url_quoted():
    from carry.util import redact

    assert redact.secrets("login s@cr:t refused at https://u:s%40cr%3At@host", "s@cr:t", None, "") == (
        "login *** refused at https://u:***@host"
    )
    assert redact.address("https://u:p@host.example/simple/?x=1#f") == "https://host.example/simple/"


@pytest.mark.parametrize(
    "url, bare, user, password",
    [
        ("https://bot:s%40cr%3At@git.example/x.git", "https://git.example/x.git", "bot", "s@cr:t"),
        (f"https://{TOKEN}@git.example/x.git", "https://git.example/x.git", TOKEN, ""),
        ("ssh://git:pw@git.example:2222/x.git", "ssh://git@git.example:2222/x.git", "git", "pw"),
        ("https://git.example/x.git", "https://git.example/x.git", None, None),
    ],
    ids=stable_id,
)
def test_git_gets_credentials_from_a_helper_not_argv(tmp_path, url, bare, user, password):
    """split_credentials' helper, asked by a real `git credential fill`, hands over what the URL held."""
    from carry.source.git import split_credentials

    shown, env = split_credentials(url)
    assert shown == bare
    if user is None:
        assert env == {}
        return
    for secret in (user, password):  # git runs the helper through `sh -c`: its text is on a command line
        assert not secret or secret not in env["GIT_CONFIG_VALUE_0"]
    git(tmp_path, "init", "-q")
    filled = subprocess.run(
        ["git", "credential", "fill"],
        cwd=tmp_path,
        input="protocol=https\nhost=git.example\n\n",
        env={**os.environ, **env, "GIT_TERMINAL_PROMPT": "0"},
        capture_output=True,
        text=True,
    )
    assert filled.returncode == 0, filled.stderr
    assert f"username={user}\n" in filled.stdout and f"password={password}\n" in filled.stdout


@pytest.mark.parametrize(
    "url, command, needles",
    [
        (f"http://bot:{TOKEN}@git.example/x.git", "fetch", ("scheme 'http' is not allowed",)),
        (f"https://bot:{TOKEN}@127.0.0.1:1/x.git", "fetch", ("https://127.0.0.1:1/x.git", "no bundle")),
        (f"https://{TOKEN}@127.0.0.1:1/x.git", "check", ("https://127.0.0.1:1/x.git", "no bundle")),
    ],
    ids=stable_id,
)
def test_errors_name_the_url_without_its_credentials(tmp_path, url, command, needles):
    config = tmp_path / "build.yaml"
    config.write_text(f"upstream:\n  url: '{url}'\n  commit: {'a' * 40}\n")
    (tmp_path / "patches").mkdir()
    result = carry("--config", str(config), command, env={"CARRY_CACHE": str(tmp_path / "cache")})
    assert_bad_input(result, *needles)
    assert TOKEN not in result.out + result.err
    assert find_in_tree(tmp_path / "cache", [TOKEN]) == []


@pytest.fixture(scope="module")
def credentialed(tmp_path_factory):
    """The demo with upstream.url = file://carry-bot:TOKEN@localhost/<a real repo holding the demo history>."""
    base = tmp_path_factory.mktemp("secrets")
    upstream = base / "upstream.git"
    git(base, "clone", "--quiet", "--mirror", str(ROOT / "examples" / "demo" / "upstream.bundle"), str(upstream))
    project = base / "demo"
    shutil.copytree(ROOT / "examples" / "demo", project)
    (project / "upstream.bundle").unlink()
    config = project / "build.yaml"
    url = f"file://carry-bot:{TOKEN}@localhost{upstream}"
    config.write_text(config.read_text().replace("url: upstream.bundle", f"url: {url}"))
    argv_log = base / "argv.log"
    wrappers = base / "bin"
    recorder(wrappers, "git", shutil.which("git"), argv_log)
    env = {"CARRY_CACHE": str(base / "cache"), "PATH": f"{wrappers}:{os.environ['PATH']}"}
    return {"base": base, "config": config, "env": env, "public": f"file://localhost{upstream}", "argv_log": argv_log}


def test_credentialed_upstream_is_fetched_but_never_shown(credentialed):
    config, env = credentialed["config"], credentialed["env"]
    outputs = []
    # On main 0001 has landed, so applying the series there fails (exit 1); an unknown ref is bad input.
    for command, code in (
        (("fetch",), 0),
        (("check", "--json"), 0),
        (("status", "--json"), 0),
        (("check", "--against", "main"), 1),
        (("check", "--against", "no-such-branch"), 2),
    ):
        result = carry("--config", str(config), *command, env=env)
        outputs.append(result.out + result.err)
        assert result.code == code, (command, result.out, result.err)
    assert json.loads(carry("--config", str(config), "check", "--json", env=env).out)["ok"] is True
    assert "unknown ref 'no-such-branch'" in outputs[-1] and credentialed["public"] in outputs[-1]
    assert not [out for out in outputs if TOKEN in out]
    assert find_in_tree(credentialed["base"] / "cache", [TOKEN]) == []
    recorded = credentialed["argv_log"].read_text()
    assert "git fetch --no-tags" in recorded and credentialed["public"] in recorded, "every git call was recorded"
    assert TOKEN not in recorded, "the token was on a git command line"


@pytest.mark.slow
def test_credentialed_upstream_stays_out_of_the_wheel_and_its_buildinfo(credentialed):
    config, env, base = credentialed["config"], credentialed["env"], credentialed["base"]
    dist = base / "dist"
    built = carry("--config", str(config), "wheel", "--arch", ARCHES, "--out", str(dist), env=env)
    assert built.code == 0, built.err
    (wheel,) = dist.glob("*.whl")
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith("carry-buildinfo.json"))
        info = json.loads(archive.read(name))
    assert info["upstream"]["url"] == credentialed["public"]
    verified = carry("--config", str(config), "verify", str(wheel), env=env)
    assert verified.code == 0, verified.out + verified.err
    for text in (built.out, built.err, verified.out, verified.err):
        assert TOKEN not in text
    assert find_in_tree(dist, [TOKEN]) == [] and find_in_tree(base / "cache", [TOKEN]) == []


def test_image_context_carries_no_upstream_credentials(credentialed, tmp_path):
    """The build context (and so the build stage's layers) gets build.yaml with the user part removed."""
    from carry.config import load
    from carry.image.buildkit import container
    from carry.util.cache import Cache

    config = load(credentialed["config"])
    cache = Cache(credentialed["base"] / "cache")
    assert carry("--config", str(config.path), "fetch", env=credentialed["env"]).code == 0
    (mirror,) = [p for p in (cache.root / "mirrors").iterdir() if not p.name.startswith(".")]
    context = tmp_path / "context"
    container.assemble_context(config, cache, mirror, context, ["click"])
    assert find_in_tree(context, [TOKEN]) == []
    copied = (context / "project" / "build.yaml").read_text()
    assert f"url: {credentialed['public']}" in copied
    # the same config but for the URL's user part (and the image settings the build stage does not read)
    original = yaml.safe_load(
        config.path.read_text().replace(
            f"file://carry-bot:{TOKEN}@localhost{credentialed['public'].removeprefix('file://localhost')}",
            credentialed["public"],
        )
    )
    original["image"] = {k: v for k, v in original["image"].items() if k in container.STAGE_IMAGE_KEYS}
    assert yaml.safe_load(copied) == original


# -- the registry password and build secrets while building and pushing -------------------------------------


def _registry_get(env: dockerenv.DockerEnv, path: str, accept: str) -> bytes:
    request = urllib.request.Request(f"http://{env.registry}{path}", headers={"Accept": accept})
    token = base64.b64encode(f"{env.registry_user}:{env.registry_password()}".encode()).decode()
    request.add_header("Authorization", f"Basic {token}")
    with urllib.request.urlopen(request, timeout=30) as answer:
        return answer.read()


@pytest.fixture(scope="module")
def pushed(credentialed, tmp_path_factory):
    env = dockerenv.require()
    base = tmp_path_factory.mktemp("push")
    project = base / "demo"
    shutil.copytree(credentialed["config"].parent, project)
    config = project / "build.yaml"
    name = f"{env.registry}/carry-secrets-{os.urandom(3).hex()}"
    dockerenv.set_image_section(config, env.image_section(name, extra="  secret_env: [CARRY_TEST_BUILD_SECRET]\n"))
    argv_log = base / "argv.log"
    wrappers = base / "bin"
    recorder(wrappers, "git", shutil.which("git"), argv_log)
    wrapper = recorder(wrappers, "docker", dockerenv.DOCKER_CLI, argv_log)
    (base / "docker-config").mkdir()
    (base / "tmp").mkdir()
    keygen = carry("keygen", str(base / "keys"), env={"CARRY_SIGNING_KEY_PASSWORD": KEY_PASSWORD})
    assert keygen.code == 0, keygen.err
    run_env = {
        "CARRY_CACHE": str(base / "cache"),
        "CARRY_DOCKER": str(wrapper),
        "DOCKER_HOST": env.docker_host,
        "DOCKER_CONFIG": str(base / "docker-config"),
        "TMPDIR": str(base / "tmp"),
        "PATH": f"{wrappers}:{os.environ['PATH']}",
        "CARRY_TEST_BUILD_SECRET": BUILD_SECRET,
        "CARRY_REGISTRY_USER": env.registry_user,
        "CARRY_REGISTRY_PASSWORD": env.registry_password(),
        "CARRY_SIGNING_KEY": str(base / "keys" / "carry.key"),
        "CARRY_SIGNING_KEY_PASSWORD": KEY_PASSWORD,
    }
    with command_lines() as seen:
        result = carry(
            "--config", str(config), "image", "--hermetic", "--push", "--arch", ARCHES, env=run_env, cwd=project
        )
    assert result.code == 0, result.out + result.err
    version = (project / "VERSION").read_text().strip()
    yield {
        "env": env,
        "base": base,
        "result": result,
        "argv": seen,
        "argv_log": argv_log,
        "name": name,
        "ref": f"{name}:{version}",
        "version": version,
        "public": credentialed["public"],
    }
    dockerenv.forget(name)


def secrets(pushed) -> list[str]:
    """The registry password, the upstream token, the build secret, the signing key's passphrase and its bytes
    (every base64 line of its PEM: any one of them found anywhere is the key leaking)."""
    pem = (pushed["base"] / "keys" / "carry.key").read_text().splitlines()
    return [pushed["env"].registry_password(), TOKEN, BUILD_SECRET, KEY_PASSWORD, *pem[1:-1]]


@pytest.mark.slow
@pytest.mark.docker
def test_no_secret_on_any_docker_command_line(pushed):
    recorded = pushed["argv_log"].read_text()
    assert "docker login --username" in recorded and "--password-stdin" in recorded, recorded
    assert "docker build " in recorded or "docker buildx build " in recorded, recorded
    assert "git fetch " in recorded, "the fresh cache made carry fetch the credentialed upstream"
    for secret in secrets(pushed):
        assert secret not in recorded
        assert not [argv for argv in pushed["argv"] if secret in argv]
    assert any("--password-stdin" in argv for argv in pushed["argv"]), "the /proc scan saw the login"


@pytest.mark.slow
@pytest.mark.docker
def test_no_secret_in_output_cache_docker_config_or_temp(pushed):
    base = pushed["base"]
    result = pushed["result"]
    for secret in secrets(pushed):
        assert secret not in result.out + result.err
    assert find_in_tree(base / "cache", secrets(pushed)) == []
    assert find_in_tree(base / "docker-config", secrets(pushed)) == []
    assert not (base / "docker-config" / "config.json").exists(), "carry must not log in to the user's config"
    assert list((base / "tmp").iterdir()) == [], "carry's temporary Docker config must be gone"
    logs = list((base / "cache" / "logs").glob("image-*.log"))
    assert logs and all(BUILD_SECRET not in log.read_text() for log in logs)


@pytest.mark.slow
@pytest.mark.docker
def test_no_secret_in_history_labels_filesystem_or_buildinfo(pushed):
    client = dockerenv.docker_client()
    image = client.images.get(pushed["ref"])
    labels = image.labels
    assert labels["io.carry.upstream.url"] == pushed["public"]
    assert labels["org.opencontainers.image.source"] == pushed["public"]
    inspected = json.dumps(image.attrs) + json.dumps(image.history())
    container = client.containers.create(image.id, command=["true"])
    try:
        exported = b"".join(container.export(chunk_size=1 << 20))
    finally:
        container.remove(force=True)
    assert b"carry-buildinfo.json" in exported
    marker = b'"url": "' + pushed["public"].encode() + b'"'
    assert marker in exported, "the image's buildinfo names the upstream without credentials"
    for secret in secrets(pushed):
        assert secret not in inspected
        assert secret.encode() not in exported


@pytest.mark.slow
@pytest.mark.docker
def test_the_push_was_signed_and_no_secret_is_in_the_attachments(pushed):
    """`image --push` with $CARRY_SIGNING_KEY (encrypted) signed the pushed manifest: its `.sig` and `.att` hold the
    signature and the provenance, and neither the key nor its passphrase."""
    from carry.trust import attach

    env, result = pushed["env"], pushed["result"]
    assert "signature " in result.out and ".sig  sha256:" in result.out, result.out
    # --hermetic: every installed wheel is one carry holds (the fixed wheel, the wheelhouse, the base's bundled
    # pip and setuptools), so the push has an SBOM too
    assert "components, CycloneDX 1.6, schema-valid" in result.out, result.out
    repository = pushed["name"].split("/", 1)[1]
    manifest = _registry_get(
        env, f"/v2/{repository}/manifests/{pushed['version']}", "application/vnd.docker.distribution.manifest.v2+json"
    )
    import hashlib

    digest = "sha256:" + hashlib.sha256(manifest).hexdigest()
    held = b""
    for tag in (attach.sig_tag(digest), attach.att_tag(digest)):
        found = _registry_get(env, f"/v2/{repository}/manifests/{tag}", attach.OCI_MANIFEST)
        held += found
        for layer in json.loads(found)["layers"]:
            held += _registry_get(env, f"/v2/{repository}/blobs/{layer['digest']}", "*/*")
    assert b"cosign container image signature" in held and b"application/vnd.in-toto+json" in held
    sboms = list((pushed["base"] / "demo" / "dist").glob("pledemo-*-linux-amd64.cdx.json"))
    assert sboms, "the SBOM is written beside the wheels"
    names = {c["name"].lower() for c in json.loads(sboms[0].read_text())["components"]}
    assert {"pledemo", "pip"} <= names, names
    # verify --key on the Dockerfile-built image: signature, SBOM against its dist-info, provenance against the repo
    login = {"CARRY_REGISTRY_USER": env.registry_user, "CARRY_REGISTRY_PASSWORD": env.registry_password()}
    config = pushed["base"] / "demo" / "build.yaml"
    verified = carry(
        "--config", str(config), "verify", pushed["ref"], "--key", str(pushed["base"] / "keys" / "carry.pub"), env=login
    )
    assert verified.code == 0, verified.out + verified.err
    assert "verifies with the key" in verified.out and "SBOM: signed, CycloneDX 1.6" in verified.out
    assert "equal to this repository's commit, series" in verified.out
    for secret in secrets(pushed):
        assert secret.encode() not in held


@pytest.mark.slow
@pytest.mark.docker
def test_no_secret_in_what_the_registry_holds(pushed):
    env = pushed["env"]
    repository = pushed["name"].split("/", 1)[1]
    manifest = _registry_get(
        env, f"/v2/{repository}/manifests/{pushed['version']}", "application/vnd.docker.distribution.manifest.v2+json"
    )
    config_digest = json.loads(manifest)["config"]["digest"]
    config_blob = _registry_get(env, f"/v2/{repository}/blobs/{config_digest}", "*/*")
    assert pushed["public"].encode() in config_blob
    for secret in secrets(pushed):
        assert secret.encode() not in manifest and secret.encode() not in config_blob


COSIGN_PASSWORD = "cosign-password-" + os.urandom(8).hex()


@pytest.mark.slow
@pytest.mark.docker
def test_no_secret_when_cosign_signs_and_attests_the_push(pushed):
    """The real cosign (tests/cosign_tool.py) makes its own key, signs the pushed manifest and attests its SBOM with
    the passphrase in COSIGN_PASSWORD: neither the passphrase nor the key is on any command line, in cosign's
    output, its private HOME and Docker config, or what the registry then holds; and carry verifies cosign's
    signature."""
    import hashlib

    import cosign_tool
    from carry.trust import attach

    env = pushed["env"]
    repository = pushed["name"].split("/", 1)[1]
    manifest = _registry_get(
        env, f"/v2/{repository}/manifests/{pushed['version']}", "application/vnd.docker.distribution.manifest.v2+json"
    )
    digest = "sha256:" + hashlib.sha256(manifest).hexdigest()
    ref = f"{pushed['name']}@{digest}"
    (sbom,) = (pushed["base"] / "demo" / "dist").glob("pledemo-*-linux-amd64.cdx.json")
    with cosign_tool.logged_in(env) as cosign, command_lines() as seen:
        key, public = cosign.generate_key_pair(pushed["base"] / "cosign", COSIGN_PASSWORD)
        for ran in (
            cosign.sign(key, ref, COSIGN_PASSWORD),
            cosign.attest(key, ref, "cyclonedx", sbom, COSIGN_PASSWORD),
            cosign.verify(public, ref),
        ):
            assert ran.code == 0, ran.text()
        leaks = [*secrets(pushed), COSIGN_PASSWORD, *key.read_text().splitlines()[1:-1]]
        assert find_in_tree(cosign.home, leaks) == [] and find_in_tree(cosign.docker_config, leaks) == []
    assert any("cosign sign --key" in line for line in seen), "the /proc scan saw cosign sign"
    for secret in leaks:
        assert not [line for line in seen if secret in line]
        assert not [ran for ran in cosign.runs if secret in ran.text()]
    held = b""
    for tag in (attach.sig_tag(digest), attach.att_tag(digest)):
        found = _registry_get(env, f"/v2/{repository}/manifests/{tag}", attach.OCI_MANIFEST)
        held += found + b"".join(
            _registry_get(env, f"/v2/{repository}/blobs/{layer['digest']}", "*/*")
            for layer in json.loads(found)["layers"]
        )
    assert held.count(b"cosign container image signature") == 2, "carry's signature and cosign's"
    for secret in leaks:
        assert secret.encode() not in held
    login = {"CARRY_REGISTRY_USER": env.registry_user, "CARRY_REGISTRY_PASSWORD": env.registry_password()}
    verified = carry("verify", ref, "--key", str(public), cwd=pushed["base"], env=login)
    assert "verifies with the key" in verified.out, verified.out + verified.err
