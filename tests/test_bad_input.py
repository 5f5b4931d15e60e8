"""A table of bad inputs, each run as a user would against a real upstream repo and a warm cache.

Every case must exit 2 with exactly one stderr line that names the problem (the needles), no traceback,
and leave every file of the project, the cache and the upstream as it was (paths, types and bytes).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import re
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from helpers import ROOT, Upstream, assert_bad_input, carry, write_config

BODY = "".join(f"value_{i} = {i}\n" for i in range(1, 81))
VALID_PATCH = "0001-one.patch"
SYMLINK_PATCH = """\
diff --git a/pkg/link b/pkg/link
new file mode 120000
index 0000000..1111111
--- /dev/null
+++ b/pkg/link
@@ -0,0 +1 @@
+{target}
\\ No newline at end of file
"""
BINARY_GIT_PATCH = """\
diff --git a/pkg/blob.bin b/pkg/blob.bin
new file mode 100644
index 0000000..e69de29
GIT binary patch
literal 3
KcmZ?wWMTjS01N;E

literal 0
HcmV?d00001

"""


@dataclasses.dataclass
class Ctx:
    """One case's world: a copy of the project and of the warm cache, and the shared upstream."""

    root: Path
    project: Path
    cache: Path
    upstream: Upstream
    env: dict[str, str]

    @property
    def config(self) -> Path:
        return self.project / "build.yaml"

    @property
    def patches(self) -> Path:
        return self.project / "patches"

    @property
    def patch(self) -> Path:
        return self.patches / VALID_PATCH

    def edit_config(self, old: str, new: str) -> None:
        text = self.config.read_text()
        assert old in text, (old, text)
        self.config.write_text(text.replace(old, new, 1))

    def set_url(self, url: str) -> None:
        self.edit_config(f"url: {self.upstream.path}\n", f"url: {url!r}\n")

    def append_config(self, text: str) -> None:
        self.config.write_text(self.config.read_text() + text)

    def edit_patch(self, old: str, new: str) -> None:
        text = self.patch.read_text()
        assert old in text, (old, text)
        self.patch.write_text(text.replace(old, new))


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    args: tuple[str, ...] | Callable[[Ctx], tuple[str, ...]]
    needles: tuple[str, ...]
    setup: Callable[[Ctx], None] | None = None
    fresh_cache: bool = False

    def argv(self, ctx: Ctx) -> tuple[str, ...]:
        return self.args(ctx) if callable(self.args) else self.args


def _write(name: str, data: str | bytes) -> Callable[[Ctx], None]:
    def setup(ctx: Ctx) -> None:
        target = ctx.patches / name
        if isinstance(data, bytes):
            target.write_bytes(data)
        else:
            target.write_text(data)

    return setup


def _replace_patch(data: str | bytes) -> Callable[[Ctx], None]:
    def setup(ctx: Ctx) -> None:
        ctx.patch.unlink()
        _write(VALID_PATCH, data)(ctx)

    return setup


def _edit_patch(old: str, new: str) -> Callable[[Ctx], None]:
    return lambda ctx: ctx.edit_patch(old, new)


def _config(old: str, new: str) -> Callable[[Ctx], None]:
    return lambda ctx: ctx.edit_config(old, new)


def _append(text: str) -> Callable[[Ctx], None]:
    return lambda ctx: ctx.append_config(text)


def _url(url: str | Callable[[Ctx], str]) -> Callable[[Ctx], None]:
    return lambda ctx: ctx.set_url(url(ctx) if callable(url) else url)


def _version(text: str | None) -> Callable[[Ctx], None]:
    def setup(ctx: Ctx) -> None:
        if text is None:
            (ctx.project / "VERSION").unlink()
        else:
            (ctx.project / "VERSION").write_text(text)

    return setup


def _cache_env(path: Callable[[Ctx], str]) -> Callable[[Ctx], None]:
    def setup(ctx: Ctx) -> None:
        ctx.env["CARRY_CACHE"] = path(ctx)

    return setup


def _path_with_only_git(ctx: Ctx) -> None:
    """PATH holds git and nothing else (no ccache)."""
    tools = ctx.root / "only-git"
    tools.mkdir()
    (tools / "git").symlink_to(shutil.which("git"))
    ctx.env["PATH"] = str(tools)


def _cache_under_file(ctx: Ctx) -> str:
    blocker = ctx.root / "not-a-dir"
    blocker.write_text("a regular file where the cache's parent should be\n")
    return str(blocker / "cache")


def _cache_is_file(ctx: Ctx) -> str:
    blocker = ctx.root / "cache-file"
    blocker.write_text("a regular file where the cache dir should be\n")
    return str(blocker)


