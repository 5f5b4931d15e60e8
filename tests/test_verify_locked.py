"""`verify IMAGE` on locked images: the image's files read from its layers on this machine (the registry with
auth, or the local engine's `docker save`), proven against a hashed lock and the fixed wheel; each tampering
after the build (a package added, one removed, a file changed in a later layer, a version changed, the fixed
wheel's files or its console script touched) is named.

The images are real: a BuildKit build (--network=none) FROM the test runtime base that makes /opt/venv and
installs real wheels downloaded on the host (locked with `uv pip compile --generate-hashes`), plus a small fixed
wheel holding a compiled shared object. They are pushed to the test registry; the test removes its images, its
manifests and its repository's blob links afterwards."""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import hashlib
import io
import json
import os
import secrets
import shutil
import subprocess
import sys
import tarfile
import urllib.error
import urllib.request
import zipfile
from pathlib import Path

import pytest

import dockerenv
from carry.image import registry
from carry.image.inspect import imagefs, imageverify, installcheck
from carry.image.locked import runtimelock
from carry.platforms import Platform
from carry.util import index
from carry.wheelbuild.verify import Expected
from helpers import Upstream, carry, write_config

VERSION = "20261201.1"
WHEEL_NAME = "pledemo"
WHEEL_VERSION = f"0.1.0+carry.{VERSION}"
REQUIREMENTS = "markdown-it-py==3.0.0\nsix==1.16.0\n"
EXTRA = ("idna==3.7", "mdurl==0.1.1")
REWRITE_RECORD = """\
import base64, hashlib, pathlib, sys
site, name, dist_info = pathlib.Path(sys.argv[1]), sys.argv[2], sys.argv[3]
changed = site / name
changed.write_bytes(changed.read_bytes() + b"# changed with its RECORD row\\n")
data = changed.read_bytes()
row = f"{name},sha256={base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()},{len(data)}\\n"
record = site / dist_info / "RECORD"
record.write_text("".join(row if line.startswith(name + ",") else line
                          for line in record.read_text().splitlines(True)))
"""  # a package the lock does not have; another version of a locked one
SITE = "/opt/venv/lib/python3.11/site-packages"
PIP = "/usr/share/python-wheels/pip-23.0.1-py3-none-any.whl/pip"
PIP_INSTALL = f"/opt/venv/bin/python {PIP} install --no-index --no-deps --no-compile --disable-pip-version-check"


def run(*argv: str, cwd: Path | None = None, env: dict | None = None, timeout: float = 600) -> str:
    result = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"{' '.join(argv[:3])} failed: {result.stdout[-2000:]}{result.stderr[-2000:]}"
    return result.stdout


