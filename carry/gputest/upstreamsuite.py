"""`suite`: the upstream's own test suite run on the fixed wheel and on the wheel it was made from (the precompiled
release wheel by default), at the same time, with the same selection (build.upstream_tests) in the same test tree
(suiterun.py), compared per test id; a JSON report, `<wheel>.suite.json`, is written beside the fixed wheel.

Per test id: the same outcome on both sides (failed both: the upstream's own failures), or **regressed** (exit 1),
**fixed**, a skip that came or went, or collected on one side only (failing on the fixed side only counts as a
failure). A module that does not import on one side makes each of its tests collected on the other an error there.
The comparison side's result is cached by what it depends on, so a rerun of a changed series runs the fixed side
only. The report names both wheels by sha256 and the selection by digest, which `verify` checks; `label()` is its
one-line summary, for an image label or an attestation.
"""

from __future__ import annotations

import datetime
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING

import carry
from carry.gputest import suiterun
from carry.gputest.reportcheck import ReportCheck, read_json
from carry.gputest.suiterun import FAIL, PASS, Side, Subject
from carry.util import reporter
from carry.util.digest import sha256
from carry.util.errors import BadInput, Failed
from carry.util.fsutil import atomic_write_text, temp_dir
from carry.util.integrity import file_sha256
from carry.util.record import record

if TYPE_CHECKING:
    from carry.config import Config
    from carry.config.build import UpstreamTests
    from carry.util.cache import Cache
    from carry.wheelbuild.verify import Verification

FORMAT = 1
KIND = "carry-upstream-suite"
SUFFIX = ".suite.json"
SHOWN = 25  # ids listed per group in what the command prints; the report holds all


@record(kw_only=True)
class Inputs:
    """What one `suite` run compares: the fixed wheel and the other, where the other comes from, and the patched
    tree (of `commit` with the series) whose tests both run."""

    config: Config
    cache: Cache
    mirror: Path
    commit: str
    tree: str
    wheel: Path
    against: Path
    against_source: str
    rerun: bool = False


@record
class Outcome:
    report: dict
    path: Path

    @property
    def passed(self) -> bool:
        return self.report["verdict"] == "PASS"


def report_path(wheel: Path) -> Path:
    return wheel.with_name(wheel.name + SUFFIX)


def selection_digest(tests: UpstreamTests) -> str:
    """The selection and the test requirements, as one digest (the report records it; verify compares it)."""
    payload = {**tests.selection(), "requires": sorted(tests.requires)}
    return f"sha256:{sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()}"


def dist_name(wheel: Path) -> str:
    from packaging.utils import canonicalize_name

    return canonicalize_name(wheel.name.split("-", 1)[0])


# --- the run --------------------------------------------------------------------------------------------------------


def run(inputs: Inputs) -> Outcome:
    """Check out the tests, make both environments, run both sides (the comparison side cached), compare, write the
    report beside the fixed wheel; what is said is held until the selection is known good (bad input is one line)."""
    with reporter.holding() as held:
        assert isinstance(held, reporter.Holding)
        return _run(inputs, held)


