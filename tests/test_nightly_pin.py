"""`carry pin` on a faithful replica of vLLM's per-commit wheel index (tests/nightlyindex.py), served on loopback:
vLLM 0.33.0's real released wheels re-versioned as the nightlies of commits on the real vLLM history (the PyPI
sdists as git, examples/vllm/make_upstream.py) grown on main:

    main   v0.32.0 - v0.33.0 - A1 - A2 - K - A3        A1, A2, A3: Python-only; K: a change to csrc/
                              \\     \\        \\
    PRs                         P1    P2       P3        each a Python-only commit off its merge-base

    the index   v0.33.0: the release's own wheels (default variant)   A1: cu130 x86_64 + aarch64   A2: cu130 x86_64

Found at the merge-base, walked back to an ancestor with identical compiled inputs, refused (csrc/, an absent
variant, 404, a truncated download, a file changed on the server), bad input, the commands that move the pin, and
then `wheel` for both platforms from what `pin` wrote, through pip from the replica, hash-checked.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

import nightlyindex as ni
import realvllm
from helpers import ROOT, Result, assert_bad_input, carry

pytestmark = pytest.mark.slow

EXAMPLE = ROOT / "examples" / "vllm"
VAR = "CARRY_TEST_NIGHTLY"
X86, ARM = "linux/amd64", "linux/arm64"
PR = 53899


@dataclasses.dataclass
class Replica:
    repo: Path
    sha: dict[str, str]  # v0.32.0, v0.33.0, A1, A2, K, A3, P1, P2, P3
    wheels: dict[tuple[str, str, str], Path]  # (commit name, variant, platform) -> the served file
    server: ni.Server
    work: Path

    @property
    def env(self) -> dict[str, str]:
        return {
            "CARRY_CACHE": str(self.work / "cache"),
            "CARRY_DOWNLOADS": str(self.work / "store"),
            VAR: self.server.url,
        }

    def version(self, name: str, variant: str = "cu130", platform: str = X86) -> str:
        return ni.wheel_version(self.wheels[(name, variant, platform)])

    def sha256(self, name: str, variant: str = "cu130", platform: str = X86) -> str:
        from carry.util.integrity import file_sha256

        return file_sha256(self.wheels[(name, variant, platform)])

    def path_of(self, name: str, variant: str = "cu130", platform: str = X86) -> str:
        """The URL path of a served wheel."""
        return f"/{self.sha[name]}/{self.wheels[(name, variant, platform)].name}"

    def stored(self) -> list[str]:
        """What the download store holds: files, and scratch dirs a download left."""
        return sorted(p.name for p in (self.work / "store").rglob("*") if p.is_file() or p.name.startswith("."))


@pytest.fixture(scope="module")
def replica(tmp_path_factory):
    work = tmp_path_factory.mktemp("nightly")
    history = Path(realvllm.build(work / "history-cache")["path"])
    repo = work / "upstream.git"
    subprocess.run(["git", "clone", "--quiet", "--bare", "--shared", str(history), str(repo)], check=True)
    sha = {name: ni.git(repo, "rev-parse", f"v{name[1:]}^{{commit}}") for name in ("v0.32.0", "v0.33.0")}
    ni.grow(repo, sha, PR)
    released = {X86: realvllm.path(realvllm.WHEEL_X86), ARM: realvllm.path(realvllm.WHEEL_ARM)}
    served = sorted({("A1", "cu130", X86), ("A1", "cu130", ARM), ("A2", "cu130", X86)})
    distance = {"A1": 1, "A2": 2}

    def made(key: tuple[str, str, str]) -> Path:
        name, variant, platform = key
        version = ni.nightly_version("0.33.1", distance[name], sha[name], variant)
        return ni.reversion(released[platform], work / "wheels" / name, version)

    with ThreadPoolExecutor(2) as pool:  # file copies, mostly
        wheels = dict(zip(served, pool.map(made, served)))
    # v0.33.0 is a tagged commit on main: its wheels are the release's own files (version 0.33.0, default variant)
    wheels |= {("v0.33.0", "default", platform): path for platform, path in released.items()}
    for name in ("v0.33.0", "A1", "A2"):
        ni.publish(work / "index", sha[name], [path for key, path in wheels.items() if key[0] == name])
    server = ni.Server(work / "index")
    try:
        yield Replica(repo, sha, wheels, server, work)
    finally:
        server.stop()
        for part in ("wheels", "index", "store", "history-cache", "cache"):  # the wheels' builds: gigabytes
            shutil.rmtree(work / part, ignore_errors=True)


NIGHTLY = ni.nightly_block(VAR)


def make_project(replica: Replica, root: Path, commit: str, nightly: str = NIGHTLY) -> Path:
    """examples/vllm copied onto the grown history at `commit` (PR 53899), its pins replaced by a nightly block."""
    return ni.make_project(EXAMPLE, root, replica.repo, replica.sha[commit], PR, nightly)


def run(config: Path, replica: Replica, *args: str, env: dict[str, str] | None = None) -> Result:
    return carry("--config", str(config), *args, env={**replica.env, **(env or {})})


def pins(config: Path) -> dict:
    return yaml.safe_load(config.read_text())["build"]["precompiled"].get("wheels") or {}


def expected_pin(replica: Replica, name: str, platform: str, variant: str = "cu130") -> dict:
    folder = "" if variant == "default" else f"{variant}/"
    return {
        "requirement": f"vllm=={replica.version(name, variant, platform)}",
        "index": f"${{{VAR}}}/{replica.sha[name]}/{folder}",
        "sha256": replica.sha256(name, variant, platform),
        "ref": replica.sha[name],
    }


def error_line(result: Result) -> str:
    """The one error line of a failure (progress lines may come before it)."""
    errors = [line for line in result.err.splitlines() if line.startswith("carry: error:")]
    assert len(errors) == 1 and "Traceback" not in result.err, result.err
    return errors[0]


@pytest.fixture(scope="module")
def at_base(replica, tmp_path_factory):
    """P1 pinned: both platforms' cu130 wheels are at the merge-base A1."""
    config = make_project(replica, tmp_path_factory.mktemp("at-base") / "vllm", "P1")
    before = config.read_text()
    return config, before, run(config, replica, "pin")