def record_row(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def make_fixed_wheel(
    directory: Path, expected: Expected, shared: bytes | None = None, platform: Platform = Platform.LINUX_AMD64
) -> Path:
    """A small carry-like wheel: a package with a compiled shared object (gcc's, or `shared`), a console script,
    Requires-Dist on the lock's roots and carry's buildinfo."""
    build = directory.parent / f"so-{platform.machine}"
    build.mkdir()
    if shared is None:
        (build / "native.c").write_text("int pledemo_answer(void) { return 42; }\n")
        run("gcc", "-shared", "-fPIC", "-O2", "-o", str(build / "_native.so"), str(build / "native.c"))
    else:
        (build / "_native.so").write_bytes(shared)
    info = f"{WHEEL_NAME}-{WHEEL_VERSION}.dist-info"
    buildinfo = {
        "version": VERSION,
        "series": {"hash": expected.series_hash, "patches": []},
        "upstream": {"commit": expected.commit},
        "cuda_arches": "none",
        "wheel_version": WHEEL_VERSION,
        "platform": str(platform),
    }
    members = {
        f"{WHEEL_NAME}/__init__.py": b"def main():\n    print('pledemo')\n",
        f"{WHEEL_NAME}/render.py": b"import markdown_it\nimport six\n",
        f"{WHEEL_NAME}/_native.so": (build / "_native.so").read_bytes(),
        f"{info}/METADATA": (
            f"Metadata-Version: 2.1\nName: {WHEEL_NAME}\nVersion: {WHEEL_VERSION}\n"
            "Requires-Dist: markdown-it-py\nRequires-Dist: six\n"
        ).encode(),
        f"{info}/WHEEL": (
            "Wheel-Version: 1.0\nGenerator: carry-test\nRoot-Is-Purelib: false\n"
            f"Tag: cp311-cp311-linux_{platform.machine}\n"
        ).encode(),
        f"{info}/entry_points.txt": f"[console_scripts]\n{WHEEL_NAME} = {WHEEL_NAME}:main\n".encode(),
        f"{info}/carry-buildinfo.json": json.dumps(buildinfo, indent=2).encode(),
    }
    rows = [record_row(name, data) for name, data in members.items()] + [f"{info}/RECORD,,"]
    dist = directory / "dist"
    dist.mkdir(parents=True, exist_ok=True)
    wheel = dist / f"{WHEEL_NAME}-{WHEEL_VERSION}-cp311-cp311-linux_{platform.machine}.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in members.items():
            archive.writestr(name, data)
        archive.writestr(f"{info}/RECORD", "\n".join(rows) + "\n")
    return wheel


class Images:
    """The images this module builds and pushes, removed at the end (engine images, registry manifests and the
    repository's blob links)."""

    def __init__(self, env: dockerenv.DockerEnv, repository: str, context: Path, cli_env: dict):
        self.env, self.repository, self.context, self.cli_env = env, repository, context, cli_env
        self.local: list[str] = []
        self.pushed: list[str] = []
        self.lists: list[str] = []

    def ref(self, tag: str) -> str:
        return f"{self.env.registry}/{self.repository}:{tag}"

    def build(self, tag: str, dockerfile: str, push: bool = True, platform: str = "linux/amd64") -> str:
        ref = self.ref(tag)
        (self.context / f"{tag}.Dockerfile").write_text(dockerfile)
        run(
            dockerenv.DOCKER_CLI,
            "build",
            "--network=none",
            "--platform",
            platform,
            "-f",
            str(self.context / f"{tag}.Dockerfile"),
            "-t",
            ref,
            str(self.context),
            env=self.cli_env,
        )
        self.local.append(ref)
        if push:
            run(dockerenv.DOCKER_CLI, "push", ref, env=self.cli_env)
            self.pushed.append(tag)
        return ref

    def registry_call(self, method: str, path: str, accept: str = "") -> tuple[int, bytes, dict]:
        request = urllib.request.Request(f"http://{self.env.registry}/v2/{self.repository}/{path}", method=method)
        credentials = f"{self.env.registry_user}:{self.env.registry_password()}".encode()
        request.add_unredirected_header("Authorization", "Basic " + base64.b64encode(credentials).decode())
        if accept:
            request.add_header("Accept", accept)
        try:
            with urllib.request.urlopen(request, timeout=60) as answer:
                return answer.status, answer.read(), dict(answer.headers)
        except urllib.error.HTTPError as answer:
            return answer.code, b"", {}

    def remove(self) -> None:
        client = dockerenv.docker_client()
        blobs: set[str] = set()
        for tag in self.lists:
            status, _, headers = self.registry_call("GET", f"manifests/{tag}", imagefs.INDEX_TYPES[1])
            if status == 200:
                self.registry_call("DELETE", f"manifests/{headers.get('Docker-Content-Digest')}")
        for tag in self.pushed:
            status, body, headers = self.registry_call("GET", f"manifests/{tag}", ", ".join(imagefs.MANIFEST_TYPES))
            if status != 200:
                continue
            manifest = json.loads(body)
            blobs |= {manifest["config"]["digest"], *(layer["digest"] for layer in manifest["layers"])}
            self.registry_call("DELETE", f"manifests/{headers.get('Docker-Content-Digest')}")
        for blob in blobs:
            self.registry_call("DELETE", f"blobs/{blob}")
        for ref in reversed(self.local):
            try:
                client.images.remove(ref, force=True)
            except Exception:  # noqa: BLE001 - already gone
                pass
        self._drop_storage()

    def _drop_storage(self) -> None:
        """The repository's directory and the blobs no other repository links, from the registry's storage (the
        registry has no API to collect them; the data directory is the password file's sibling, as services.sh
        lays it out)."""
        root = self.env.password_file.parent / "data" / "docker" / "registry" / "v2"
        repositories, mine = root / "repositories", root / "repositories" / self.repository
        if not mine.is_dir():
            return
        linked = {p.name for p in (mine / "_layers" / "sha256").glob("*")}
        shutil.rmtree(mine, ignore_errors=True)
        others = {p.name for p in repositories.glob("**/_layers/sha256/*")}
        for digest in linked - others:
            shutil.rmtree(root / "blobs" / "sha256" / digest[:2] / digest, ignore_errors=True)

    def manifest_list(self, tag: str, *sources: str) -> str:
        ref = self.ref(tag)
        run(dockerenv.DOCKER_CLI, "manifest", "create", "--insecure", ref, *map(self.ref, sources), env=self.cli_env)
        run(dockerenv.DOCKER_CLI, "manifest", "push", "--purge", "--insecure", ref, env=self.cli_env)
        self.lists.append(tag)
        return ref


def lock_for(work: Path, project: Path, env: dockerenv.DockerEnv, platform: Platform = Platform.LINUX_AMD64) -> Path:
    """The runtime lock of `platform` as `lock` writes it: uv's hashed compile under carry's header."""
    (work / "requirements.in").write_text(REQUIREMENTS)
    body = run(
        sys.executable,
        "-m",
        "uv",
        "pip",
        "compile",
        "--generate-hashes",
        "--only-binary",
        ":all:",
        "--no-header",
        "--no-annotate",
        "--python-platform",
        f"{platform.machine}-manylinux_2_36",
        "--python-version",
        "3.11",
        str(work / "requirements.in"),  # to stdout (uv's `-o -` writes a file named `-` in the cwd)
    )
    base = env.bases(str(platform))[1]
    facts = runtimelock.BaseFacts("3.11.2", "2.36", dockerenv.docker_client().images.get(base).id, base)
    path = project / "runtime-lock" / f"{platform.os}-{platform.tag}.txt"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        runtimelock.render(
            platform, facts, runtimelock.requires_digest(REQUIREMENTS.split()), f"{WHEEL_NAME}=={WHEEL_VERSION}", body
        )
    )
    return path


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    env = dockerenv.require()
    if shutil.which("gcc") is None:
        pytest.fail("gcc is needed to build the fixed wheel's shared object")
    work = tmp_path_factory.mktemp("verify-locked")
    upstream = Upstream.create(work / "upstream", {"README.md": "an upstream\n"})
    project = work / "project"
    repository = f"carry-test/issue-24-verify-{secrets.token_hex(4)}"
    write_config(
        project,
        str(upstream.path),
        upstream.head(),
        extra=(
            f"image:\n  name: {env.registry}/{repository}\n  lock: runtime-lock\n  platforms:\n    linux/amd64:\n"
            f"      runtime_image: {env.runtime_base}\n"
        ),
    )
    (project / "VERSION").write_text(VERSION + "\n")
    checked = carry("check", "--json", cwd=project)
    assert checked.code == 0, checked.err
    expected = Expected(VERSION, json.loads(checked.out)["series_hash"], upstream.head())
    lock = runtimelock.parse(lock_for(work, project, env).read_text(), Path("linux-amd64.txt"), Platform.LINUX_AMD64)
    context = work / "context"
    wheels = context / "wheels"
    wheels.mkdir(parents=True)
    shutil.copy(project / "runtime-lock" / "linux-amd64.txt", wheels / "lock.txt")
    download = (
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary",
        ":all:",
        "--python-version",
        "3.11",
        "--platform",
        "manylinux_2_36_x86_64",
        "-d",
        str(wheels),
    )
    run(*download, "-r", str(wheels / "lock.txt"))
    run(*download, *EXTRA)
    fixed = make_fixed_wheel(project, expected)
    store = work / "downloads"  # the download store as carry keeps it: <sha256>/<file name>
    for wheel in wheels.glob("*.whl"):
        (store / hashlib.sha256(wheel.read_bytes()).hexdigest()).mkdir(parents=True)
        shutil.copy(wheel, store / hashlib.sha256(wheel.read_bytes()).hexdigest() / wheel.name)
    shutil.copy(fixed, wheels / fixed.name)
    (context / "rerecord.py").write_text(REWRITE_RECORD)
    with dockerenv.logged_in(env) as cli_env:
        images = Images(env, repository, context, cli_env)
        try:
            good = images.build(
                "good",
                f"""\
FROM {env.runtime_base}
RUN --mount=type=bind,source=wheels,target=/wheels python3 -m venv --without-pip /opt/venv \\
 && rm /opt/venv/bin/activate* /opt/venv/bin/Activate.ps1 \\
 && {PIP_INSTALL} --require-hashes --find-links /wheels -r /wheels/lock.txt \\
 && {PIP_INSTALL} /wheels/{fixed.name}
LABEL io.carry.version={VERSION} io.carry.series.hash={expected.series_hash} \\
      io.carry.upstream.commit={expected.commit} io.carry.wheel={WHEEL_NAME} \\
      io.carry.wheel.sha256={hashlib.sha256(fixed.read_bytes()).hexdigest()}
""",
            )
            yield {
                "env": env,
                "images": images,
                "good": good,
                "fixed": installcheck.FixedWheel.read(fixed),
                "store": store,
                "upstream": upstream.path,
                "context": context,
                "locked": tuple((p.name, p.version) for p in lock.packages),
                "lock": lock,
                "project": project,
                "expected": expected,
            }
        finally:
            images.remove()


