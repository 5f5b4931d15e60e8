"""The record a locked image leaves beside it in the registry (carry/image/locked/registrycache.py) and the light
smoke test's static checks (carry/image/locked/smoketest.py), without a registry: what a layer's facts say, the
record's bytes, which refs are looked at, which imports a module runs when it is imported."""

from __future__ import annotations

from carry.image.locked import registrycache, smoketest
from carry.image.locked.ocilayer import Item

SITE = "opt/venv/lib/python3.11/site-packages"


def test_a_layers_facts_name_its_modules_and_what_its_whiteouts_remove():
    items = (
        Item(f"{SITE}/vllm", "dir", 0o755),
        Item(f"{SITE}/vllm/__init__.py", "file"),
        Item(f"{SITE}/vllm/logger.py", "file"),
        Item(f"{SITE}/vllm/_C.abi3.so", "file"),
        Item(f"{SITE}/vllm/data.json", "file"),
        Item(f"{SITE}/vllm-0.33.0.dist-info", "whiteout"),
        Item(f"{SITE}/vllm/old.py", "whiteout"),
        Item("opt/venv/bin/vllm", "file"),
    )
    facts = registrycache.facts_of(items, SITE, (("idna", "idna-3.10-py3-none-any.whl", "ab" * 32),))
    assert facts.modules == ("vllm", "vllm._C", "vllm.logger")
    assert facts.removed == ("vllm.old",)
    again = registrycache.Facts.from_blob(facts.blob())
    assert again == facts and facts.blob() == registrycache.Facts.from_blob(facts.blob()).blob()  # deterministic


def test_whiteouts_remove_a_module_and_its_submodules_from_the_image():
    below = registrycache.Facts(("vllm", "vllm.old", "vllm.old.x", "vllm.older"))
    above = registrycache.Facts(("vllm.new",), ("vllm.old",))
    assert smoketest.image_modules([below, above]) == {"vllm", "vllm.older", "vllm.new"}


def test_the_record_reads_back_and_refuses_another_format():
    entry = registrycache.Entry("deps", "k" * 64, "sha256:" + "1" * 64, "sha256:" + "2" * 64, 10, 20, 30, 4, "")
    record = registrycache.Record("sha256:" + "3" * 64, "linux/amd64", (entry,), smoke={"how": "full"})
    assert registrycache.Record.from_bytes(record.to_bytes()) == record
    import json

    body = json.loads(record.to_bytes())
    body["format"] = 99
    try:
        registrycache.Record.from_bytes(json.dumps(body).encode())
    except ValueError as exc:
        assert "format 99" in str(exc)
    else:
        raise AssertionError("a record of another format was read")


def test_the_refs_looked_at_are_full_and_each_once():
    name = "127.0.0.1:5055/you/vllm"
    refs = ("20261201.2-amd64", "20261201.2", "latest", "latest", "127.0.0.1:5055/other/vllm:base")
    assert registrycache.candidates(refs, name) == (
        f"{name}:20261201.2-amd64",
        f"{name}:20261201.2",
        f"{name}:latest",
        "127.0.0.1:5055/other/vllm:base",
    )
    assert registrycache.cache_tag("sha256:" + "a" * 64) == "sha256-" + "a" * 64 + ".cache"


def test_the_imports_a_module_runs_when_it_is_imported():
    source = b"""
from __future__ import annotations
import os, json
from typing import TYPE_CHECKING
from . import envs
from .utils import helper
if TYPE_CHECKING:
    import torch
try:
    import optional_thing
except ImportError:
    optional_thing = None
class Config:
    import dataclasses
def later():
    import transformers
with open(__file__):
    import re
"""
    found = smoketest.top_level_imports(source, "vllm/logger.py")
    assert found == ["os", "json", "typing", "vllm", "vllm.utils", "dataclasses", "re"]
    assert smoketest.top_level_imports(b"from .. import x\n", "vllm/a/b.py") == ["vllm"]
    assert smoketest.top_level_imports(b"from . import x\n", "vllm/a/__init__.py") == ["vllm.a"]