def test_both_platforms_at_the_merge_base(replica, at_base):
    config, before, result = at_base
    assert result.code == 0, result.err
    a1 = replica.sha["A1"]
    lines = result.out.splitlines()
    for line, platform in zip(lines, (X86, ARM)):
        version, sha = replica.version("A1", "cu130", platform), replica.sha256("A1", "cu130", platform)
        assert line == (
            f"{platform}: vllm=={version} at C {a1[:12]} (the merge-base of upstream.commit and main); variant cu130; "
            f"version {version} names commit {a1[:9]} = {a1[:12]}; sha256 {sha[:12]} (new pin: trust on first use)"
        ), result.out
    assert lines[2] == f"wrote build.precompiled.wheels in {config}"
    assert "trust on first use: the index gives no hashes" in result.err and "different commits" not in result.err
    assert pins(config) == {X86: expected_pin(replica, "A1", X86), ARM: expected_pin(replica, "A1", ARM)}
    # in place: the text before is the text after without the block pin added (comments, order, the rest kept)
    written = config.read_text()
    block = written[written.index("    wheels:\n") : written.index("\nimage:")]
    assert written.replace(block, "") == before
    assert "index: ${CARRY_TEST_NIGHTLY}" in written and replica.server.url not in written  # no host written
    # a rerun finds the same and rewrites no byte (`pin --check`: below, with a file changed on the server)
    stamp = config.stat().st_mtime_ns
    again = run(config, replica, "pin")
    assert again.code == 0 and again.out.splitlines()[-1] == f"{config}: pins unchanged", again.out + again.err
    assert "(unchanged: the sha256 build.yaml pins)" in again.out and "trust on first use" not in again.err
    assert config.stat().st_mtime_ns == stamp