@contextlib.contextmanager
def downloads_at(store: Path):
    """$CARRY_DOWNLOADS pointed at the test's download store for the duration."""
    before = os.environ.get("CARRY_DOWNLOADS")
    os.environ["CARRY_DOWNLOADS"] = str(store)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("CARRY_DOWNLOADS")
        else:
            os.environ["CARRY_DOWNLOADS"] = before


def auth(env: dockerenv.DockerEnv) -> dict:
    return {"username": env.registry_user, "password": env.registry_password()}


def verify(setup, ref: str, from_registry: bool = True):
    client = dockerenv.docker_client()
    login = registry.Login(setup["env"].registry, auth(setup["env"]), None)
    with downloads_at(setup["store"]):
        files, content = imageverify.read_and_check(
            client,
            login,
            ref,
            Platform.LINUX_AMD64,
            setup["locked"],
            setup["fixed"],
            from_registry=from_registry,
            wheels=imageverify.stored_wheels(setup["lock"].packages),
        )
    return files, imageverify.judge(ref, files, content, setup["fixed"], setup["expected"], None, [])


def tampered(setup, tag: str, steps: str, push: bool = True) -> str:
    return setup["images"].build(tag, f"FROM {setup['good']}\n{steps}\n", push=push)


def test_the_lock_is_real_and_hashed(setup):
    names = dict(setup["locked"])
    assert names.keys() >= {"markdown-it-py", "mdurl", "six"}
    assert all(p.hashes and p.hashes[0].startswith("sha256:") for p in setup["lock"].packages)


def test_a_good_image_is_proven_from_the_registry(setup):
    files, result = verify(setup, setup["good"])
    text = "\n".join(result.lines())
    assert result.ok, text
    assert files.source == "registry" and len(files.layers) >= 2
    assert all(layer.compressed > 0 for layer in files.layers)
    assert f"{len(setup['locked']) + 1} distribution(s)" in text
    assert "arch gate passed" in text and "cpu: 1/1 shared object(s) are x86_64 code" in text
    assert f"io.carry.wheel.sha256 = {setup['fixed'].path.name}'s" in text
    assert f"{SITE}/{WHEEL_NAME}/_native.so" in files.nodes
    assert files.nodes["/opt/venv/bin/pledemo"].data.startswith(b"#!/opt/venv/bin/python\n")


def test_the_local_engine_gives_the_same_view(setup):
    remote, _ = verify(setup, setup["good"])
    files, result = verify(setup, setup["good"], from_registry=False)
    assert result.ok, "\n".join(result.lines())
    assert files.source == "local engine"
    assert {p: (n.kind, n.sha256, n.size, n.target) for p, n in files.nodes.items()} == {
        p: (n.kind, n.sha256, n.size, n.target) for p, n in remote.nodes.items()
    }


def problems(result) -> str:
    assert not result.ok
    return "\n".join(result.checks.problems)


def test_a_file_changed_with_its_record_row_is_caught_by_the_locked_wheel(setup):
    ref = tampered(
        setup,
        "rerecord",
        f"RUN --mount=type=bind,source=rerecord.py,target=/rerecord.py python3 "
        f"/rerecord.py {SITE} six.py six-1.16.0.dist-info",
    )
    text = problems(verify(setup, ref)[1])
    assert "six 1.16.0: six.py changed" not in text  # the image's own RECORD agrees with the file ...
    assert "six 1.16.0: six.py is " in text  # ... but not with the wheel's
    assert "six-1.16.0-py2.py3-none-any.whl's RECORD says" in text


def test_a_package_added_later_is_named(setup):
    ref = tampered(
        setup,
        "added",
        f"RUN --mount=type=bind,source=wheels,target=/wheels {PIP_INSTALL} /wheels/idna-3.7-py3-none-any.whl",
    )
    text = problems(verify(setup, ref)[1])
    assert "idna 3.7 is installed (idna-3.7.dist-info) but is not in the lock" in text