def _truncate_hunk(ctx: Ctx) -> None:
    lines = ctx.patch.read_text().split("\n")
    hunk = next(i for i, line in enumerate(lines) if line.startswith("@@"))
    ctx.patch.write_text("\n".join(lines[: hunk + 3]) + "\n")


def _crlf(ctx: Ctx) -> None:
    ctx.patch.write_bytes(ctx.patch.read_bytes().replace(b"\n", b"\r\n"))


def _duplicate(ctx: Ctx) -> None:
    shutil.copy(ctx.patch, ctx.patches / "0001-two.patch")


def _patches_symlink(ctx: Ctx) -> None:
    (ctx.patches / "0002-elsewhere.patch").symlink_to(ctx.root / "outside.patch")
    shutil.copy(ctx.patch, ctx.root / "outside.patch")


def _patches_subdir(ctx: Ctx) -> None:
    (ctx.patches / "0002-dir.patch").mkdir()


def _trailer(line: str) -> Callable[[Ctx], None]:
    return _edit_patch("\n---\n", f"\n\n{line}\n---\n")


def _no_upstream_section(ctx: Ctx) -> None:
    ctx.config.write_text("patches:\n  dir: patches\n")


def _pwned(ctx: Ctx) -> Path:
    return ctx.root / "pwned"


def _gone(ctx: Ctx) -> str:
    return str(ctx.root / "no-such-upstream")