@pytest.fixture(scope="module")
def walked(replica, tmp_path_factory):
    """P2 pinned: A2 has no cu130 aarch64 wheel, so linux/arm64 walks back to A1 (Python-only between them)."""
    config = make_project(replica, tmp_path_factory.mktemp("walked") / "vllm", "P2")
    return config, run(config, replica, "pin")


def test_a_platform_missing_at_the_merge_base_walks_to_the_nearest_ancestor_with_identical_inputs(replica, walked):
    config, result = walked
    assert result.code == 0, result.err
    a1, a2 = replica.sha["A1"], replica.sha["A2"]
    x86, arm = result.out.splitlines()[:2]
    assert x86.startswith(f"{X86}: vllm=={replica.version('A2')} at C {a2[:12]} (the merge-base"), x86
    assert arm.startswith(
        f"{ARM}: vllm=={replica.version('A1', 'cu130', ARM)} at {a1[:12]}, 1 commit(s) back from C {a2[:12]} along "
        f"main ({a2[:12]}: no linux/arm64 wheel (its cu130 page lists linux/amd64)); its compiled inputs are the "
        f"patched tree's; variant cu130; version {replica.version('A1', 'cu130', ARM)} names commit {a1[:9]}"
    ), arm
    assert (
        f"the platforms' wheels come from different commits ({X86} at {a2[:12]}, {ARM} at {a1[:12]}); each is proven "
        f"against the patched tree when it is built"
    ) in result.err
    assert pins(config) == {X86: expected_pin(replica, "A2", X86), ARM: expected_pin(replica, "A1", ARM)}


def test_only_wheels_behind_a_csrc_change_are_refused_naming_each_commit(replica, tmp_path):
    config = make_project(replica, tmp_path / "vllm", "P3")
    before, stored = config.read_text(), replica.stored()
    result = run(config, replica, "pin")
    assert result.code == 1, result.err
    line = error_line(result)
    s = replica.sha
    assert line.startswith(  # the same refusals for both platforms: one clause naming both
        f"carry: error: {X86}, {ARM} (variant cu130): no precompiled wheel in 6 commit(s) of main's first-parent "
        f"history from C {s['A3'][:12]} (max_walk 50, where the history ends): {s['A3'][:12]}..{s['K'][:12]} (2 "
        f"commits): no cu130 wheels (404); {s['A2'][:12]}..{s['v0.33.0'][:12]} (3 commits): inputs differ at "
        f"csrc/activation_kernels.cu; {s['v0.32.0'][:12]}: inputs differ at CMakeLists.txt and "
    ), line
    assert "no other variant's or platform's wheel is taken" in line and "wheel --from-source" in line
    assert config.read_text() == before and replica.stored() == stored


def test_an_absent_variant_is_refused_never_substituted(replica, tmp_path):
    """cu131 at no commit: refused, never cu130 (A1 has it) nor the default variant (v0.33.0 has it)."""
    variant = "cu131"
    config = make_project(replica, tmp_path / "vllm", "P1", NIGHTLY.replace("cu130", variant))
    before, stored = config.read_text(), replica.stored()
    result = run(config, replica, "pin")
    assert result.code == 1, result.err
    line, s, name = error_line(result), replica.sha, variant
    assert (
        f"{X86}, {ARM} (variant {name}): no precompiled wheel in 3 commit(s) of main's first-parent history from C "
        f"{s['A1'][:12]} (max_walk 50, where the history ends): {s['A1'][:12]}: no {name} wheels (404; C's index "
        f"has: cu130); {s['v0.33.0'][:12]}: no {name} wheels (404); {s['v0.32.0'][:12]}: inputs differ at"
    ) in line, line
    assert config.read_text() == before and replica.stored() == stored


