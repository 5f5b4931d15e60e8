"""carry's own layers, small and real: wheels made here installed as pip would into tar layers, the release/fixed
difference with whiteouts, byte-identical layers from the same inputs, and the image loaded into the real engine
(`docker load`, no registry) and run: on this CPU and, for linux/arm64, under QEMU."""

from __future__ import annotations

import hashlib
import io
import tarfile
import types
from pathlib import Path

import pytest

import dockerenv
from carry.image import gzlayer, layerpush
from carry.image.locked import cudatoolkit, layerplan, layerwrite, ocilayer, runtimelock, smoketest, wheelinstall
from carry.platforms import Platform
from carry.util.download import Store
from lib.wheels import make_wheel

pytestmark = pytest.mark.docker


@pytest.fixture
def wheels(tmp_path):
    store = tmp_path / "store"
    dep = make_wheel(tmp_path, "tinydep", "2.0", {"tinydep/__init__.py": b"VALUE = 2\n"})
    sha = hashlib.sha256(dep.read_bytes()).hexdigest()
    (store / sha).mkdir(parents=True)
    dep = dep.rename(store / sha / dep.name)
    common = {
        "demopkg/__init__.py": b"__version__ = __import__('importlib.metadata').metadata.version('demopkg')\n"
        b"def main():\n    print('demo-cli ran')\n",
        "demopkg/same.py": b"X = 1\n",
    }
    scripts = {"demopkg-1.0.data/scripts/tool": b"#!python\nprint('tool ran')\n"}
    release = make_wheel(
        tmp_path,
        "demopkg",
        "1.0",
        {**common, **scripts, "demopkg/a.py": b"A = 'release'\n", "demopkg/gone/c.py": b"C = 1\n"},
        "[console_scripts]\ndemo-cli = demopkg:main\n",
    )
    fixed_dir = tmp_path / "fixed"
    fixed_dir.mkdir()
    scripts = {"demopkg-1.0+carry.1.data/scripts/tool": b"#!python\nprint('tool ran')\n"}
    fixed = make_wheel(
        fixed_dir,
        "demopkg",
        "1.0+carry.1",
        {**common, **scripts, "demopkg/a.py": b"A = 'fixed'\n", "demopkg/b.py": b"B = 'new'\n"},
        "[console_scripts]\ndemo-cli = demopkg:main\n",
    )
    lock = runtimelock.Lock(
        tmp_path / "lock.txt",
        Platform.LINUX_AMD64,
        "3.11.2",
        "x86_64-manylinux_2_36",
        "base",
        "",
        "",
        "demopkg==1.0+carry.1",
        (runtimelock.Locked("tinydep", "2.0", (f"sha256:{sha}",)),),
    )
    return types.SimpleNamespace(store=Store(store), dep=dep, release=release, fixed=fixed, lock=lock)


CONFIG = types.SimpleNamespace(image=types.SimpleNamespace(env={"DEMO_ENV": "on"}, entrypoint=("demo-cli",), cmd=()))


def test_install_plan_is_pips_and_the_difference_has_whiteouts(wheels):
    venv = wheelinstall.Venv("/opt/venv", "3.11")
    fixed = wheelinstall.plan(wheels.fixed, venv)
    paths = {e.path: e for e in fixed.entries}
    site = "opt/venv/lib/python3.11/site-packages"
    assert paths["opt/venv/bin/tool"].data == b"#!/opt/venv/bin/python\nprint('tool ran')\n"
    assert paths["opt/venv/bin/demo-cli"].data.startswith(b"#!/opt/venv/bin/python\n")
    assert paths["opt/venv/bin/demo-cli"].mode == 0o755
    record = paths[f"{site}/demopkg-1.0+carry.1.dist-info/RECORD"].data.decode()
    assert "../../../bin/demo-cli,sha256=" in record and "demopkg-1.0+carry.1.dist-info/INSTALLER,sha256=" in record
    assert "demopkg-1.0+carry.1.dist-info/RECORD,," in record
    changed, whiteouts = layerplan.difference(wheelinstall.plan(wheels.release, venv), fixed)
    assert sorted(e.path for e in changed if "dist-info" not in e.path) == [
        f"{site}/demopkg/a.py",
        f"{site}/demopkg/b.py",
    ]
    assert sorted(w.path for w in whiteouts) == [f"{site}/demopkg-1.0.dist-info", f"{site}/demopkg/gone"]
    layer = ocilayer.items_for(changed, whiteouts)
    names = [ocilayer.whiteout_name(i.path) if i.kind == "whiteout" else i.path for i in layer]
    assert f"{site}/.wh.demopkg-1.0.dist-info" in names and f"{site}/demopkg/.wh.gone" in names