CASES: list[Case] = [
    # build.yaml
    Case("yaml_syntax_error", ("check",), ("YAML syntax error", "line"), _append("image: [unclosed\n")),
    Case("yaml_tab_indent", ("check",), ("YAML syntax error",), _append("build:\n\tenv: {}\n")),
    Case(
        "yaml_python_object_tag",
        ("check",),
        ("YAML syntax error",),
        _append("image: !!python/object/apply:os.system ['touch pwned']\n"),
    ),
    Case("yaml_not_a_mapping", ("check",), ("must be a mapping",), lambda ctx: ctx.config.write_text("- a\n- b\n")),
    Case("yaml_empty_file", ("check",), ("upstream section is required",), lambda ctx: ctx.config.write_text("")),
    Case("config_not_utf8", ("check",), ("cannot read config",), lambda ctx: ctx.config.write_bytes(b"\xff\xfe\x00x")),
    Case("config_missing", ("--config", "nope.yaml", "check"), ("config file not found", "--config")),
    Case("unknown_top_key", ("check",), ("unknown key colour", "allowed keys"), _append("colour: blue\n")),
    Case(
        "unknown_upstream_key",
        ("check",),
        ("unknown key upstream.brnach",),
        _config("  main: main\n", "  brnach: main\n"),
    ),
    Case(
        "upstream_is_a_list",
        ("check",),
        ("upstream must be a mapping",),
        lambda ctx: ctx.config.write_text("upstream: [a, b]\npatches:\n  dir: patches\n"),
    ),
    Case("missing_upstream", ("check",), ("upstream section is required",), _no_upstream_section),
    Case(
        "missing_url",
        ("check",),
        ("upstream.url is required",),
        lambda ctx: ctx.edit_config(f"  url: {ctx.upstream.path}\n", ""),
    ),
    Case(
        "missing_commit",
        ("check",),
        ("upstream.commit", "40-hex"),
        lambda ctx: ctx.edit_config(f"  commit: {ctx.upstream.head()}", "  # no commit"),
    ),
    Case(
        "short_sha",
        ("check",),
        ("upstream.commit", "40-hex"),
        lambda ctx: ctx.edit_config(ctx.upstream.head(), ctx.upstream.head()[:12]),
    ),
    Case(
        "non_hex_sha",
        ("check",),
        ("upstream.commit", "40-hex"),
        lambda ctx: ctx.edit_config(ctx.upstream.head(), "g" * 40),
    ),
    Case(
        "sha_as_number",
        ("check",),
        ("upstream.commit was read as the number", "all-digit SHA", "quote it"),
        lambda ctx: ctx.edit_config(ctx.upstream.head(), "1" * 40),
    ),
    Case("wrong_type_pr", ("check",), ("upstream.pr", "positive integer"), _config("  pr: 7\n", "  pr: seven\n")),
    Case("negative_pr", ("check",), ("upstream.pr", "positive integer"), _config("  pr: 7\n", "  pr: -7\n")),
    Case("zero_pr", ("check",), ("upstream.pr", "positive integer"), _config("  pr: 7\n", "  pr: 0\n")),
    Case("boolean_pr", ("check",), ("upstream.pr", "positive integer"), _config("  pr: 7\n", "  pr: true\n")),
    Case("empty_main", ("check",), ("upstream.main", "non-empty string"), _config("  main: main\n", "  main: ''\n")),
    Case(
        "url_ext_transport",
        ("fetch",),
        ("remote helper transport", "https"),
        lambda ctx: ctx.set_url(f"ext::sh -c touch% {_pwned(ctx)}"),
    ),
    Case(
        "url_ext_uppercase",
        ("fetch",),
        ("remote helper transport",),
        lambda ctx: ctx.set_url(f"EXT::sh -c touch% {_pwned(ctx)}"),
    ),
    Case("url_fd_transport", ("fetch",), ("remote helper transport",), _url("fd::3")),
    Case(
        "url_http_scheme", ("fetch",), ("scheme 'http' is not allowed", "https"), _url("http://example.invalid/x.git")
    ),
    Case("url_ftp_scheme", ("fetch",), ("scheme 'ftp' is not allowed",), _url("ftp://example.invalid/x.git")),
    Case(
        "url_option_injection",
        ("fetch",),
        ("starts with '-'",),
        lambda ctx: ctx.set_url(f"--upload-pack=touch {_pwned(ctx)}"),
    ),
    Case(
        "url_ssh_proxycommand_host",
        ("fetch",),
        ("cannot give commit", "no bundle"),
        lambda ctx: ctx.set_url(f"ssh://-oProxyCommand=touch%20{_pwned(ctx)}/x.git"),
        fresh_cache=True,
    ),
    Case(
        "url_is_a_list",
        ("check",),
        ("upstream.url", "non-empty string"),
        lambda ctx: ctx.edit_config(f"url: {ctx.upstream.path}\n", "url: [a]\n"),
    ),
    Case(
        "patches_dir_missing",
        ("check",),
        ("patches directory not found", "patches.dir"),
        _config("  dir: patches\n", "  dir: no-such-dir\n"),
    ),
    Case(
        "patches_dir_wrong_type",
        ("check",),
        ("patches.dir", "non-empty string"),
        _config("  dir: patches\n", "  dir: 3\n"),
    ),
    Case(
        "build_isolation_string",
        ("check",),
        ("build.build_isolation", "true or false"),
        _append("build:\n  build_isolation: 'yes'\n"),
    ),
    Case(
        "compiler_cache_unknown",
        ("check",),
        ("unknown compiler cache 'distcc'", "auto", "ccache"),
        _append("build:\n  compiler_cache: distcc\n"),
    ),
    Case(
        "upstream_tests_without_paths",
        ("check",),
        ("build.upstream_tests.paths is required", "tests/v1/core"),
        _append("build:\n  upstream_tests: {marker: cpu_test}\n"),
    ),
    Case(
        "upstream_tests_path_outside_the_tree",
        ("check",),
        ("build.upstream_tests.paths has '../tests'", "relative to the tree's root"),
        _append("build:\n  upstream_tests: {paths: [../tests]}\n"),
    ),
    Case(
        "upstream_tests_deselect_without_a_reason",
        ("check",),
        ("build.upstream_tests.deselect.tests/x.py::test_y needs a reason",),
        _append("build:\n  upstream_tests: {paths: [tests], deselect: {'tests/x.py::test_y': ''}}\n"),
    ),
    Case(
        "upstream_tests_unknown_key",
        ("check",),
        ("unknown key build.upstream_tests.markers", "marker"),
        _append("build:\n  upstream_tests: {paths: [tests], markers: cpu_test}\n"),
    ),
    Case(
        "remote_cache_unknown_scheme",
        ("check",),
        ("build.remote_cache", "unknown scheme 'memcached'", "redis://"),
        _append("build:\n  remote_cache: memcached://cache.example:11211\n"),
    ),
    Case(
        "remote_cache_with_password",
        ("check",),
        ("build.remote_cache", "must not hold credentials", "CARRY_REMOTE_CACHE_PASSWORD"),
        _append("build:\n  remote_cache: redis://:hunter2@cache.example:6379/0\n"),
    ),
    Case(
        "remote_cache_bad_db",
        ("check",),
        ("build.remote_cache", "database must be a number"),
        _append("build:\n  remote_cache: redis://cache.example:6379/zero\n"),
    ),
    Case(
        "remote_cache_s3_with_ccache",
        ("check",),
        ("ccache cannot use s3", "sccache"),
        _append("build:\n  compiler_cache: ccache\n  remote_cache: s3://bucket/carry\n"),
    ),
    Case(
        "remote_cache_without_launcher",
        ("check",),
        ("needs a compiler cache", "compiler_cache"),
        _append("build:\n  compiler_cache: none\n  remote_cache: redis://cache.example\n"),
    ),
    Case(
        "remote_cache_env_unknown_scheme",
        ("wheel", "--arch", "9.0"),
        ("$CARRY_REMOTE_CACHE_URL", "unknown scheme"),
        lambda ctx: ctx.env.update(CARRY_REMOTE_CACHE_URL="gopher://cache.example"),
    ),
    *(
        Case(f"distributed_{name}", ("check",), needles, _append(f"build:\n{yaml}\n"))
        for name, needles, yaml in (
            ("not_http", ("scheduler_url", "not an http(s) URL"), "  distributed: {scheduler_url: 'ftp://s.example'}"),
            (
                "with_credentials",
                ("build.distributed.scheduler_url", "must not hold credentials", "CARRY_DIST_TOKEN"),
                "  distributed: {scheduler_url: 'http://u:hunter2@sched.example'}",
            ),
            (
                "with_ccache",
                ("build.distributed", "needs sccache"),
                "  compiler_cache: ccache\n  distributed: {scheduler_url: 'http://sched.example:10600'}",
            ),
            (
                "token_in_config",
                ("unknown key build.distributed.token",),
                "  distributed: {scheduler_url: 'http://sched.example', token: x}",
            ),
        )
    ),
    Case(
        "distributed_env_not_http",
        ("wheel", "--arch", "9.0"),
        ("$CARRY_DIST_SCHEDULER_URL", "not an http(s) URL"),
        lambda ctx: ctx.env.update(CARRY_DIST_SCHEDULER_URL="redis://sched.example"),
    ),
    Case(
        "distributed_token_file_missing",
        ("wheel", "--arch", "9.0"),
        ("$CARRY_DIST_TOKEN_FILE", "cannot read it"),
        lambda ctx: (
            ctx.append_config(
                "build:\n  compiler_cache: sccache\n  distributed: {scheduler_url: 'http://127.0.0.1:9'}\n"
            ),
            ctx.env.update(CARRY_DIST_TOKEN_FILE="/nonexistent/carry-dist-token"),
        ),
    ),
    Case(
        "compiler_cache_missing",
        ("wheel", "--arch", "9.0"),
        ("build.compiler_cache is ccache", "not on PATH"),
        lambda ctx: (ctx.append_config("build:\n  compiler_cache: ccache\n"), _path_with_only_git(ctx)),
    ),
    Case("build_env_bad_name", ("check",), ("build.env", "invalid name"), _append("build:\n  env: {'1BAD': x}\n")),
    Case(
        "build_env_nested_value", ("check",), ("build.env.A", "string or number"), _append("build:\n  env: {A: [1]}\n")
    ),
    Case(
        "wheel_version_without_field",
        ("check",),
        ("build.wheel_version", "{version}"),
        _append("build:\n  wheel_version: '1.0'\n"),
    ),
    Case(
        "wheel_version_unknown_field",
        ("check",),
        ("build.wheel_version", "PEP 440"),
        _append("build:\n  wheel_version: '0.1+carry.{version}.{build}'\n"),
    ),
    Case(
        "wheel_version_unbalanced_brace",
        ("check",),
        ("build.wheel_version", "PEP 440"),
        _append("build:\n  wheel_version: '0.1+carry.{version}{'\n"),
    ),
    Case(
        "wheel_version_no_local_label",
        ("check",),
        ("build.wheel_version", "PEP 440"),
        _append("build:\n  wheel_version: '{version}'\n"),
    ),
    Case(
        "wheel_version_not_pep440",
        ("wheel", "--arch", "9.0"),
        ("build.wheel_version", "PEP 440"),
        _append("build:\n  wheel_version: 'not a version {version}'\n"),
    ),
    Case(
        "cuda_arches_config_9_1", ("check",), ("'9.1'", "compute capability"), _append("build:\n  cuda_arches: '9.1'\n")
    ),
    Case("cuda_arches_wrong_type", ("check",), ("build.cuda_arches",), _append("build:\n  cuda_arches: {a: b}\n")),
    Case(  # build.gate is read where the gate policy is made (binaries.gatepolicy.for_config), before any build
        "gate_rule_without_why",
        ("wheel", "--arch", "9.0"),
        ("build.gate[0].why is required",),
        _append("build:\n  gate: [{match: 'pkg/x.so', gpus: '9.0'}]\n"),
    ),
    Case(
        "platforms_bad",
        ("check",),
        ("image.platforms", "unknown platform", "linux/arm64"),
        _append("image:\n  platforms: [amd64]\n"),
    ),
    Case(
        "platform_key_bad",
        ("check",),
        ("image.platforms.linux/arm64", "cuda_arches"),
        _append('image:\n  platforms:\n    linux/arm64: {arches: "12.1"}\n'),
    ),
    Case(
        "tests_not_a_list",
        ("check",),
        ("build.tests", "list of commands"),
        _append("build:\n  tests: python -m pkg.repro\n"),
    ),
    Case(
        "tests_unbalanced_quote",
        ("check",),
        ("build.tests[1]", "does not parse", "close the quote"),
        _append("build:\n  tests: [ok, 'python -c \"print(1)']\n"),
    ),
    Case("tests_empty_command", ("check",), ("build.tests[0] is empty",), _append("build:\n  tests: ['  ']\n")),
    Case("tests_empty_argv", ("check",), ("build.tests[0] is empty",), _append("build:\n  tests: [[]]\n")),
    Case(
        "tests_mapping_unknown_key",
        ("check",),
        ("build.tests[0]", "unknown key 'command'", "run, gpu, against"),
        _append("build:\n  tests: [{command: x}]\n"),
    ),
    Case(
        "tests_mapping_without_run",
        ("check",),
        ("build.tests[0] needs run",),
        _append("build:\n  tests: [{gpu: false}]\n"),
    ),
    Case(
        "tests_mapping_gpu_not_bool",
        ("check",),
        ("build.tests[0].gpu must be true or false",),
        _append("build:\n  tests: [{run: x, gpu: maybe}]\n"),
    ),
    Case(
        "tests_mapping_against",
        ("check",),
        ("build.tests[0].against must be wheel", "tree"),
        _append("build:\n  tests: [{run: x, against: image}]\n"),
    ),
    Case(
        "tests_mapping_run_number",
        ("check",),
        ("build.tests[0].run", "string or a list of strings"),
        _append("build:\n  tests: [{run: 3}]\n"),
    ),
    Case(
        "tests_list_with_number",
        ("check",),
        ("build.tests[0]", "string or a list of strings"),
        _append("build:\n  tests: [[python, 3]]\n"),
    ),
    # image names and tag templates in build.yaml, and image flags
    Case(
        "image_name_uppercase",
        ("image",),
        ("image.name 'Carry-Demo'", "lowercase"),
        _append("image:\n  name: Carry-Demo\n"),
    ),
    Case("attest_unknown", ("image", "--attest", "spdx"), ("--attest 'spdx'", "sbom, provenance")),
    Case("require_unknown", ("verify", "127.0.0.1:9/x:1", "--require", "spdx"), ("--require 'spdx'", "suite")),
    Case("require_without_key", ("verify", "127.0.0.1:9/x:1", "--require", "suite"), ("--require", "--key PUB")),
    Case("image_name_space", ("image",), ("image.name", "lowercase"), _append("image:\n  name: carry demo\n")),
    Case("image_name_trailing_slash", ("image",), ("image.name",), _append("image:\n  name: 'registry:5000/'\n")),
    Case(
        "tag_unknown_field",
        ("image",),
        ("unknown field {unknown}", "{version}"),
        _append("image:\n  tags: ['{unknown}']\n"),
    ),
    Case("tag_positional_field", ("image",), ("unknown field {}",), _append("image:\n  tags: ['v{}']\n")),
    Case("tag_format_spec", ("image",), ("unknown field",), _append("image:\n  tags: ['{version:>300}']\n")),
    Case("tag_unbalanced_brace", ("image",), ("image.tags", "{version"), _append("image:\n  tags: ['{version']\n")),
    Case("tag_stray_closing_brace", ("image",), ("image.tags",), _append("image:\n  tags: ['v}']\n")),
    Case(
        "tag_with_space", ("image",), ("does not render to a valid tag",), _append("image:\n  tags: ['{version} x']\n")
    ),
    Case(
        "tag_too_long", ("image",), ("does not render to a valid tag",), _append(f"image:\n  tags: ['{'x' * 129}']\n")
    ),
    Case("cli_tag_with_space", ("image", "--tag", "bad tag"), ("--tag 'bad tag'", "letters")),
    Case("cli_tag_leading_dash", ("image", "--tag", "-x"), ("--tag '-x'",)),
    Case(
        "cli_platform_bad", ("image", "--platform", "linux"), ("--platform", "unknown platform 'linux'", "linux/arm64")
    ),
    # VERSION (read by wheel, image, verify and version bump)
    Case("version_bad_date", ("version", "bump"), ("VERSION", "not a real date"), _version("20260230.1\n")),
    Case("version_n_zero", ("version", "bump"), ("VERSION", "YYYYMMDD.N"), _version("20260101.0\n")),
    Case("version_trailing_junk", ("version",), ("VERSION", "YYYYMMDD.N"), _version("20260101.1 junk\n")),
    Case("version_future", ("version", "bump"), ("VERSION", "after today"), _version("20991231.1\n")),
    Case("version_empty", ("version",), ("VERSION", "YYYYMMDD.N"), _version("")),
    Case("version_two_lines", ("version", "bump"), ("VERSION", "YYYYMMDD.N"), _version("20260101.1\n20260101.2\n")),
    Case("version_dashed", ("wheel", "--arch", "9.0"), ("VERSION", "YYYYMMDD.N"), _version("2026-01-01.1\n")),
    Case("version_blank_second_line", ("wheel", "--arch", "9.0"), ("VERSION",), _version("20260101.1\n\n")),
    Case("version_missing", ("wheel", "--arch", "9.0"), ("VERSION", "version bump"), _version(None)),
    Case(
        "version_is_a_directory",
        ("version",),
        ("VERSION", "cannot read"),
        lambda ctx: (_version(None)(ctx), (ctx.project / "VERSION").mkdir()),
    ),
    # patches
    Case("patch_empty", ("check",), ("empty patch",), _replace_patch("")),
    Case("patch_binary_bytes", ("check",), ("not UTF-8", "binary"), _replace_patch(bytes(range(256)) * 4)),
    Case("patch_git_binary", ("check",), ("binary patch", "pkg/blob.bin"), _write("0002-blob.patch", BINARY_GIT_PATCH)),
    Case("patch_duplicate_number", ("check",), ("duplicate patch number 0001", "renumber"), _duplicate),
    Case("patch_dotdot_path", ("check",), ("leaves the tree",), _edit_patch("/pkg/core.py", "/../core.py")),
    Case(
        "patch_deep_dotdot_path", ("check",), ("leaves the tree",), _edit_patch("/pkg/core.py", "/pkg/../../x/core.py")
    ),
    Case(
        "patch_quoted_dotdot_path",
        ("check",),
        ("leaves the tree",),
        _edit_patch("a/pkg/core.py", '"a/\\056\\056/core.py"'),
    ),
    Case(
        "patch_absolute_path",
        ("check",),
        ("absolute path '/etc/passwd'",),
        _edit_patch("--- a/pkg/core.py", "--- /etc/passwd"),
    ),
    Case(
        "patch_rename_out_of_tree",
        ("check",),
        ("leaves the tree",),
        _edit_patch("index ", "rename from pkg/core.py\nrename to ../evil.py\nindex "),
    ),
    Case("patch_into_dot_git", ("check",), ("inside .git",), _edit_patch("pkg/core.py", ".git/hooks/post-checkout")),
    Case("patch_into_dot_git_uppercase", ("check",), ("inside .git",), _edit_patch("pkg/core.py", ".GIT/config")),
    Case(
        "patch_symlink_outside",
        ("check",),
        ("points outside the tree",),
        _write("0002-link.patch", SYMLINK_PATCH.format(target="../../etc/passwd")),
    ),
    Case(
        "patch_symlink_absolute",
        ("check",),
        ("points outside the tree",),
        _write("0002-link.patch", SYMLINK_PATCH.format(target="/etc/passwd")),
    ),
    Case("patch_crlf_mangled", ("check",), ("CRLF", "dos2unix"), _crlf),
    Case("patch_truncated_hunk", ("check",), ("truncated hunk", "regenerate"), _truncate_hunk),
    Case(
        "patch_malformed_hunk_header",
        ("check",),
        ("malformed hunk header",),
        lambda ctx: ctx.patch.write_text(ctx.patch.read_text().replace("@@ -", "@@ -x", 1)),
    ),
    Case("patch_not_a_patch", ("check",), ("empty patch",), _replace_patch("Dear maintainer,\nplease merge.\n")),
    Case(
        "patches_dir_has_other_file",
        ("check",),
        ("notes.txt: not a patch", "move it out"),
        _write("notes.txt", "todo\n"),
    ),
    Case("patch_bad_name", ("check",), ("1-short.patch: not a patch",), _write("1-short.patch", "x\n")),
    Case("patches_dir_symlink_entry", ("check",), ("0002-elsewhere.patch: not a patch",), _patches_symlink),
    Case("patches_dir_subdir", ("check",), ("0002-dir.patch: not a patch",), _patches_subdir),
    Case(
        "patch_bad_upstream_status",
        ("check",),
        ("Upstream-Status 'Maybe'", "Pending"),
        _trailer("Upstream-Status: Maybe"),
    ),
    Case("patch_bad_forwarded", ("check",), ("Forwarded 'perhaps'", "URL"), _trailer("Forwarded: perhaps")),
    # arch strings
    Case("arch_9_1", ("wheel", "--arch", "9.1"), ("'9.1'", "compute capability")),
    Case("arch_sm_12", ("wheel", "--arch", "sm_12"), ("'sm_12'",)),
    Case("arch_double_ptx", ("wheel", "--arch", "12.1+ptx+ptx"), ("'12.1+ptx+ptx'",)),
    Case("arch_compute_only_prefix", ("wheel", "--arch", "compute_"), ("'compute_'",)),
    Case("arch_a_before_hopper", ("wheel", "--arch", "8.0a"), ("'8.0a'", "no 'a' variant")),
    Case("arch_empty", ("wheel", "--arch", ""), ("--arch is empty", "--arch none")),
    Case("arch_none_with_others", ("wheel", "--arch", "none,9.0"), ("'none'", "cannot be combined")),
    Case("arch_not_set", ("wheel",), ("build.cuda_arches is not set", "[] for a Python-only wheel")),
    Case("arch_image", ("image", "--arch", "12.1x"), ("'12.1x'",)),
    Case("jobs_zero", ("wheel", "--arch", "9.0", "--jobs", "0"), ("--jobs",)),
    Case("unknown_option", ("check", "--frobnicate"), ("--frobnicate",)),
    # refs and upstreams
    Case("check_against_unknown_branch", ("check", "--against", "no-such-branch"), ("unknown ref 'no-such-branch'",)),
    Case("check_against_unknown_sha", ("check", "--against", "f" * 40), ("unknown ref",)),
    Case("drop_unknown_patch", ("drop", "0042"), ("no patch named '0042'", "0001-one.patch")),
    Case(
        "unreachable_upstream_fetch",
        ("fetch",),
        ("cannot give commit", "does not appear to be a git repository)", "no bundle"),
        _url(_gone),
        fresh_cache=True,
    ),
    Case(
        "verify_missing_wheel", ("verify", "dist/nope-1.0-py3-none-any.whl"), ("no such wheel file", "wheel` printed")
    ),
    Case("unreachable_upstream_check", ("check",), ("cannot give commit", "no bundle"), _url(_gone), fresh_cache=True),
    Case(
        "unreachable_git_port",
        ("fetch",),
        ("cannot give commit", "no bundle"),
        _url("git://127.0.0.1:1/x.git"),
        fresh_cache=True,
    ),
    Case(
        "unreachable_https_port",
        ("fetch",),
        ("cannot give commit", "no bundle"),
        _url("https://127.0.0.1:1/x.git"),
        fresh_cache=True,
    ),
    # cache dirs that cannot be written, even by root
    Case("cache_under_dev_null", ("check",), ("cache dir", "CARRY_CACHE"), _cache_env(lambda ctx: "/dev/null/carry")),
    Case("cache_parent_is_file", ("fetch",), ("cache dir", "CARRY_CACHE"), _cache_env(_cache_under_file)),
    Case("cache_is_a_file", ("check",), ("cache dir", "CARRY_CACHE"), _cache_env(_cache_is_file)),
    Case("cache_in_proc", ("fetch",), ("cache dir", "CARRY_CACHE"), _cache_env(lambda ctx: "/proc/carry-cache")),
]