@pytest.mark.parametrize("fault", ["404", "truncate"])
def test_a_listed_wheel_that_is_missing_or_cut_short_is_one_line_and_nothing_written(replica, tmp_path, fault):
    config = make_project(replica, tmp_path / "vllm", "P1")
    before, stored = config.read_text(), replica.stored()
    path = replica.path_of("A1")
    replica.server.faults[path] = fault
    try:
        result = run(config, replica, "pin")
    finally:
        del replica.server.faults[path]
    assert result.code == 1, result.err
    line, url = error_line(result), replica.server.url + path.replace("+", "%2B")
    size = replica.wheels[("A1", "cu130", X86)].stat().st_size
    if fault == "404":
        assert line == f"carry: error: {url}: 404 Not Found, but the index lists {Path(path).name}; nothing was written"
    else:
        assert line == (
            f"carry: error: {url}: the download was cut short: {size // 3} of {size} bytes; nothing was written"
        )
    assert config.read_text() == before and replica.stored() == stored  # no partial file, no scratch dir


def test_a_file_whose_hash_changed_on_the_server_after_pinning_is_refused(replica, at_base, tmp_path):
    """A1's x86_64 wheel uploaded again (the same name and members, other bytes): `pin` refuses, writing nothing,
    and `pin --check` says stale, per platform as `lock --check` does; the other platform is fresh."""
    pinned, _, _ = at_base
    project = tmp_path / "vllm"
    shutil.copytree(pinned.parent, project)
    config = project / "build.yaml"
    before = config.read_text()
    original = replica.wheels[("A1", "cu130", X86)]
    rebuilt = ni.reuploaded(original, tmp_path / "reupload")
    from carry.util.integrity import file_sha256

    new, old = file_sha256(rebuilt), replica.sha256("A1")
    replica.server.faults[replica.path_of("A1")] = rebuilt
    try:
        result = run(config, replica, "pin")
        checked = run(config, replica, "pin", "--check")
    finally:
        del replica.server.faults[replica.path_of("A1")]
        shutil.rmtree(tmp_path / "reupload", ignore_errors=True)
    assert result.code == 1, result.err
    assert error_line(result) == (
        f"carry: error: {X86}: {original.name} of commit {replica.sha['A1'][:12]} is on the index with sha256 {new}, "
        f"but build.yaml pins that very file with sha256 {old}: it changed on the server (tampering, or a re-upload), "
        f"which is never an update; nothing was written: ask the index's owner why, and only then remove the pin and "
        f"run `carry pin` again"
    )
    assert config.read_text() == before
    assert checked.code == 1 and checked.out.splitlines() == [
        f"{X86}: stale: {original.name} changed on the server: sha256 {new}, pinned {old}: tampering or a re-upload, "
        f"never an update",
        f"{ARM}: fresh",
    ], checked.out + checked.err


@pytest.mark.parametrize(
    ("block", "needles"),
    [
        (
            "    nightly:\n      variant: cu130\n",
            ("build.precompiled.nightly.index is required: the root URL of the per-commit wheel index",),
        ),
        (
            NIGHTLY.replace("variant: cu130", "variant: cu130/x86_64"),
            ("build.precompiled.nightly.variant 'cu130/x86_64' is not a variant name (one path segment",),
        ),
        (
            NIGHTLY.replace(f"${{{VAR}}}", f"${{{VAR}}}/sign-in"),
            ("/vllm/metadata.json answered an HTML page, not the JSON list of wheels", "/sign-in is not such an index"),
        ),
        (
            NIGHTLY.replace(VAR, "CARRY_TEST_UNSET_INDEX"),
            ("is '${CARRY_TEST_UNSET_INDEX}', but $CARRY_TEST_UNSET_INDEX is not set; export CARRY_TEST_UNSET_INDEX=",),
        ),
    ],
    ids=["no-index", "variant-with-a-slash", "html-not-an-index", "unset-variable"],
)
def test_bad_nightly_input_is_one_line_exit_2_nothing_written(replica, tmp_path, block, needles):
    config = make_project(replica, tmp_path / "vllm", "P1", block)
    before, stored = config.read_text(), replica.stored()
    replica.server.faults["/sign-in/*"] = "html"
    try:
        result = run(config, replica, "pin")
    finally:
        del replica.server.faults["/sign-in/*"]
    assert_bad_input(result, *needles)
    assert config.read_text() == before and replica.stored() == stored