def test_a_package_removed_later_is_named(setup):
    ref = tampered(setup, "removed", f"RUN rm -rf {SITE}/six.py {SITE}/six-1.16.0.dist-info")
    text = problems(verify(setup, ref)[1])
    assert "six==1.16.0 is in the lock but not installed" in text
    print(text)


def test_a_file_changed_in_a_later_layer_is_named(setup):
    ref = tampered(setup, "changed", f"RUN echo '# changed' >> {SITE}/markdown_it/__init__.py")
    files, result = verify(setup, ref)
    text = problems(result)
    assert "markdown-it-py 3.0.0: markdown_it/__init__.py changed" in text
    assert f"(layer {len(files.layers)})" in text


def test_a_version_changed_later_is_named(setup):
    ref = tampered(
        setup,
        "version",
        f"RUN --mount=type=bind,source=wheels,target=/wheels {PIP_INSTALL} /wheels/mdurl-0.1.1-py3-none-any.whl",
    )
    text = problems(verify(setup, ref)[1])
    wanted = dict(setup["locked"])["mdurl"]
    assert f"mdurl 0.1.1 is installed (mdurl-0.1.1.dist-info); the lock pins {wanted}" in text


def test_a_file_added_under_the_fixed_package_is_named(setup):
    ref = tampered(setup, "extra", f"RUN echo 'x = 1' > {SITE}/{WHEEL_NAME}/extra.py", push=False)
    files, result = verify(setup, ref)  # not pushed: read from the local engine
    text = problems(result)
    assert files.source == "local engine"
    assert f"{WHEEL_NAME}/extra.py (file, layer {len(files.layers)}) belongs to no installed distribution" in text
    assert (
        f"{WHEEL_NAME} {WHEEL_VERSION}: {WHEEL_NAME}/extra.py (file, layer {len(files.layers)}) is under "
        f"{WHEEL_NAME} but not in the fixed wheel" in text
    )


def test_a_console_script_on_another_interpreter_is_named(setup):
    ref = tampered(setup, "shebang", "RUN sed -i '1s:.*:#!/usr/bin/python3:' /opt/venv/bin/pledemo")
    text = problems(verify(setup, ref)[1])
    assert (
        f"{WHEEL_NAME} {WHEEL_VERSION}: /opt/venv/bin/pledemo runs /usr/bin/python3, not /opt/venv/bin/python" in text
    )
    assert f"{WHEEL_NAME} {WHEEL_VERSION}: /opt/venv/bin/pledemo changed" in text
    print(text)


def test_a_shared_object_replaced_is_named_and_gated_from_the_layer(setup):
    ref = tampered(setup, "so", f"RUN cp /usr/bin/true {SITE}/{WHEEL_NAME}/_native.so")
    files, result = verify(setup, ref)
    text = problems(result)
    assert f"{WHEEL_NAME}/_native.so changed" in text
    assert files.nodes[f"{SITE}/{WHEEL_NAME}/_native.so"].shared is not None  # parsed from the layer's bytes


def test_a_wrong_wheel_sha256_label_is_a_mismatch(setup):
    ref = tampered(setup, "label", "LABEL io.carry.wheel.sha256=" + "0" * 64, push=False)
    result = verify(setup, ref)[1]
    assert not result.ok
    assert any(m.field == "label io.carry.wheel.sha256" for m in result.mismatches)


def aarch64_library(image: str, path: str = "/usr/lib/aarch64-linux-gnu/libz.so.1") -> bytes:
    """A shared object's bytes from the arm64 base image's files (links followed), nothing run."""
    client = dockerenv.docker_client()
    container = client.containers.create(image, command=["true"])
    try:
        for _ in range(8):
            stream, _ = container.get_archive(path)
            with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as archive:
                member = archive.next()
                if not member.issym():
                    return archive.extractfile(member).read()
                path = str(Path(path).parent / member.linkname)
    finally:
        container.remove(force=True)
    raise AssertionError(f"{path}: too many links")


@pytest.fixture(scope="module")
def both(setup):
    """A tag holding linux/amd64 and linux/arm64 (the arm64 image's install ran emulated; its verification does
    not), and a config of both platforms with a lock each and both fixed wheels in its dist/."""
    env, images, expected = setup["env"], setup["images"], setup["expected"]
    project = setup["project"].parent / "both"
    write_config(
        project,
        str(setup["upstream"]),
        expected.commit,
        extra=(
            f"image:\n  name: {env.registry}/{images.repository}\n  lock: runtime-lock\n  platforms:\n"
            f"    linux/amd64: {{runtime_image: {env.runtime_base}}}\n"
            f"    linux/arm64: {{runtime_image: {env.runtime_base_arm64}}}\n"
        ),
    )
    (project / "VERSION").write_text(VERSION + "\n")
    (project / "runtime-lock").mkdir()
    shutil.copy(setup["project"] / "runtime-lock" / "linux-amd64.txt", project / "runtime-lock")
    arm_lock = lock_for(project.parent, project, env, Platform.LINUX_ARM64)
    (project / "dist").mkdir()
    shutil.copy(setup["fixed"].path, project / "dist")
    wheel = make_fixed_wheel(project, expected, aarch64_library(env.runtime_base_arm64), Platform.LINUX_ARM64)
    wheels = setup["context"] / "wheels"
    shutil.copy(wheel, wheels / wheel.name)
    shutil.copy(arm_lock, wheels / "lock-arm64.txt")
    images.build(
        "good-arm64",
        f"""\
FROM {env.runtime_base_arm64}
RUN --mount=type=bind,source=wheels,target=/wheels python3 -m venv --without-pip /opt/venv \\
 && rm /opt/venv/bin/activate* /opt/venv/bin/Activate.ps1 \\
 && {PIP_INSTALL} --require-hashes --find-links /wheels -r /wheels/lock-arm64.txt \\
 && {PIP_INSTALL} /wheels/{wheel.name}
LABEL io.carry.version={VERSION} io.carry.series.hash={expected.series_hash} \\
      io.carry.upstream.commit={expected.commit} io.carry.wheel={WHEEL_NAME} \\
      io.carry.wheel.sha256={hashlib.sha256(wheel.read_bytes()).hexdigest()}
""",
        platform="linux/arm64",
    )
    return images.manifest_list("both", "good", "good-arm64"), project