def snapshot(*roots: Path) -> dict[str, str]:
    """Every entry under the roots: path -> kind and content hash (files), target (links) or 'dir'."""
    state: dict[str, str] = {}
    for root in roots:
        if not root.exists():
            state[str(root)] = "absent"
            continue
        for directory, dirs, files in os.walk(root):
            for name in dirs:
                path = Path(directory, name)
                state[str(path)] = f"link {os.readlink(path)}" if path.is_symlink() else "dir"
            for name in files:
                path = Path(directory, name)
                if path.is_symlink():
                    state[str(path)] = f"link {os.readlink(path)}"
                else:
                    state[str(path)] = "file " + hashlib.sha256(path.read_bytes()).hexdigest()
    return state


def changes(before: dict[str, str], after: dict[str, str]) -> list[str]:
    keys = sorted(before.keys() | after.keys())
    return [
        f"{key}: {before.get(key, 'absent')} -> {after.get(key, 'absent')}"
        for key in keys
        if before.get(key) != after.get(key)
    ]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """An upstream with a PR ref, a project with one clean patch, and a cache warmed by fetch and check."""
    base = tmp_path_factory.mktemp("badinput")
    upstream = Upstream.create(base / "upstream", {"pkg/core.py": BODY, "README": "demo\n"})
    upstream.publish_pr(7, upstream.head())
    project = base / "proj"
    config = write_config(project, str(upstream.path), upstream.head(), pr=7)
    (project / "VERSION").write_text("20260101.1\n")
    upstream.make_patch(
        project / "patches" / VALID_PATCH,
        "Change value 10",
        {"pkg/core.py": BODY.replace("value_10 = 10\n", "value_10 = 100\n")},
        trailers="Upstream-Status: Pending",
    )
    env = {"CARRY_CACHE": str(base / "cache")}
    for command in (("fetch",), ("check",)):
        result = carry("--config", str(config), *command, env=env)
        assert result.code == 0, result.err
    return upstream, project, base / "cache"