def _run(inputs: Inputs, held: reporter.Holding) -> Outcome:
    from carry.image.locked.runtimelock import wheel_metadata

    tests = selection_of(inputs.config)
    where = f"{inputs.config.path}: build.upstream_tests"
    clock = time.monotonic()
    if dist_name(inputs.wheel) != dist_name(inputs.against):
        raise BadInput(
            f"{inputs.wheel.name} and {inputs.against.name} are different distributions; compare a wheel with the "
            f"release it was made from"
        )
    _same_tree(inputs)
    tree = suiterun.test_tree(inputs.cache, inputs.mirror, inputs.tree, tests, where)
    reporter.phase("suite", f"tests of {inputs.tree[:12]}: {tree.describe()}")
    env_clock = time.monotonic()
    subjects = {}
    for label, wheel in (("against", inputs.against), ("fixed", inputs.wheel)):
        deps = suiterun.deps_env(wheel_metadata(wheel)[1], tests, inputs.config.build.environment, inputs.cache, where)
        digest = f"sha256:{file_sha256(wheel)}"
        env = suiterun.wheel_env(wheel, digest, deps, inputs.cache)
        modules = suiterun.top_level_modules(wheel)
        subjects[label] = Subject(wheel=wheel, digest=digest, dist=dist_name(wheel), modules=modules, env=env)
        how = f"reused {deps.seconds:.2f} s" if deps.reused else f"made in {deps.seconds:.1f} s"
        own = f"reused {env.seconds:.2f} s" if env.reused else f"made in {env.seconds:.1f} s"
        reporter.phase(
            "suite",
            f"{label}: {wheel.name}: deps env {deps.short} ({len(deps.packages)} packages, {how}), its own venv "
            f"{env.root.name[:8]} ({own})",
        )
    env_s = time.monotonic() - env_clock
    key = _cache_key(subjects["against"], tests, tree)
    cached = None if inputs.rerun else _cached(inputs.cache, key)
    if cached is not None:
        held.release()  # the selection ran before: it is good
    sides = _run_sides(inputs, tests, tree, subjects, cached, held)
    against, fixed = sides["against"], sides["fixed"]
    _judge_against(against, tests, where)
    _check_origins(subjects, sides)
    if cached is None:  # stored for the next run
        stored = _results_file(inputs.cache, key)
        stored.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(stored, json.dumps({"key": key, "side": against.to_json()}) + "\n")
    fixed = _judge_fixed(fixed, against)
    times = {
        "checkout_s": round(tree.seconds, 3),
        "environments_s": round(env_s, 3),
        "against_s": 0.0 if cached else round(against.seconds, 3),
        "against_cached": cached is not None,
        "against_first_run_s": round(against.seconds, 3),
        "fixed_s": round(fixed.seconds, 3),
        "total_s": round(time.monotonic() - clock, 3),
    }
    report = make_report(inputs, tests, tree, (subjects, against, fixed), times)
    path = report_path(inputs.wheel)
    atomic_write_text(path, json.dumps(report, indent=1) + "\n")
    return Outcome(report, path)


def selection_of(config: Config) -> UpstreamTests:
    tests = config.build.upstream_tests
    if tests is None:
        raise BadInput(
            f"{config.path}: build.upstream_tests is not set; name the upstream's tests to run, e.g. "
            f"upstream_tests: {{paths: [tests/unit], marker: cpu_test}}"
        )
    return tests


def _same_tree(inputs: Inputs) -> None:
    """A wheel carry built says which patched tree it holds: it must be the one whose tests run."""
    from carry.binaries import buildinfo

    info = buildinfo.read(inputs.wheel) or {}
    built = info.get("tree")
    if built and built != inputs.tree:
        raise BadInput(
            f"{inputs.wheel.name} was built from the patched tree {str(built)[:12]}, the series now gives "
            f"{inputs.tree[:12]}: build the wheel again (`wheel`) so that its tests are the series' own"
        )


def _run_sides(
    inputs: Inputs,
    tests: UpstreamTests,
    tree: suiterun.TestTree,
    subjects: dict[str, Subject],
    cached: Side | None,
    held: reporter.Holding,
) -> dict[str, Side]:
    """Both sides at once (the comparison side unless cached), each in its own scratch dir; output is held until the
    comparison side has collected (a selection it cannot run is bad input); what still runs at the end is stopped."""
    where = f"{inputs.config.path}: build.upstream_tests"
    labels = ("fixed",) if cached is not None else ("against", "fixed")
    with temp_dir(inputs.cache.scratch, "suite-") as work:
        started: dict[str, suiterun.Started] = {}
        try:
            for label in labels:
                reporter.phase("suite", f"{label}: running {subjects[label].wheel.name}")
                started[label] = suiterun.start(subjects[label], tests, tree, work / label)
            if cached is None:
                collected = suiterun.wait_for_collection(started["against"])
                if started["against"].process.poll() is not None:
                    _judge_against(suiterun.finish(started["against"]), tests, where)
                held.release()
                reporter.phase("suite", f"against: collected {collected} test(s)")
            sides = {label: suiterun.finish(started[label], label) for label in labels}
        finally:
            for run in started.values():
                run.process.kill()
    if cached is not None:
        reporter.phase("suite", f"against: {cached.describe()} (cached)")
        sides["against"] = cached
    return sides