def test_the_nvidia_layers_key_follows_the_code_that_makes_its_added_files(wheels, tmp_path, monkeypatch):
    """The locked wheels' layers are keyed by the lock alone (a runner that finds them in the registry reads no
    wheel); the nvidia layer also holds files carry makes (the driver stub): another carry's code, another key. A
    pushed image once kept a stub of the code before (verify IMAGE found its bytes wrong)."""
    venv = layerplan.venv_of(wheels.lock)
    before = {group: layerplan.group_key(wheels.lock, group, venv) for group in layerplan.GROUPS}
    edited = tmp_path / "cudatoolkit.py"
    edited.write_bytes(Path(cudatoolkit.__file__).read_bytes() + b"# another stub\n")
    monkeypatch.setattr(cudatoolkit, "__file__", str(edited))
    after = {group: layerplan.group_key(wheels.lock, group, venv) for group in layerplan.GROUPS}
    assert [g for g in layerplan.GROUPS if before[g] != after[g]] == ["nvidia"], (before, after)


def test_the_same_inputs_give_the_same_layer_bytes(wheels, tmp_path):
    digests = []
    for _ in range(2):
        plan = layerplan.plan_platform(
            CONFIG,
            Platform.LINUX_AMD64,
            wheels.lock,
            {"tinydep": wheels.dep},
            wheels.fixed,
            wheels.release,
            "base",
            {"Config": {}},
        )
        found = []
        for layer in plan.layers:
            box = {}
            data = b"".join(gzlayer.compressed(ocilayer.stream(layer.items), lambda w, box=box: box.update(w=w)))
            assert box["w"].tar_size == ocilayer.tar_size(layer.items)
            assert hashlib.sha256(data).hexdigest() == box["w"].digest.split(":")[1]
            found.append(box["w"].digest)
            with tarfile.open(fileobj=io.BytesIO(data)) as archive:
                assert all(m.mtime == 0 and m.uid == 0 and m.gid == 0 for m in archive)
        digests.append(found)
    assert digests[0] == digests[1]


@pytest.mark.parametrize("platform", ["linux/amd64", "linux/arm64"])
def test_loaded_into_the_engine_and_run(wheels, tmp_path, platform):
    env = dockerenv.require()
    client = dockerenv.docker_client()
    target = Platform.parse(platform, "test")
    base_ref = env.runtime_base if target is Platform.LINUX_AMD64 else env.runtime_base_arm64
    base = client.api.inspect_image(base_ref)
    lock = wheels.lock
    if target is not Platform.LINUX_AMD64:
        lock = runtimelock.Lock(
            lock.path, target, lock.python, "aarch64-manylinux_2_36", "base", "", "", "", lock.packages
        )
    found = layerplan.fetch_wheels(lock, wheels.store, tmp_path)
    plan = layerplan.plan_platform(CONFIG, target, lock, found, wheels.fixed, wheels.release, base_ref, base)
    ref = f"carry-test/issue-24-image-layers:{target.tag}-{tmp_path.name[-12:].lower()}"
    image_id, layers = layerwrite.load_platform(
        client,
        plan,
        layerpush.Digests(tmp_path / "digests"),
        {"io.carry.test": "yes"},
        CONFIG,
        (ref,),
    )
    try:
        assert [layer.name for layer in layers][-6:] == [
            "venv",
            "nvidia",
            "torch",
            "deps",
            "vllm-release",
            "vllm-fixed",
        ]
        line = smoketest.smoke(client, ref, plan, native=target is Platform.native())
        assert "1 script(s)" not in line and "patched file(s) byte-equal" in line
        inspected = client.api.inspect_image(ref)
        assert inspected["Config"]["Entrypoint"] == ["/usr/local/bin/carry-entrypoint", "demo-cli"]
        assert "DEMO_ENV=on" in inspected["Config"]["Env"]
        assert inspected["Architecture"] == target.architecture
        out = client.containers.run(ref, remove=True, network_disabled=True, platform=platform).decode()
        assert "demo-cli ran" in out
        listing = client.containers.run(
            ref,
            entrypoint=[
                "/opt/venv/bin/python",
                "-c",
                "import os, demopkg.a as a, tinydep; "
                "d='/opt/venv/lib/python3.11/site-packages'; "
                "print(a.A, tinydep.VALUE, sorted(os.listdir(d)), "
                "sorted(os.listdir(d + '/demopkg')))",
            ],
            remove=True,
            network_disabled=True,
            platform=platform,
        ).decode()
        assert "fixed 2" in listing and "demopkg-1.0.dist-info" not in listing and "'gone'" not in listing
        assert "demopkg-1.0+carry.1.dist-info" in listing and "'b.py'" in listing
    finally:
        client.images.remove(ref, force=True)