@pytest.fixture
def ctx(world, tmp_path) -> Ctx:
    upstream, project, cache = world
    root = tmp_path / "case"
    root.mkdir()
    shutil.copytree(project, root / "proj", symlinks=True)
    shutil.copytree(cache, root / "cache", symlinks=True)
    return Ctx(root, root / "proj", root / "cache", upstream, {"CARRY_CACHE": str(root / "cache")})


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_bad_input_exits_2_with_one_line_and_changes_nothing(case: Case, ctx: Ctx):
    if case.fresh_cache:
        shutil.rmtree(ctx.cache)
    if case.setup is not None:
        case.setup(ctx)
    watched = (ctx.root, ctx.upstream.path)
    before = snapshot(*watched)
    result = carry(*case.argv(ctx), cwd=ctx.project, env=ctx.env, timeout=120)
    assert_bad_input(result, *case.needles)
    assert result.out == "", result.out
    assert changes(before, snapshot(*watched)) == []
    assert not _pwned(ctx).exists(), "a URL ran a command"


def test_the_table_is_big_enough():
    assert len(CASES) >= 40
    assert len({case.name for case in CASES}) == len(CASES)


@contextlib.contextmanager
def read_only(path: Path) -> Iterator[str]:
    """Make `path` read-only for root too: a read-only bind mount, else the immutable attribute."""
    attempts = (
        (["mount", "--bind", "-o", "ro", str(path), str(path)], ["umount", str(path)]),
        (["chattr", "-R", "+i", str(path)], ["chattr", "-R", "-i", str(path)]),
    )
    for make, undo in attempts:
        if shutil.which(make[0]) and subprocess.run(make, capture_output=True).returncode == 0:
            probe = path / ".carry-write-probe"
            try:
                probe.write_text("x")
            except OSError:
                try:
                    yield make[0]
                finally:
                    subprocess.run(undo, check=True, capture_output=True)
                return
            probe.unlink()
            subprocess.run(undo, check=True, capture_output=True)
    pytest.skip("neither a read-only bind mount nor chattr +i works here")


