"""The locked image's smoke test (docs/images.md: "Smoke test"): the image's Python run once without network, the
fixed wheel's version, the patched files' bytes and the console scripts' interpreter checked; after a push each
platform is pulled back, smoke-tested and kept in the engine (carry.image.locked.engineimage)."""

from __future__ import annotations

import dataclasses
import json
from typing import TYPE_CHECKING

from carry.config import Config
from carry.image.locked import engineimage
from carry.image.locked.layerplan import PREFIX, PlatformPlan
from carry.image.locked.layerwrite import PlatformOutcome
from carry.platforms import Platform
from carry.util.errors import Failed
from carry.util.progress import Progress

if TYPE_CHECKING:
    import docker

    from carry.image.registry import Login

# -- the smoke test --------------------------------------------------------------------------------------------

SMOKE = r"""
import hashlib, importlib.metadata, json, sys
want = json.loads(sys.argv[1])
out = {"version": importlib.metadata.version(want["name"]), "prefix": sys.prefix, "python": sys.version.split()[0]}
out["bad_files"] = [p for p, h in want["files"].items()
                    if hashlib.sha256(open("/" + p, "rb").read()).hexdigest() != h]
out["bad_scripts"] = {}
for p in want["scripts"]:
    first = open("/" + p, "rb").readline().decode(errors="replace").strip()
    if first.startswith("#!") and first != "#!" + want["interpreter"]:
        out["bad_scripts"][p] = first
if want["import"]:
    module = __import__(want["import"])
    out["imported"] = module.__version__
print(json.dumps(out))
"""


def smoke(client: docker.DockerClient, image_ref: str, plan: PlatformPlan, native: bool) -> str:
    """Run the image's Python without network: the fixed wheel's version, the patched files' bytes, the console
    scripts' interpreter; natively (this CPU) `import vllm` too. Under QEMU nothing imports torch (2.14's aarch64
    build hangs in qemu-user 7.2)."""
    files = dict(sorted(plan.patched.items())[:400])
    want = {
        "name": plan.fixed.name,
        "files": files,
        "scripts": list(plan.fixed.scripts),
        "interpreter": f"{PREFIX}/bin/python",
        "import": plan.fixed.name.replace("-", "_") if native else "",
    }
    container = client.containers.create(
        image_ref,
        entrypoint=[f"{PREFIX}/bin/python", "-c", SMOKE],
        command=[json.dumps(want)],
        network_disabled=True,
        platform=str(plan.platform),
    )
    try:
        container.start()
        status = container.wait(timeout=900)
        output = container.logs(stdout=True, stderr=True).decode(errors="replace")
    finally:
        container.remove(force=True)
    if status.get("StatusCode") != 0:
        raise Failed(
            f"smoke test of {image_ref} ({plan.platform}) exited {status.get('StatusCode')}: {output.strip()[-400:]}"
        )
    found = json.loads(output.strip().splitlines()[-1])
    problems = []
    if found["version"] != plan.fixed.version:
        problems.append(f"{plan.fixed.name} {found['version']} installed, not {plan.fixed.version}")
    if found["prefix"] != PREFIX:
        problems.append(f"sys.prefix is {found['prefix']}, not {PREFIX}")
    if found["bad_files"]:
        problems.append(
            f"{len(found['bad_files'])} patched file(s) differ from the fixed wheel: "
            f"{', '.join(found['bad_files'][:5])}"
        )
    if found["bad_scripts"]:
        problems.append(f"console scripts with another interpreter: {found['bad_scripts']}")
    if native and found.get("imported") != plan.fixed.version:
        problems.append(f"import {want['import']} gave version {found.get('imported')}")
    if problems:
        raise Failed(f"smoke test of {image_ref} ({plan.platform}): " + "; ".join(problems))
    what = (
        f"import {want['import']} -> {found['imported']}"
        if native
        else f"importlib.metadata {found['version']} (no torch import under QEMU)"
    )
    return (
        f"{plan.platform}: {what}; {len(files)} patched file(s) byte-equal to the fixed wheel; "
        f"{len(plan.fixed.scripts)} script(s) on #!{PREFIX}/bin/python; Python {found['python']}"
    )


def smoke_pushed(
    client: docker.DockerClient,
    config: Config,
    outcomes: list[PlatformOutcome],
    plans: dict,
    login: Login,
    progress: Progress,
    version: str,
) -> list[PlatformOutcome]:
    """Every pushed platform pulled back and smoke-tested at the same time, each on its own engine connection: one
    pull (download, inflate, unpack, one layer after the other) leaves part of the machine idle, which the other
    platform's pull or smoke test takes (two 1 GB pulls: 16.8 s at once against 21.5 s one after the other)."""
    from concurrent.futures import ThreadPoolExecutor

    from carry.image import registry

    def one(outcome: PlatformOutcome) -> PlatformOutcome:
        if len(outcomes) == 1:
            return pull_and_smoke(client, config, outcome, plans[outcome.platform], login, progress, version)
        engine = registry.client()
        try:
            return pull_and_smoke(engine, config, outcome, plans[outcome.platform], login, progress, version)
        finally:
            engine.close()

    with ThreadPoolExecutor(max_workers=max(1, len(outcomes))) as pool:
        return list(pool.map(one, outcomes))


def pull_and_smoke(
    client: docker.DockerClient,
    config: Config,
    outcome: PlatformOutcome,
    plan: PlatformPlan,
    login: Login,
    progress: Progress,
    version: str,
) -> PlatformOutcome:
    """Pull the pushed manifest back for its platform (the engine fetches only the layers it does not hold), run the
    smoke test on it, and keep it tagged as the Dockerfile path tags, the engine tidied
    (carry.image.locked.engineimage); an image that fails is removed."""
    ref = f"{config.image.name}@{outcome.digest}"
    progress.phase("pull", f"{ref} ({outcome.platform})")
    before = engineimage.named(client, outcome.refs)
    layers = [(layer.written.digest, layer.written.size) for layer in outcome.layers]
    pulled = engineimage.pull(client, ref, outcome.platform, login.auth, layers)
    progress.phase(
        "pull",
        f"{outcome.platform}: {pulled.fetched} of {pulled.layers} layer(s), {engineimage.size_text(pulled.size)} "
        f"in {pulled.seconds:.1f}s",
    )
    try:
        progress.phase("smoke", f"{ref} ({outcome.platform})")
        text = smoke(client, ref, plan, outcome.platform is Platform.native())
    except BaseException:
        engineimage.forget_pulled(client, ref)
        raise
    image_id = client.api.inspect_image(ref)["Id"]
    kept = engineimage.keep(client, image_id, outcome.refs, outcome.platform, version, before)
    return dataclasses.replace(outcome, smoke=text, kept=dataclasses.replace(kept, pulled=pulled))