def _judge_against(side: Side, tests: UpstreamTests, where: str) -> None:
    """The comparison side says whether the selection is good: bad input when its markers are unknown, when pytest
    cannot start with it, or when it collects nothing; a run that died cannot be compared with."""
    if side.unknown_markers:
        known = ", ".join(m for m in side.markers if m not in BUILTIN_MARKERS) or "none"
        raise BadInput(
            f"{where}.marker {tests.marker!r} names {', '.join(side.unknown_markers)}, which the upstream's tests do "
            f"not register (they register: {known}); use one of those"
        )
    if not side.started:
        raise BadInput(
            f"{where}: pytest did not start on {side.wheel}: {_last_error(side.log_tail)}; add what the tests need "
            f"to {where.rsplit(': ', 1)[-1]}.requires"
        )
    if side.collected == 0 and not side.collect_errors:
        marker = f" with marker {tests.marker!r}" if tests.marker else ""
        raise BadInput(
            f"{where}: the selection collects no test ({', '.join(tests.paths)}{marker}); name paths that hold "
            f"tests, or a marker they carry"
        )
    if side.died:
        raise Failed(
            f"the run on {side.wheel} {side.died}: nothing to compare with; its log ends: {_last_error(side.log_tail)}"
        )


BUILTIN_MARKERS = frozenset(
    {"filterwarnings", "skip", "skipif", "xfail", "parametrize", "usefixtures", "tryfirst", "trylast", "timeout"}
)


def _judge_fixed(fixed: Side, against: Side) -> Side:
    """The fixed side as compared: where pytest did not start, each test the other side ran is an error."""
    if fixed.started:
        return fixed
    reason = f"pytest did not start on this wheel: {_last_error(fixed.log_tail)}"
    return Side.from_json({**fixed.to_json(), "tests": {test: ["error", 0.0, reason] for test in against.tests}})


def _last_error(log: str) -> str:
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith(("E ", "ERROR", "ImportError", "ModuleNotFoundError"))]
    return " ".join((errors or lines or ["no output"])[-1].split())[:300]


def _check_origins(subjects: dict[str, Subject], sides: dict[str, Side]) -> None:
    """Each module imported from a wheel must come from that wheel's own venv, never the test tree or another."""
    for label, side in sides.items():
        site = str(subjects[label].env.site)
        for name, origin in side.modules.items():
            if origin is not None and not str(origin).startswith(site + "/"):
                raise Failed(
                    f"{label} side: the tests imported {name} from {origin}, not from {side.wheel} ({site}); "
                    f"keep the upstream's package sources out of build.upstream_tests.checkout"
                )


def _cache_key(subject: Subject, tests: UpstreamTests, tree: suiterun.TestTree) -> str:
    payload = {
        "format": FORMAT,
        "wheel": subject.digest,
        "deps": subject.env.deps.key,
        "tree": tree.key,
        "selection": tests.selection(),
        "plugin": sha256(suiterun.PLUGIN_FILE.read_bytes()).hexdigest(),
    }
    return sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def _results_file(cache: Cache, key: str) -> Path:
    return cache.root / suiterun.SUITES_DIR / "results" / f"{key[:32]}.json"


def _cached(cache: Cache, key: str) -> Side | None:
    try:
        data = json.loads(_results_file(cache, key).read_text())
        return Side.from_json(data["side"]) if data.get("key") == key else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


# --- the comparison -------------------------------------------------------------------------------------------------


def kind_of(outcome: str | None) -> str | None:
    if outcome is None:
        return None
    return "pass" if outcome in PASS else "fail" if outcome in FAIL else "skip"


