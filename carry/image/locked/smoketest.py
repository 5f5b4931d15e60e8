"""The locked image's smoke test (docs/images.md: "Smoke test"): the image's Python run once without network, the fixed
wheel's version, the patched files' bytes and the console scripts' interpreter checked; after a push each platform is
pulled back, smoke-tested and kept in the engine.

Where the previous image's smoke result holds for what did not change (`choose`: the other layers' keys are the ones it
was proven on, and the fixed layer changed Python files only), the image is not pulled: the changed files are checked
against it without running it (`light`: byte-compiled by the base's python3, their top-level imports resolved among the
layers' modules). Anything else, or `--smoke full`, pulls the image and runs it."""

from __future__ import annotations

import ast
import dataclasses
import io
import json
import sys
import tarfile
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from carry.config import Config
from carry.image.layerpush import size_text
from carry.image.locked import engineimage
from carry.image.locked.layerplan import PREFIX, PlatformPlan
from carry.image.locked.layerwrite import PlatformOutcome
from carry.platforms import Platform
from carry.util import reporter
from carry.util.errors import Failed

if TYPE_CHECKING:
    import docker

    from carry.image.locked.ocilayer import Item
    from carry.image.locked.registrycache import Facts, Previous
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
"""
# The run-time compilers' checks (want["cc"], want["nvcc"] -> out["cc"], out["nvcc"]), printing `out`: the end of
# SMOKE, and on their own (after `want` and `out` are set) on any image (tests/test_smoke_compilers.py).
COMPILERS = r"""
import os, shutil, subprocess, sysconfig, tempfile
def run(argv, cwd):
    try:
        done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=600)
    except OSError as exc:
        return f"{argv[0]}: {exc.strerror}"
    lines = [l for l in (done.stdout + done.stderr).splitlines() if l.strip()]
    errors = [l.strip() for l in lines if ("error" in l or "cannot find" in l) and not l.startswith("collect2")]
    errors = errors or lines[-1:] or [f"exit {done.returncode}"]
    return "" if done.returncode == 0 else errors[0]
work = tempfile.mkdtemp()
if want["cc"]:  # what Triton does at the first GPU use: its driver.c, built by cc against Python.h, then imported
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    include = sysconfig.get_paths()["include"]
    out["cc"] = {"cc": cc, "include": include}
    if cc is None:
        out["cc"]["error"] = "no C compiler (cc, gcc) on PATH"
    elif not os.path.isfile(os.path.join(include, "Python.h")):
        out["cc"]["error"] = f"no {include}/Python.h"
    else:
        open(work + "/carry_cc.c", "w").write(
            "#include <Python.h>\nstatic struct PyModuleDef m = {PyModuleDef_HEAD_INIT, \"carry_cc\", 0, -1, 0};\n"
            "PyMODINIT_FUNC PyInit_carry_cc(void) { return PyModule_Create(&m); }\n")
        so = "carry_cc" + sysconfig.get_config_var("EXT_SUFFIX")
        error = run([cc, "-O1", "-shared", "-fPIC", "-I" + include, "carry_cc.c", "-o", so], work)
        if not error:
            sys.path.insert(0, work)
            __import__("carry_cc")
        out["cc"]["error"] = error
        out["cc"]["version"] = subprocess.run([cc, "--version"], capture_output=True, text=True).stdout.split("\n")[0]