@pytest.mark.parametrize(
    "command",
    [
        ("fetch",),
        ("check",),
        ("check", "--against", "main"),
        ("wheel", "--arch", "9.0"),
    ],
)
def test_read_only_warm_cache_is_bad_input(ctx: Ctx, command: tuple[str, ...]):
    """A cache that exists and holds the mirror, but cannot be written (not even by root)."""
    before = snapshot(ctx.root, ctx.upstream.path)
    with read_only(ctx.cache):
        result = carry(*command, cwd=ctx.project, env=ctx.env, timeout=120)
    assert_bad_input(result, "cache dir", "writable")
    assert changes(before, snapshot(ctx.root, ctx.upstream.path)) == []


@pytest.mark.parametrize(
    "url",
    [
        "https://git.example/org/repo.git",
        "ssh://git@git.example:2222/org/repo.git",
        "git://git.example/repo.git",
        "file:///srv/repo.git",
        "git@git.example:org/repo.git",
        "upstream.bundle",
        "../mirror/repo.git",
    ],
)
def test_allowed_upstream_sources_load(tmp_path, url):
    from carry.config import load

    config = write_config(tmp_path, url, "a" * 40)
    loaded = load(config).upstream.url
    if "://" in url or "@" in url:
        assert loaded == url
    else:
        assert loaded == str((tmp_path / url).resolve())