def outcomes(side: Side, other: Side) -> dict[str, list]:
    """`side`'s tests, plus an error for each test `other` collected from a module that did not import here."""
    found = dict(side.tests)
    for test in other.tests:
        if test in found:
            continue
        module = next((m for m in side.collect_errors if test.startswith(m + "::")), None)
        if module is not None:
            found[test] = ["error", 0.0, f"its module did not import: {side.collect_errors[module]}"]
    for module, message in side.collect_errors.items():
        covers = any(test.startswith(module + "::") for test in other.tests)
        if not covers and module not in found:
            found[module] = ["error", 0.0, f"collection: {message}"]
    return found


def classify(before: str | None, after: str | None) -> str:
    """same, regressed, fixed, skip-changed, only-fixed or only-against, for the outcomes of one test id."""
    old, new = kind_of(before), kind_of(after)
    if old is None:
        return "only-fixed"
    if new is None:
        return "only-against"
    if old == new:
        return "same"
    if new == "fail":
        return "regressed"
    if old == "fail" and new == "pass":
        return "fixed"
    return "skip-changed"


def compare(against: Side, fixed: Side) -> dict[str, dict]:
    """Per test id: both outcomes, their messages and the class."""
    before, after = outcomes(against, fixed), outcomes(fixed, against)
    table = {}
    for test in sorted(set(before) | set(after)):
        old, new = before.get(test), after.get(test)
        table[test] = {
            "against": old[0] if old else None,
            "fixed": new[0] if new else None,
            "class": classify(old[0] if old else None, new[0] if new else None),
            "message": (new[2] if new and kind_of(new[0]) != "pass" else "") or (old[2] if old else ""),
        }
    return table


CHANGED = ("regressed", "fixed", "skip-changed", "only-fixed", "only-against")  # the classes but `same`


def summarize(table: dict[str, dict]) -> dict[str, int]:
    classes = [row["class"] for row in table.values()]
    same = [row for row in table.values() if row["class"] == "same"]
    return {
        "tests": len(table),
        "same": len(same),
        "passed_both": sum(kind_of(row["fixed"]) == "pass" for row in same),
        "failed_both": sum(kind_of(row["fixed"]) == "fail" for row in same),
        "skipped_both": sum(kind_of(row["fixed"]) == "skip" for row in same),
        **{name.replace("-", "_"): classes.count(name) for name in CHANGED},
        "new_failing": sum(row["class"] == "only-fixed" and kind_of(row["fixed"]) == "fail" for row in table.values()),
    }


def one_line(summary: dict[str, int]) -> str:
    """`331 same (331 passed both, 0 failed both, 0 skipped both) · 0 regressed · 0 fixed · ...`."""
    only = summary["only_fixed"] + summary["only_against"]
    return (
        f"{summary['same']} same ({summary['passed_both']} passed both, {summary['failed_both']} failed both, "
        f"{summary['skipped_both']} skipped both) · {summary['regressed']} regressed · {summary['fixed']} fixed · "
        f"{summary['skip_changed']} skip changed · {only} only one side"
    )


# --- the report -----------------------------------------------------------------------------------------------------


def make_report(
    inputs: Inputs, tests: UpstreamTests, tree: suiterun.TestTree, ran: tuple[dict, Side, Side], times: dict
) -> dict:
    subjects, against, fixed = ran
    table = compare(against, fixed)
    summary = summarize(table)
    failing = summary["regressed"] or summary["new_failing"] or not fixed.tests
    deps = {label: subject.env.deps for label, subject in subjects.items()}
    return {
        "format": FORMAT,
        "kind": KIND,
        "carry": carry.__version__,
        "started": datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0).isoformat(),
        "verdict": "FAIL" if failing else "PASS",
        "summary": summary,
        "line": one_line(summary),
        "wheel": _side_json(fixed, subjects["fixed"]),
        "against": {**_side_json(against, subjects["against"]), "source": inputs.against_source},
        "upstream": {"commit": inputs.commit, "tree": inputs.tree, "tests": tree.objects, "tests_key": tree.key},
        "selection": {**tests.selection(), "requires": list(tests.requires), "digest": selection_digest(tests)},
        "environment": {
            "deps": {label: env.key for label, env in deps.items()},
            "same_deps": deps["fixed"].key == deps["against"].key,
            "packages": len(deps["fixed"].packages),
            "versions": deps["fixed"].versions,
            "python": deps["fixed"].inputs.get("python_version"),
        },
        "times": times,
        "tests": table,
    }