if want["nvcc"]:  # what FlashInfer's JIT does: CUDA_HOME's nvcc on CUDA code that includes the CCCL headers
    home = os.environ.get("CUDA_HOME", "")
    nvcc = os.path.join(home, "bin", "nvcc")
    out["nvcc"] = {"home": home}
    if not home or not os.access(nvcc, os.X_OK):
        out["nvcc"]["error"] = f"no nvcc in CUDA_HOME ({home or 'not set'})"
    else:
        open(work + "/carry_cccl.cu", "w").write(
            "#include <cuda.h>\n#include <cuda_runtime.h>\n#include <cuda_fp16.h>\n#include <cuda_bf16.h>\n"
            "#include <cuda/std/cstdint>\n#include <cub/block/block_reduce.cuh>\n__global__ void k(float* o) {\n"
            "  using R = cub::BlockReduce<float, 128>; __shared__ typename R::TempStorage t;\n"
            "  float v = R(t).Sum(o[threadIdx.x]); if (threadIdx.x == 0) o[0] = v; }\n"
            "extern \"C\" int carry_jit(void) { int n = 0; cudaGetDeviceCount(&n); return cuInit(0) + n; }\n")
        flags = ["-isystem", home + "/include"] + (["-isystem", home + "/include/cccl"]
                                                  if os.path.isdir(home + "/include/cccl") else [])
        out["nvcc"]["error"] = run([nvcc, "-c", "-std=c++17", "-gencode", "arch=compute_90,code=sm_90", *flags,
                                    "--compiler-options=-fPIC", "carry_cccl.cu", "-o", "carry_cccl.o"], work)
        out["nvcc"]["version"] = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout.strip()
        if not out["nvcc"]["error"]:  # and links it as FlashInfer's JIT does: -lcudart -lcuda from lib64(/stubs)
            out["nvcc"]["error"] = run(["c++", "-shared", "carry_cccl.o", "-L" + home + "/lib64", "-L" + home +
                                        "/lib64/stubs", "-lcudart", "-lcuda", "-o", "carry_jit.so"], work)
        if not out["nvcc"]["error"]:
            dynamic = subprocess.run(["readelf", "-d", "carry_jit.so"], cwd=work, capture_output=True, text=True)
            needed = [l.split("[", 1)[1].rstrip("]") for l in dynamic.stdout.splitlines() if "(NEEDED)" in l]
            missing = [lib for lib in ("libcudart.so.", "libcuda.so.1") if not any(n.startswith(lib) for n in needed)]
            out["nvcc"]["needed"] = needed
            out["nvcc"]["error"] = f"the linked object does not need {missing} (it needs {needed})" if missing else ""
shutil.rmtree(work, ignore_errors=True)
print(json.dumps(out))
"""
SMOKE += COMPILERS


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
        "cc": "cc" in plan.compilers,
        # nvcc runs natively only: another CPU's check loads no NVIDIA layer, and the lock holds its toolkit to one
        # release for every platform (runtimelock, cudatoolkit)
        "nvcc": "nvcc" in plan.compilers and native,
    }
    found = _run_json(client, image_ref, plan, [f"{PREFIX}/bin/python", "-c", SMOKE, json.dumps(want)], 900)
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
    problems += compiler_problems(found)
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
        + compilers_text(found, plan)
    )


def compiler_problems(found: dict) -> list[str]:
    """What the run-time compilers' checks found missing, each naming the fix."""
    problems = []
    cc = found.get("cc") or {}
    if cc.get("error"):
        problems.append(
            f"Triton cannot build its driver: {cc['error']}; add g++, libc6-dev and python3-dev to "
            f"image.runtime_packages (a C compiler and the Python headers)"
        )
    nvcc = found.get("nvcc") or {}
    if nvcc.get("error"):
        problems.append(
            f"a JIT cannot compile and link CUDA with CUDA_HOME {nvcc.get('home') or '(not set)'}: "
            f"{nvcc['error'][:300]}; the lock's CUDA toolkit wheels must be one release (relock), the image needs "
            f"g++ (image.runtime_packages), and CUDA_HOME the toolkit's layout carry adds (lib64, stubs)"
        )
    return problems


def compilers_text(found: dict, plan: PlatformPlan) -> str:
    """`; run-time compilers: ...` for what was checked, '' when the lock compiles nothing at run time."""
    said = []
    if found.get("cc"):
        said.append(f"cc ({found['cc'].get('version', '?')}) built and imported a Python.h extension")
    if found.get("nvcc"):
        release = found["nvcc"].get("version", "").rsplit("release ", 1)[-1].split(",")[0]
        said.append(
            f"CUDA_HOME's nvcc {release} compiled CUDA with the CCCL headers (sm_90), linked as FlashInfer's JIT "
            f"links (-lcudart -lcuda): needs {', '.join(found['nvcc'].get('needed', []))}"
        )
    elif "nvcc" in plan.compilers:
        said.append("nvcc not run under QEMU (the lock holds the same one-release toolkit)")
    return f"; run-time compilers: {', '.join(said)}" if said else ""


def smoke_pushed(
    client: docker.DockerClient,
    config: Config,
    outcomes: list[PlatformOutcome],
    plans: dict,
    login: Login,
    version: str,
) -> list[PlatformOutcome]:
    """Every pushed platform pulled back and smoke-tested at the same time, each on its own engine connection: one
    pull (download, inflate, unpack, one layer after the other) leaves part of the machine idle, which the other
    platform's pull or smoke test takes (two 1 GB pulls: 16.8 s at once against 21.5 s one after the other)."""
    from concurrent.futures import ThreadPoolExecutor

    from carry.image import registry

    def one(outcome: PlatformOutcome) -> PlatformOutcome:
        plan = plans[outcome.platform]
        engine = client if len(outcomes) == 1 else registry.client()
        try:
            if outcome.platform is not Platform.native() and plan.base.get("Id"):
                return partial_smoke(engine, config, outcome, plan)
            return pull_and_smoke(engine, config, outcome, plan, login, version)
        finally:
            if engine is not client:
                engine.close()

    with ThreadPoolExecutor(max_workers=max(1, len(outcomes))) as pool:
        return list(pool.map(reporter.carried(one), outcomes))