def test_every_platform_of_a_shared_tag_is_verified_natively(setup, both):
    ref, project = both
    login = {
        "CARRY_REGISTRY_USER": setup["env"].registry_user,
        "CARRY_REGISTRY_PASSWORD": setup["env"].registry_password(),
        "CARRY_DOWNLOADS": str(setup["store"]),
    }
    result = carry("verify", ref, cwd=project, env=login)
    assert result.code == 0, result.out + result.err
    seconds = {}
    for platform in ("linux/amd64", "linux/arm64"):
        line = next(line for line in result.out.splitlines() if f"platform {platform}: read natively" in line)
        seconds[platform] = float(line.rsplit(" in ", 1)[1].split()[0])
    assert "cpu: 1/1 shared object(s) are aarch64 code (linux/arm64)" in result.out
    assert "cpu: 1/1 shared object(s) are x86_64 code (linux/amd64)" in result.out
    assert result.out.count("\n  verified") == 2, result.out
    print(f"\nverify both platforms of {ref}: {seconds}")


def test_the_wrong_fixed_wheel_for_a_platform_is_named(setup, both):
    ref, project = both
    other = project.parent / "swapped"
    shutil.copytree(project, other)
    arm = next((other / "dist").glob("*aarch64.whl"))
    # a fixed wheel of the same name and version whose shared object is x86_64 code: not the one installed
    swapped = make_fixed_wheel(
        other / "elsewhere",
        setup["expected"],
        (setup["fixed"].path.parent.parent.parent / "so-x86_64" / "_native.so").read_bytes(),
        Platform.LINUX_ARM64,
    )
    shutil.copy(swapped, arm)
    login = {
        "CARRY_REGISTRY_USER": setup["env"].registry_user,
        "CARRY_REGISTRY_PASSWORD": setup["env"].registry_password(),
        "CARRY_DOWNLOADS": str(setup["store"]),
    }
    result = carry("verify", ref, "--platform", "linux/arm64", cwd=other, env=login)
    assert result.code == 1, result.out + result.err
    assert f"{WHEEL_NAME}/_native.so is" in result.out and "the fixed wheel's RECORD says" in result.out
    assert "label io.carry.wheel.sha256" in result.out


def cli_verify(setup, ref: str, *args: str):
    login = {
        "CARRY_REGISTRY_USER": setup["env"].registry_user,
        "CARRY_REGISTRY_PASSWORD": setup["env"].registry_password(),
        "CARRY_DOWNLOADS": str(setup["store"]),
    }
    return carry("verify", ref, *args, cwd=setup["project"], env=login)


def test_verify_image_proves_a_locked_image_on_the_command_line(setup):
    result = cli_verify(setup, setup["good"])
    assert result.code == 0, result.out + result.err
    assert "platform linux/amd64: read natively from registry" in result.out
    assert (
        f"{len(setup['locked']) + 1} distribution(s) = the lock's {len(setup['locked'])} + the fixed wheel"
        in result.out
    )
    assert f"locked wheels: {len(setup['locked'])} of {len(setup['locked'])} installed RECORDs equal" in result.out
    assert result.out.strip().endswith("verified")


def test_verify_image_names_every_problem_and_exits_1(setup):
    ref = tampered(
        setup,
        "cli-bad",
        f"RUN --mount=type=bind,source=wheels,target=/wheels {PIP_INSTALL} "
        f"/wheels/idna-3.7-py3-none-any.whl && echo '#' >> {SITE}/six.py",
    )
    result = cli_verify(setup, ref)
    assert result.code == 1, result.out + result.err
    assert "FAIL idna 3.7 is installed (idna-3.7.dist-info) but is not in the lock" in result.out
    assert "FAIL six 1.16.0: six.py changed" in result.out
    assert "NOT verified" in result.out and "Traceback" not in result.err


def test_verify_image_for_a_platform_the_tag_does_not_hold_fails_naming_it(setup):
    result = cli_verify(setup, setup["good"], "--platform", "linux/arm64")
    assert result.code == 1
    assert "holds linux/amd64, not linux/arm64" in result.err


def test_whiteouts_hide_lower_paths():
    def scan(nodes=(), whiteouts=(), opaque=()):
        layer = imagefs.LayerScan("sha256:x")
        layer.nodes = {path: imagefs.Node(path, kind, 0o644) for path, kind in nodes}
        layer.whiteouts, layer.opaque = set(whiteouts), set(opaque)
        return layer

    view = imagefs.apply(
        [
            scan(
                [
                    ("/opt/venv/a", "dir"),
                    ("/opt/venv/a/x", "file"),
                    ("/opt/venv/b", "dir"),
                    ("/opt/venv/b/y", "file"),
                    ("/opt/venv/c", "dir"),
                    ("/opt/venv/c/z", "file"),
                    ("/opt/venv/d", "file"),
                ]
            ),
            scan(
                [("/opt/venv/b/new", "file"), ("/opt/venv/c", "file")],
                whiteouts=["/opt/venv/a", "/opt/venv/d"],
                opaque=["/opt/venv/b"],
            ),
        ]
    )
    assert sorted(view) == ["/opt/venv/b", "/opt/venv/b/new", "/opt/venv/c"]
    assert view["/opt/venv/c"].kind == "file"


@pytest.mark.parametrize("form", [tarfile.PAX_FORMAT, tarfile.GNU_FORMAT, tarfile.USTAR_FORMAT])
def test_a_layer_tar_is_read_as_tarfile_writes_it(tmp_path, form):
    long_dir = "opt/venv/lib/python3.11/site-packages/" + "deep/" * 12
    data = {
        f"{long_dir}m.py" if form != tarfile.USTAR_FORMAT else "opt/venv/a/m.py": b"x = 1\n" * 300,
        "opt/venv/bin/tool": b"#!/opt/venv/bin/python\nprint(1)\n",
        "usr/lib/skipped": b"\0" * 5000,
    }
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=form) as archive:
        for name, body in data.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(body), 0o755
            archive.addfile(info, io.BytesIO(body))
        for name, kind, target in (
            ("opt/venv/bin/python", tarfile.SYMTYPE, "/usr/bin/python3"),
            ("opt/venv/bin/same", tarfile.LNKTYPE, "opt/venv/bin/tool"),
            ("opt/venv/gone/.wh.old", tarfile.REGTYPE, ""),
            ("opt/venv/dark/.wh..wh..opq", tarfile.REGTYPE, ""),
        ):
            info = tarfile.TarInfo(name)
            info.type, info.linkname = kind, target
            archive.addfile(info)
    buffer.seek(0)
    selection = imagefs.Selection(prefixes=("/opt/venv/",), head=lambda path: "/bin/" in path)
    scan = imagefs.scan_layer(io.BufferedReader(buffer), "sha256:test", selection, 0)
    assert scan.entries == 7 and scan.bytes == sum(map(len, data.values()))
    for name, body in data.items():
        node = scan.nodes.get("/" + name)
        if name.startswith("usr/"):
            assert node is None
            continue
        assert (node.kind, node.size, node.sha256) == ("file", len(body), hashlib.sha256(body).hexdigest())
    assert scan.nodes["/opt/venv/bin/tool"].data.startswith(b"#!/opt/venv/bin/python")
    assert scan.nodes["/opt/venv/bin/same"].sha256 == scan.nodes["/opt/venv/bin/tool"].sha256
    assert scan.nodes["/opt/venv/bin/python"].target == "/usr/bin/python3"
    assert scan.whiteouts == {"/opt/venv/gone/old"} and scan.opaque == {"/opt/venv/dark"}


def test_a_wheels_data_files_and_own_pyc_are_installed_where_pip_puts_them():
    row = installcheck.Row
    wheel = (
        row("z3/__init__.py", "sha256=a", 1),
        row("z3-1.data/data/bin/z3", "sha256=b", 2),
        row("z3-1.data/scripts/z3-tool", "sha256=c", 3),
        row("z3/__pycache__/x.cpython-311.pyc", "sha256=d", 4),
        row("z3-1.dist-info/METADATA", "sha256=e", 5),
        row("z3-1.dist-info/RECORD", "", None),
    )
    installed = installcheck.Installed(
        "z3",
        "z3",
        "1",
        "/site/z3-1.dist-info",
        (
            row("z3/__init__.py", "sha256=a", 1),
            row("../../../bin/z3", "sha256=b", 2),
            row("../../../bin/z3-tool", "sha256=other", 3),
            row("z3-1.dist-info/METADATA", "sha256=e", 5),
            row("z3-1.dist-info/INSTALLER", "sha256=f", 6),
            row("z3-1.dist-info/RECORD", "", None),
        ),
        (),
    )
    assert installcheck.against_wheel(installed, wheel, "z3-1.dist-info", "z3.whl") == []
    extra = dataclasses.replace(installed, rows=installed.rows + (row("z3/evil.py", "sha256=g", 7),))
    assert installcheck.against_wheel(extra, wheel, "z3-1.dist-info", "z3.whl") == [
        "z3 1: the installed RECORD lists z3/evil.py, which z3.whl does not have"
    ]


PYNVVIDEOCODEC_SHA256 = "bd3779ff73ad703393c0a19c3650f269ca25e71902c24efa0719ed4a58cd9390"  # examples/vllm's lock


def test_a_locked_wheel_whose_own_record_is_wrong_installs_its_bytes_and_is_named(tmp_path):
    """pynvvideocodec 2.0.4 (in vLLM 0.33.0's lock) ships a RECORD that is wrong about two of its .so files: the
    plan installs the bytes with their own hash and size, as pip does, and verify names the two files as notes."""
    from carry.image.locked import wheelinstall
    from carry.util.download import Store

    store = Store.from_env(Path.home() / ".cache" / "carry")
    wheel = next(iter((store.root / PYNVVIDEOCODEC_SHA256).glob("*.whl")), None)
    if wheel is None:  # fetched as carry fetches a pin by name: pip in hash-checking mode, the user's index
        wheel = index.download_wheel(
            "pynvvideocodec==2.0.4", PYNVVIDEOCODEC_SHA256, Platform.LINUX_AMD64, None, tmp_path, "test"
        )
        assert hashlib.sha256(wheel.read_bytes()).hexdigest() == PYNVVIDEOCODEC_SHA256
    planned = wheelinstall.plan(wheel, wheelinstall.Venv("/opt/venv", "3.11"))
    record = next(e for e in planned.entries if e.path.endswith(".dist-info/RECORD"))
    rows = installcheck.parse_record(record.data.decode())
    with zipfile.ZipFile(wheel) as archive:
        for entry in planned.entries:
            if entry.member and entry.path.endswith(".so"):
                digest = hashlib.sha256(archive.read(entry.member)).digest()
                assert entry.hash == "sha256=" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode(), entry.path
    info, wheel_rows, corrected = installcheck.wheel_record_as_is(wheel)
    assert sorted(corrected) == [
        "PyNvVideoCodec/PyNvVideoCodec_121.cpython-311-x86_64-linux-gnu.so",
        "PyNvVideoCodec/PyNvVideoCodec_130.cpython-311-x86_64-linux-gnu.so",
    ]
    dist = installcheck.Installed("pynvvideocodec", "pynvvideocodec", "2.0.4", "x", rows, ())
    assert installcheck.against_wheel(dist, wheel_rows, info, wheel.name) == []
    _, claimed = installcheck.wheel_record(wheel)
    assert installcheck.against_wheel(dist, claimed, info, wheel.name), "the wheel's own RECORD must disagree"


# -- signed: the SBOM and provenance attached, checked by verify --key and by skopeo (carry/trust) -------------------

SIGNED_TAG = "signed"


def skopeo(signed, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["skopeo", *args], capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)


def independent_check(signed, key: Path, tag: str = SIGNED_TAG) -> tuple[bool, str]:
    """cosign's key-based verification done with other people's tools, as a user without carry would: skopeo (a
    registry client) resolves the tag to its manifest digest and fetches `sha256-<hex>.sig`; OpenSSL verifies the
    ECDSA signature in its annotation over the payload with the public key; the payload must name that digest and
    the repository. (Debian's skopeo 1.9.3 cannot evaluate a `sigstoreSigned` policy itself: a Debian-local patch
    disables sigstore and rejects every image with "Debian-local change: sigstore disabled".)"""
    env, work = signed["env"], signed["work"]
    name = f"{env.registry}/{signed['repository']}"
    common = ["--authfile", str(work / "auth.json"), "--tls-verify=false"]
    raw = skopeo(signed, "inspect", "--raw", *common, f"docker://{name}:{tag}")
    if raw.returncode != 0:
        return False, f"skopeo inspect of {tag}: {raw.stderr.strip()}"
    digest = "sha256:" + hashlib.sha256(raw.stdout.encode()).hexdigest()
    out = work / f"sig-{os.urandom(3).hex()}"
    copied = skopeo(
        signed,
        "copy",
        "--policy",
        str(work / "accept-anything.json"),
        "--src-authfile",
        str(work / "auth.json"),
        "--src-tls-verify=false",
        f"docker://{name}:{digest.replace(':', '-')}.sig",
        f"dir:{out}",
    )
    try:
        if copied.returncode != 0:
            return False, f"no signature for {digest}: {copied.stderr.strip()}"
        manifest = json.loads((out / "manifest.json").read_text())
        for layer in manifest["layers"]:
            payload = out / layer["digest"].split(":", 1)[1]
            der = out / "signature.der"
            der.write_bytes(base64.b64decode(layer["annotations"]["dev.cosignproject.cosign/signature"]))
            verified = subprocess.run(
                ["openssl", "dgst", "-sha256", "-verify", str(key), "-signature", str(der), str(payload)],
                capture_output=True,
                text=True,
            )
            critical = json.loads(payload.read_bytes())["critical"]
            if (
                verified.returncode == 0
                and verified.stdout.strip() == "Verified OK"
                and critical["image"]["docker-manifest-digest"] == digest
                and critical["identity"]["docker-reference"] == name
                and critical["type"] == "cosign container image signature"
            ):
                return True, f"{name}@{digest}: {verified.stdout.strip()}"
        return False, f"{digest}: no signature verifies with {key.name} ({verified.stdout.strip()})"
    finally:
        shutil.rmtree(out, ignore_errors=True)


@pytest.fixture(scope="module")
def signed(setup):
    """The good image pushed again under SIGNED_TAG and signed the way `image --push` signs (carry.image.attest):
    the SBOM written to dist/, the signature and the SBOM and provenance envelopes attached."""
    from carry.config import load
    from carry.image import registryhttp
    from carry.image.attest import Attester, PlatformFacts, wheel_of
    from carry.source import series
    from carry.trust import keys

    for tool in ("skopeo", "openssl"):
        if shutil.which(tool) is None:
            pytest.fail(f"{tool} is needed (apt-get install {tool}; .ci/services.sh installs skopeo)")
    env, images = setup["env"], setup["images"]
    work = setup["context"].parent / "trust"
    work.mkdir()
    assert carry("keygen", str(work / "ours")).code == 0
    assert carry("keygen", str(work / "theirs")).code == 0
    ref = images.ref(SIGNED_TAG)
    run(dockerenv.DOCKER_CLI, "tag", setup["good"], ref)
    run(dockerenv.DOCKER_CLI, "push", ref, env=images.cli_env)
    images.local.append(ref)
    images.pushed.append(SIGNED_TAG)
    status, _, headers = images.registry_call("GET", f"manifests/{SIGNED_TAG}", ", ".join(imagefs.MANIFEST_TYPES))
    assert status == 200
    digest = headers["Docker-Content-Digest"]
    config = load(setup["project"] / "build.yaml")
    project = setup["project"]
    key = keys.load_private(work / "ours" / "carry.key", None)
    attester = Attester(key, config, series.load(config.patches_dir), VERSION, "0.1.0", project / "dist")
    client = dockerenv.docker_client()
    lock = dataclasses.replace(setup["lock"], path=project / "runtime-lock" / "linux-amd64.txt")
    with downloads_at(setup["store"]):
        wheels = imageverify.stored_wheels(lock.packages)
    facts = attester.facts(
        PlatformFacts(
            platform=Platform.LINUX_AMD64,
            labels=client.images.get(ref).labels,
            fixed=wheel_of(setup["fixed"].path),
            release=None,
            base_ref=env.runtime_base,
            base=client.api.inspect_image(env.runtime_base),
            lock=lock,
            wheels=wheels,
        )
    )
    repo = registryhttp.Repository.of(config.image.name, auth(env))
    published = attester.platform(repo, facts, digest, locked=True)
    (work / "accept-anything.json").write_text(json.dumps({"default": [{"type": "insecureAcceptAnything"}]}))
    pair = base64.b64encode(f"{env.registry_user}:{env.registry_password()}".encode()).decode()
    (work / "auth.json").write_text(json.dumps({"auths": {env.registry: {"auth": pair}}}))
    (work / "auth.json").chmod(0o600)
    return {
        **setup,
        "work": work,
        "ref": ref,
        "digest": digest,
        "published": published,
        "repository": images.repository,
        "repo": repo,
        "pub": work / "ours" / "carry.pub",
        "other": work / "theirs" / "carry.pub",
    }