def _side_json(side: Side, subject: Subject) -> dict:
    return {
        "name": side.wheel,
        "sha256": side.digest,
        "version": side.version,
        "imported": side.modules,
        "collected": side.collected,
        "counts": side.counts(),
        "collect_errors": side.collect_errors,
        "exitstatus": side.exitstatus,
        "died": side.died,
        "seconds": round(side.seconds, 3),
        "env": str(subject.env.root),
    }


def label(report: dict) -> str:
    """The report's summary in one line, for an image label or an attestation."""
    summary = report["summary"]
    only = summary["only_fixed"] + summary["only_against"]
    return (
        f"{report['verdict']} same={summary['same']} regressed={summary['regressed']} fixed={summary['fixed']} "
        f"only-one-side={only} failed-both={summary['failed_both']} against={report['against']['sha256'][:19]} "
        f"selection={report['selection']['digest'][:19]}"
    )


def lines(report: dict, path: Path) -> list[str]:
    """What `suite` prints: both sides, the one-line summary, every changed test, the upstream's own failures and
    the tests of one side only (up to SHOWN each), the time split and where the report is."""
    wheel, against, times = report["wheel"], report["against"], report["times"]
    env = report["environment"]
    shown = ", ".join(f"{name} {version}" for name, version in list(env["versions"].items())[:4])
    same = "the same for both sides" if env["same_deps"] else "NOT the same for both sides (their Requires-Dist differ)"
    selection = report["selection"]
    marker = f"-m {selection['marker']!r}, " if selection["marker"] else ""
    workers = f"{selection['workers']} xdist worker(s)" if selection["workers"] else "one process"
    rows = [
        f"tests     {', '.join(report['upstream']['tests'])} of {report['upstream']['tree'][:12]} (the pin "
        f"{report['upstream']['commit'][:12]} with the series)",
        f"selection {marker}{len(selection['paths'])} path(s), {len(selection['deselect'])} deselected with a "
        f"reason, timeout {selection['timeout']} s per test, {workers}, no network, no GPU",
        f"env       {env['packages']} packages ({shown}), {same}",
        _side_line("against", against, times["against_cached"]),
        _side_line("fixed", wheel, False),
        f"summary   {report['line']}",
    ]
    table = report["tests"]
    for name in CHANGED:  # REGRESSED, ..., ONLY AGAINST
        rows += _group(name.replace("-", " ").upper(), [(t, r) for t, r in table.items() if r["class"] == name])
    failed_both = [(t, r) for t, r in table.items() if r["class"] == "same" and kind_of(r["fixed"]) == "fail"]
    rows += _group("FAILED BOTH (the upstream's own, on the release too)", failed_both)
    cached = f"cached, first run {times['against_first_run_s']:.1f} s" if times["against_cached"] else "ran"
    rows.append(
        f"time      checkout {times['checkout_s']:.1f} s, environments {times['environments_s']:.1f} s, against "
        f"{times['against_s']:.1f} s ({cached}), fixed {times['fixed_s']:.1f} s, total {times['total_s']:.1f} s"
    )
    rows.append(f"verdict   {report['verdict']}")
    rows.append(f"report    {path}")
    return rows


def _side_line(name: str, side: dict, cached: bool) -> str:
    passed, failed, skipped = suiterun.tally(side["counts"])
    imported = "; ".join(f"{m} from {o}" for m, o in side["imported"].items() if o) or "nothing of the wheel imported"
    return (
        f"{name:<9} {side['name']} ({side['sha256'][:19]}, {side['version']}): {passed} passed, {failed} failed, "
        f"{skipped} skipped in {side['seconds']:.1f} s{' (cached)' if cached else ''}; {imported}"
    )


def _group(title: str, rows: list[tuple[str, dict]]) -> list[str]:
    if not rows:
        return []
    shown = [f"{title} ({len(rows)}):"]
    for test, row in rows[:SHOWN]:
        message = f": {row['message'][:160]}" if row["message"] else ""
        shown.append(f"  {test}  {row['against']} -> {row['fixed']}{message}")
    if len(rows) > SHOWN:
        shown.append(f"  ... and {len(rows) - SHOWN} more in the report")
    return shown


# --- verify ---------------------------------------------------------------------------------------------------------


@record
class Expected:
    """What a report of this repository must say now (None: not compared): the selection digest, the patched tree
    and the precompiled pins (platform -> sha256 hex)."""

    selection: str | None = None
    tree: str | None = None
    pins: dict[str, str] | None = None


class SuiteReportCheck(ReportCheck):
    beside = "wheel"

    def described(self) -> list[str]:
        report = self.report
        return [
            f"  wheel {report['wheel']['name']}  {report['wheel']['sha256'][:19]}",
            f"  against {report['against']['name']}  {report['against']['sha256'][:19]}  "
            f"({report['against']['source']})",
            f"  {report['verdict']}: {report['line']}",
            f"  label: {label(report)}",
        ]


def read(path: Path) -> dict:
    data = read_json(path, "suite", f"`suite WHEEL` writes <wheel>{SUFFIX}")
    try:
        if data["kind"] != KIND or data["format"] != FORMAT:
            raise Failed(f"{path}: a report of kind {data['kind']!r} format {data['format']!r}, not {KIND} {FORMAT}")
        for key in ("wheel", "against", "summary", "selection", "upstream", "tests", "verdict", "line"):
            data[key]  # noqa: B018 - every field `check` and `lines` read
    except (KeyError, TypeError):
        raise Failed(f"{path}: not a carry suite report (fields missing)") from None
    return data


def check_report(path: Path, expected: Expected) -> SuiteReportCheck:
    """The report must sit beside the wheel it names, with that wheel's sha256; and say what this repository says now
    (the selection, the patched tree, the pin it was compared against), where known."""
    report = read(path)
    wheel = path.with_name(path.name.removesuffix(SUFFIX))
    mismatches = []
    if wheel.name != report["wheel"]["name"]:
        mismatches.append(f"wheel: the report names {report['wheel']['name']}, its file name says {wheel.name}")
    elif not wheel.is_file():
        mismatches.append(f"wheel: {wheel} is missing")
    elif (found := f"sha256:{file_sha256(wheel)}") != report["wheel"]["sha256"]:
        mismatches.append(f"sha256: report {report['wheel']['sha256']}, wheel beside it {found}")
    if expected.selection is not None and report["selection"]["digest"] != expected.selection:
        mismatches.append(
            f"selection: report {report['selection']['digest'][:19]}, build.upstream_tests now "
            f"{expected.selection[:19]}: run suite again"
        )
    if expected.tree is not None and report["upstream"]["tree"] != expected.tree:
        mismatches.append(
            f"patched tree: report {report['upstream']['tree'][:12]}, the series now {expected.tree[:12]}"
        )
    source = str(report["against"]["source"])
    if expected.pins is not None and source.startswith("build.precompiled.wheels."):
        pinned = expected.pins.get(source.removeprefix("build.precompiled.wheels."))
        if pinned is not None and report["against"]["sha256"] != f"sha256:{pinned}":
            mismatches.append(f"against: report {report['against']['sha256'][:19]}, {source} pins sha256:{pinned[:12]}")
    return SuiteReportCheck(str(path), report, tuple(mismatches))


def with_suite_report(wheel: Path, result: Verification, expected: Expected) -> Verification:
    """`verify` of a wheel: a suite report beside it must belong to it; say what it found."""
    path = report_path(wheel)
    if not path.exists():
        return result
    check = check_report(path, expected)
    note = f"suite report {path.name}: {check.report['verdict']}: {check.report['line']}"
    return check.added_to(result, "suite report", "a report of this wheel and selection", note)


def expected_of(config: Config, tree: str | None) -> Expected:
    tests = config.build.upstream_tests
    settings = config.build.precompiled
    pins = {str(w.platform): w.pinned.sha256 for w in settings.wheels} if settings else {}
    return Expected(selection_digest(tests) if tests else None, tree, pins)