PARTIAL_LAYERS = ("venv", "vllm-release", "vllm-fixed")


def partial_smoke(
    client: docker.DockerClient, config: Config, outcome: PlatformOutcome, plan: PlatformPlan
) -> PlatformOutcome:
    """Another CPU's smoke test (under QEMU, nothing of torch) on the layers it reads: the engine's base, venv and the
    wheel's layers loaded from what carry wrote, then removed; holding another CPU's 9 GB image proves nothing more."""
    from carry.image.layerpush import Digests
    from carry.image.locked.layerwrite import load_platform

    layers = tuple(layer for layer in plan.layers if layer.name in PARTIAL_LAYERS and layer.planned)
    if len(layers) != len({layer.name for layer in plan.layers if layer.name in PARTIAL_LAYERS}):
        raise Failed(f"smoke test of {outcome.platform}: its wheel's layers were not planned here")
    ref = f"carry-smoke/{outcome.platform.tag}:{outcome.digest.split(':', 1)[1][:16]}"
    subset = dataclasses.replace(plan, layers=layers)
    reporter.phase("smoke", f"{outcome.platform}: the base, venv and wheel layers loaded as {ref}")
    load_platform(client, subset, Digests(Path("/nonexistent")), {}, config, (ref,))
    try:
        text = smoke(client, ref, plan, False)
    finally:
        engineimage.forget_pulled(client, ref)
    return dataclasses.replace(outcome, smoke=f"{text} (on its base, venv and wheel layers, loaded here)")


def pull_and_smoke(
    client: docker.DockerClient,
    config: Config,
    outcome: PlatformOutcome,
    plan: PlatformPlan,
    login: Login,
    version: str,
) -> PlatformOutcome:
    """Pull the pushed manifest back for its platform, smoke-test it, and keep it tagged as the Dockerfile path tags
    (engineimage); an image that fails is removed."""
    ref = f"{config.image.name}@{outcome.digest}"
    reporter.phase("pull", f"{ref} ({outcome.platform})")
    before = engineimage.named(client, outcome.refs)
    layers = [(layer.written.digest, layer.written.size) for layer in outcome.layers]
    pulled = engineimage.pull(client, ref, outcome.platform, login.auth, layers)
    reporter.phase(
        "pull",
        f"{outcome.platform}: {pulled.fetched} of {pulled.layers} layer(s), {size_text(pulled.size)} "
        f"in {pulled.seconds:.1f}s",
    )
    try:
        reporter.phase("smoke", f"{ref} ({outcome.platform})")
        text = smoke(client, ref, plan, outcome.platform is Platform.native())
    except BaseException:
        engineimage.forget_pulled(client, ref)
        raise
    image_id = client.api.inspect_image(ref)["Id"]
    kept = engineimage.keep(client, image_id, outcome.refs, outcome.platform, version, before)
    return dataclasses.replace(outcome, smoke=text, kept=dataclasses.replace(kept, pulled=pulled))


# -- choosing: pull the image, or check what changed against it ---------------------------------------------------

FULL, LIGHT = "full", "light"
FIXED_LAYER = "vllm-fixed"


@dataclasses.dataclass(frozen=True)
class Choice:
    """How one platform is smoke-tested: `full` (pulled and run) or `light` (the changed files checked), and why."""

    mode: str
    why: str


def choose(
    requested: str, outcome: PlatformOutcome, plan: PlatformPlan, previous: Previous | None, engine_holds: bool
) -> Choice:
    """`full` when asked, when no previous smoke result holds for the unchanged layers, when more than Python files
    changed, or when the engine holds every unchanged layer (the pull fetches what changed); else `light`."""
    if requested == FULL:
        return Choice(FULL, "--smoke full")
    smoke = previous.record.smoke if previous is not None and previous.record is not None else None
    if not smoke or smoke.get("platform") != str(outcome.platform):
        return Choice(FULL, "no smoke result recorded with a previous image")
    proven = set(smoke.get("layers") or ())
    changed = [layer for layer in outcome.layers if layer.key not in proven]
    if any(layer.name != FIXED_LAYER for layer in changed):
        names = ", ".join(sorted({layer.name for layer in changed if layer.name != FIXED_LAYER}))
        return Choice(FULL, f"more than Python files changed: layer(s) {names}")
    other = python_only(plan)
    if other:
        return Choice(FULL, f"more than Python files changed: {other}")
    if engine_holds:
        return Choice(FULL, "the engine holds every unchanged layer: the pull fetches what changed")
    return Choice(LIGHT, f"the smoke test of {previous.ref if previous else '?'} holds for the unchanged layers")