def test_signing_writes_the_sbom_and_attaches_signature_sbom_and_provenance(signed):
    from carry.trust import attach, sbom

    published = signed["published"]
    path = Path(published.to_json()["sbom"])
    assert path == signed["project"] / "dist" / f"{WHEEL_NAME}-{VERSION}-linux-amd64.cdx.json"
    document = path.read_bytes()
    assert sbom.validate(document) is None
    assert published.to_json()["components"] == len(signed["locked"]) + 1  # the lock's packages + the fixed wheel
    listed = sbom.installed(json.loads(document))
    for package in signed["lock"].packages:
        assert listed[(package.name, package.version)] in [h.split(":", 1)[1] for h in package.hashes]
    assert listed[(WHEEL_NAME, WHEEL_VERSION)] == signed["fixed"].sha256
    kinds = {a.kind: a for a in published.attached}
    assert kinds["signature"].tag == attach.sig_tag(signed["digest"]) and kinds["attestation"].layers == 2
    assert all(a.digest.startswith("sha256:") for a in published.attached)
    sig = json.loads(
        signed["images"].registry_call("GET", f"manifests/{kinds['signature'].tag}", attach.OCI_MANIFEST)[1]
    )
    assert sig["layers"][0]["mediaType"] == attach.SIMPLE_SIGNING


def test_other_tools_accept_the_signed_image_and_refuse_another_key(signed):
    accepted, said = independent_check(signed, signed["pub"])
    assert accepted, said
    assert said.endswith("Verified OK")
    refused, said = independent_check(signed, signed["other"])
    assert not refused and "no signature verifies with carry.pub" in said, said


def test_verify_key_checks_signature_sbom_and_provenance(signed):
    result = cli_verify(signed, signed["ref"], "--key", str(signed["pub"]))
    assert result.code == 0, result.out + result.err
    assert "signature: sha256-" in result.out and "verifies with the key" in result.out
    assert f"SBOM: signed, CycloneDX 1.6, {len(signed['locked']) + 1} components" in result.out
    assert "equal to this repository's commit, series, fixed wheel and lock" in result.out
    unkeyed = cli_verify(signed, signed["ref"])
    assert unkeyed.code == 0 and "the image's signature was not checked" in unkeyed.err


def test_verify_key_without_a_checkout_says_what_it_could_not_compare(signed, tmp_path):
    login = {
        "CARRY_REGISTRY_USER": signed["env"].registry_user,
        "CARRY_REGISTRY_PASSWORD": signed["env"].registry_password(),
    }
    result = carry("verify", signed["ref"], "--key", str(signed["pub"]), cwd=tmp_path, env=login)
    assert result.code == 0, result.out + result.err
    assert "consistent with itself, the SBOM and the labels" in result.out
    assert "not compared: no build.yaml here" in result.out


def test_verify_key_names_a_wrong_key(signed):
    result = cli_verify(signed, signed["ref"], "--key", str(signed["other"]))
    assert result.code == 1
    assert "FAIL signature: sha256-" in result.out and "verifies with the key" in result.out
    assert "FAIL SBOM: the https://cyclonedx.org/bom envelope" in result.out


@pytest.mark.parametrize("kind", ["sbom", "provenance"])
def test_verify_key_names_a_tampered_attestation(signed, kind):
    """An envelope whose statement was changed after signing (the registry rewritten by someone with push rights)."""
    from carry.trust import attach

    repo, tag = signed["repo"], attach.att_tag(signed["digest"])
    media, original = repo.get_manifest(tag)
    manifest = json.loads(original)
    index = 0 if kind == "sbom" else 1
    layer = manifest["layers"][index]
    envelope = json.loads(repo.get_blob(layer["digest"]))
    statement = json.loads(base64.b64decode(envelope["payload"]))
    if kind == "sbom":
        statement["predicate"]["components"] = statement["predicate"]["components"][1:]
    else:
        statement["predicate"]["buildDefinition"]["externalParameters"]["version"] = "20991231.1"
    envelope["payload"] = base64.b64encode(json.dumps(statement).encode()).decode()
    forged = json.dumps(envelope).encode()
    manifest["layers"][index] = {**layer, "digest": "sha256:" + hashlib.sha256(forged).hexdigest(), "size": len(forged)}
    repo.upload_bytes(forged, manifest["layers"][index]["digest"])
    repo.put_manifest(tag, json.dumps(manifest).encode(), attach.OCI_MANIFEST)
    try:
        result = cli_verify(signed, signed["ref"], "--key", str(signed["pub"]))
    finally:
        repo.put_manifest(tag, original, attach.OCI_MANIFEST)
    assert result.code == 1, result.out
    name = {"sbom": "SBOM", "provenance": "provenance"}[kind]
    assert f"FAIL {name}: the " in result.out and "does not verify with the key" in result.out


def test_a_repush_under_the_signed_tag_is_refused_by_other_tools_and_verify(signed):
    """Someone with push rights replaces the tag: the new manifest has no signature (last: it moves the tag)."""
    before, said = independent_check(signed, signed["pub"])
    assert before, said
    tampered(signed, SIGNED_TAG, f"RUN echo '#' >> {SITE}/six.py")
    refused, said = independent_check(signed, signed["pub"])
    assert not refused and said.startswith("no signature for sha256:"), said
    result = cli_verify(signed, signed["ref"], "--key", str(signed["pub"]))
    assert result.code == 1
    assert "FAIL signature: no signature: the registry has no sha256-" in result.out
    assert "FAIL SBOM: no https://cyclonedx.org/bom attestation" in result.out