def test_git_itself_refuses_helper_transports(tmp_path):
    """The second line of defence: carry's git environment allows only https, ssh, git and file."""
    from carry.source import git

    mirror = tmp_path / "mirror.git"
    git.init_bare(mirror)
    pwned = tmp_path / "pwned"
    for url in (f"ext::sh -c touch% {pwned}", "fd::0"):
        with pytest.raises(git.GitError, match="transport"):
            git.fetch(mirror, url, "main")
    assert not pwned.exists()


def test_yaml_is_only_read_safely():
    """build.yaml is loaded with a safe loader (libyaml's where PyYAML has it); the pin rewrite only composes nodes,
    which constructs no objects; the build stage's copy of it is written with the safe dumper."""
    import yaml

    from carry import config

    calls, loads = set(), []
    for path in (ROOT / "carry").rglob("*.py"):
        text = path.read_text()
        calls |= set(re.findall(r"\byaml\.(\w+)\(", text))
        loads += re.findall(r"\byaml\.load\(([^)]*)\)", text)
    assert calls <= {"safe_load", "compose", "load", "safe_dump"}, calls
    assert loads and all(args.endswith("Loader=SAFE_LOADER") for args in loads), loads
    assert config.SAFE_LOADER in (yaml.SafeLoader, getattr(yaml, "CSafeLoader", None))