def python_only(plan: PlatformPlan) -> str:
    """'' when the fixed layer changes Python files only (dist-infos aside), else what else it holds."""
    fixed = next((layer for layer in plan.layers if layer.name == FIXED_LAYER), None)
    if fixed is None or not fixed.planned:
        return "no fixed layer"
    dist_info = plan.fixed.dist_info + "/"
    for item in fixed.items:
        if item.kind == "dir" or item.path.startswith(dist_info):
            continue
        if item.kind == "whiteout":
            if not item.path.endswith(".dist-info"):
                return f"{item.path} removed"
            continue
        if item.kind != "file" or not item.path.endswith(".py"):
            return f"{item.path} ({item.kind})"
    return ""


COMPILE = r"""
import json, pkgutil, sys
files = json.loads(open("/carry-smoke.json").read())
stdlib = getattr(sys, "stdlib_module_names", None)
stdlib = stdlib or {m.name for m in pkgutil.iter_modules()} | set(sys.builtin_module_names)
errors = {}
for path in files:
    try:
        compile(open("/carry-smoke/" + path, "rb").read(), "/" + path, "exec", dont_inherit=True)
    except SyntaxError as exc:
        errors[path] = f"{type(exc).__name__}: {exc}"
print(json.dumps({"python": sys.version.split()[0], "stdlib": sorted(stdlib), "errors": errors}))
"""


def light(
    client: docker.DockerClient, plan: PlatformPlan, outcome: PlatformOutcome, previous: Previous, facts: list[Facts]
) -> tuple[str, dict]:
    """The fixed layer's changed Python files byte-compiled by the image's Python, their imports resolved."""
    assert previous.record is not None and previous.record.smoke is not None  # choose() said light
    fixed = next(layer for layer in plan.layers if layer.name == FIXED_LAYER)
    site = plan.fixed.dist_info.rsplit("/", 1)[0] + "/"
    sources = {
        item.path: _read(item)
        for item in fixed.items
        if item.kind == "file" and item.path.endswith(".py") and not item.path.startswith(plan.fixed.dist_info + "/")
    }
    python = _compile(client, plan, sources)
    if python["errors"]:
        raise Failed(
            f"smoke test of {outcome.platform}: {len(python['errors'])} file(s) do not compile with Python "
            f"{python['python']}: " + "; ".join(f"{p}: {e}" for p, e in sorted(python["errors"].items())[:5])
        )
    modules = image_modules(facts)
    stdlib = set(python["stdlib"])
    unresolved, count = [], 0
    for path, data in sorted(sources.items()):
        if not path.startswith(site):
            continue
        for name in top_level_imports(data, path[len(site) :]):
            count += 1
            if name.split(".", 1)[0] not in stdlib and name not in modules:
                unresolved.append(f"{path[len(site) :]}: import {name}")
    if unresolved:
        raise Failed(
            f"smoke test of {outcome.platform}: {len(unresolved)} import(s) resolve to no module of the image: "
            + "; ".join(unresolved[:5])
        )
    smoke = previous.record.smoke
    unchanged = sum(layer.key in set(smoke.get("layers") or ()) for layer in outcome.layers)
    text = (
        f"{outcome.platform}: light: {len(sources)} changed Python file(s) byte-compiled by Python {python['python']}"
        f" ({python['where']}), {count} top-level import(s) resolved among the image's {len(modules):,} modules and "
        f"its Python's standard library; the previous image's smoke test ({smoke.get('proof')}) holds for "
        f"{unchanged} unchanged layer(s)"
        + (f"; run-time compilers as it proved them: {smoke['compilers']}" if smoke.get("compilers") else "")
    )
    return text, _record(outcome, LIGHT, smoke.get("proof"), smoke.get("compilers", ""), smoke.get("root"))


def full_record(outcome: PlatformOutcome, text: str) -> dict:
    """What a full smoke test proved, recorded with the image: on which layers."""
    proof = text.split(": ", 1)[1].split(";", 1)[0] if ": " in text else text
    compilers = text.partition("; run-time compilers: ")[2].split(" (on its base", 1)[0]
    return _record(outcome, FULL, proof, compilers, outcome.digest)