def test_builds_need_the_pins_pin_writes(replica, tmp_path):
    """A nightly block without wheels loads; wheel, lock and image stop before any work, naming `carry pin`."""
    config = make_project(replica, tmp_path / "vllm", "P1")
    assert run(config, replica, "check").code == 0
    for args in (["wheel"], ["wheel", "--platform", ARM], ["lock"], ["image"]):
        result = run(config, replica, *args, *(["--out", str(tmp_path / "dist")] if args[0] == "wheel" else []))
        assert_bad_input(result, "build.precompiled.wheels has no pin for", "run `carry pin`")
    assert not (tmp_path / "dist").exists()


def test_fetch_update_pin_moves_the_precompiled_pins_too(replica, tmp_path):
    """The PR head moved from P1 to P2: `fetch --update-pin` runs the same discovery before it moves the pin."""
    config = make_project(replica, tmp_path / "vllm", "P1")
    result = run(config, replica, "fetch", "--update-pin")
    assert result.code == 0, result.err
    assert yaml.safe_load(config.read_text())["upstream"]["commit"] == replica.sha["P2"]
    assert pins(config) == {X86: expected_pin(replica, "A2", X86), ARM: expected_pin(replica, "A1", ARM)}
    assert f"1 commit(s) back from C {replica.sha['A2'][:12]}" in result.err and "different commits" in result.err
    assert f"pin moved {replica.sha['P1'][:12]} -> {replica.sha['P2']}" in result.err


def test_follow_takes_the_moved_pr_head_and_moves_the_pins_on_its_branch(replica, tmp_path):
    """The PR head moved from P1 to P2 (rebased onto A2): `follow`, with no REF, carries the series there in a
    workspace of its own, and `pin` finds the wheel by the patched tree it made (read from the mirror once the
    workspace is gone): A2's, on the branch; the report's pins say what was found, without a download's progress
    lines; the current branch keeps P1's pin. (No image section: x86_64 only, and no runtime lock to make.)"""
    config = make_project(replica, tmp_path / "vllm", "P1")
    text = config.read_text()
    config.write_text(text[: text.index("\nimage:\n") + 1])  # no image section: no runtime lock for follow to make
    assert run(config, replica, "pin").code == 0
    project = config.parent
    for args in (("init", "-q"), ("add", "-A"), ("commit", "-qm", "pinned on P1")):
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@localhost", *args], cwd=project, check=True)
    before = config.read_text()
    result = run(config, replica, "follow", "--no-build", "--json")
    assert result.code == 0, result.err
    report = json.loads(result.out)
    assert (report["ref"], report["commit"], report["exit"]) == (f"refs/pull/{PR}/head", replica.sha["P2"], 0)
    shown = subprocess.run(
        ["git", "show", f"{report['branch']}:build.yaml"], cwd=project, capture_output=True, text=True, check=True
    ).stdout
    moved = yaml.safe_load(shown)
    assert moved["upstream"]["commit"] == replica.sha["P2"]
    assert moved["build"]["precompiled"]["wheels"] == {X86: expected_pin(replica, "A2", X86)}
    assert any(f"at C {replica.sha['A2'][:12]}" in line for line in report["pins"]), report["pins"]
    assert not any("% of" in line for line in report["pins"]), report["pins"]
    assert config.read_text() == before


def test_a_release_at_a_tagged_merge_base_is_proven_by_its_tag(replica, tmp_path):
    """The default variant's pages (`{index}/{C}/vllm/`): A1 has none, so both platforms walk back to v0.33.0, a
    tagged commit whose wheels are the release's own (version 0.33.0, proven by the tag): the pins examples/vllm
    writes by hand, found."""
    config = make_project(replica, tmp_path / "vllm", "P1", ni.nightly_block(VAR, variant=None))
    result = run(config, replica, "pin")
    assert result.code == 0, result.err
    a1, tagged = replica.sha["A1"], replica.sha["v0.33.0"]
    for line in result.out.splitlines()[:2]:
        assert (
            f"==0.33.0 at {tagged[:12]}, 1 commit(s) back from C {a1[:12]} along main ({a1[:12]}: no default wheels "
            f"(404; C's index has: cu130)); its compiled inputs are the patched tree's; variant default; version "
            f"0.33.0 is tag v0.33.0 = {tagged[:12]}; sha256 "
        ) in line, line
    assert pins(config) == {
        X86: expected_pin(replica, "v0.33.0", X86, "default"),
        ARM: expected_pin(replica, "v0.33.0", ARM, "default"),
    }
    by_hand = yaml.safe_load((EXAMPLE / "build.yaml").read_text())["build"]["precompiled"]["wheels"]
    assert {p: (w["requirement"], w["sha256"]) for p, w in pins(config).items()} == {
        p: (w["requirement"], w["sha256"]) for p, w in by_hand.items()
    }


def test_refresh_onto_a_base_without_fitting_wheels_changes_nothing(replica, tmp_path):
    """Onto main (A3, behind the csrc/ change): the series would move, but no wheel fits, so nothing changes."""
    config = make_project(replica, tmp_path / "vllm", "A1")
    before = {p.name: p.read_bytes() for p in config.parent.rglob("*") if p.is_file()}
    result = run(config, replica, "refresh")
    assert result.code == 1, result.err
    assert "(variant cu130): no precompiled wheel in" in error_line(result)
    assert {p.name: p.read_bytes() for p in config.parent.rglob("*") if p.is_file()} == before


@pytest.mark.parametrize("platform", [X86, ARM])
def test_wheel_builds_from_what_pin_wrote(replica, walked, tmp_path, platform):
    """The walked pins (amd64 at A2, arm64 at A1) on a runner whose download store is empty: pip downloads each
    from the replica, hash-checked against the sha256 `pin` wrote, and the precompiled build proves it against
    the patched tree (P2 + the series)."""
    config, _ = walked
    env = {"CARRY_DOWNLOADS": str(tmp_path / "store")}
    name = "A2" if platform == X86 else "A1"
    wheel = replica.wheels[(name, "cu130", platform)]
    args = ["--platform", platform] if platform == ARM else []
    result = run(config, replica, "wheel", "--out", str(tmp_path / "dist"), *args, env=env)
    assert result.code == 0, result.err
    assert f"downloaded {wheel.name} (vllm=={replica.version(name, 'cu130', platform)} for {platform}) with pip" in (
        result.err
    )
    assert f"{replica.server.url}/{replica.sha[name]}/cu130/" in result.err
    assert (
        f"precompiled: 13 shared objects from {wheel.name} (sha256 {replica.sha256(name, 'cu130', platform)[:8]}…), "
        f"compiled inputs identical to {replica.sha[name]}"
    ) in result.err
    assert f"version {replica.version(name, 'cu130', platform)} names commit {replica.sha[name][:9]}" in result.err
    assert "tree check passed" in result.err and "arch gate passed" in result.err
    built = Path(result.out.strip())
    machine = "x86_64" if platform == X86 else "aarch64"
    assert built.name == f"vllm-0.33.0+carry.20261201.1-cp38-abi3-manylinux_2_28_{machine}.whl"
    shutil.rmtree(tmp_path / "store", ignore_errors=True)