def _record(outcome: PlatformOutcome, how: str, proof: object, compilers: object, root: object) -> dict:
    layers = [layer.key for layer in outcome.layers]
    return dict(platform=str(outcome.platform), how=how, proof=proof, compilers=compilers, root=root, layers=layers)


def _read(item: Item) -> bytes:
    from carry.image.locked import ocilayer

    assert item.entry is not None  # a file's item carries its entry
    return b"".join(ocilayer._content(item.entry, {}))


def _compile(client: docker.DockerClient, plan: PlatformPlan, sources: dict[str, bytes]) -> dict:
    """Byte-compile `sources` (installed path -> bytes) with the image's Python: the base's python3 in a container
    without network (the base from the engine), else this machine's own Python when it is the image's X.Y."""
    image_id = plan.base.get("Id") or ""
    if not image_id:
        wanted = plan.fixed.dist_info.split("/python", 1)[1].split("/", 1)[0]
        here = f"{sys.version_info.major}.{sys.version_info.minor}"
        if here != wanted:
            raise Failed(
                f"smoke test of {plan.platform}: the base is not in the engine and this machine's Python is {here}, "
                f"not the image's {wanted}; run with --smoke full"
            )
        errors = {}
        for path, data in sources.items():
            try:
                compile(data, "/" + path, "exec", dont_inherit=True)
            except SyntaxError as exc:
                errors[path] = f"{type(exc).__name__}: {exc}"
        python, stdlib = sys.version.split()[0], sorted(sys.stdlib_module_names)
        return dict(python=python, stdlib=stdlib, errors=errors, where="this machine's")
    buffer = io.BytesIO()
    listing = json.dumps(sorted(sources)).encode()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for name, data in [
            ("carry-smoke.json", listing),
            *((f"carry-smoke/{p}", d) for p, d in sorted(sources.items())),
        ]:
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            archive.addfile(info, io.BytesIO(data))
    found = _run_json(client, image_id, plan, ["python3", "-I", "-S", "-c", COMPILE], 600, buffer.getvalue())
    found["where"] = "the base's python3" + ("" if plan.platform is Platform.native() else ", under QEMU")
    return found


def _run_json(
    client: docker.DockerClient, image: str, plan: PlatformPlan, argv: list[str], timeout: int, tar: bytes = b""
) -> dict:
    """`argv` run once in a container of `image` without network: the JSON its last line prints."""
    container = client.containers.create(image, entrypoint=argv, network_disabled=True, platform=str(plan.platform))
    try:
        if tar:
            container.put_archive("/", tar)
        container.start()
        status = container.wait(timeout=timeout)
        output = container.logs(stdout=True, stderr=True).decode(errors="replace")
    finally:
        container.remove(force=True)
    if status.get("StatusCode") != 0:
        raise Failed(
            f"smoke test of {image} ({plan.platform}): {argv[0]} exited {status.get('StatusCode')}: "
            f"{output.strip()[-400:]}"
        )
    return json.loads(output.strip().splitlines()[-1])


def image_modules(facts: Iterable[Facts]) -> set[str]:
    """The modules the layers install, in order: a layer's whiteouts remove a module and its submodules below it."""
    found: set[str] = set()
    for layer in facts:
        for gone in layer.removed:
            found = {name for name in found if name != gone and not name.startswith(gone + ".")}
        found.update(layer.modules)
    return found


def top_level_imports(source: bytes, relative: str) -> list[str]:
    """The modules a module imports when it is imported: `import` and `from … import` at its top level, in its
    classes' bodies and under `if`/`with` (not under `if TYPE_CHECKING`, in functions, or in a `try` that handles
    the failure); relative ones resolved against its package (`relative`: its path under site-packages)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    package = relative.removesuffix(".py").split("/")[:-1]  # a module's package; a package's own for __init__
    names: list[str] = []

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.Import):
                names.extend(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package[: len(package) - (node.level - 1)] if node.level > 1 else list(package)
                    module = ".".join([*base, *([node.module] if node.module else [])])
                else:
                    module = node.module or ""
                if module and module != "__future__":
                    names.append(module)
            elif isinstance(node, ast.If):
                if not _type_checking(node.test):
                    visit(node.body)
                visit(node.orelse)
            elif isinstance(node, (ast.With, ast.ClassDef)) or (isinstance(node, ast.Try) and not node.handlers):
                visit(node.body)

    visit(tree.body)
    return list(dict.fromkeys(names))


def _type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )
