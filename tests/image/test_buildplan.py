"""A plan carries its facts: the runtime contract and the layering are decided once, by `BuildPlan.make`; the manifest
and the render read them from the plan and never ask the rules again; the base rule is one function."""

from __future__ import annotations

import pytest

from imagekit.compat import contract, rules
from imagekit.errors import UsageError
from imagekit.image import layering, render
from imagekit.image.buildplan import BaseRef, BuildPlan, base_for, bootstrap_base, manifest
from imagekit.image.image_options import ImageOptions
from imagekit.model import ARM64, Cell
from imagekit.services.locks.lock_cells import read_lock
from tests.conftest import ROOT

CELL = Cell("12.4", "2.5.1", "4.48.2", "3.11", ("accelerate==1.2.1",))


def _plan(data, **kw) -> BuildPlan:
    lock = read_lock(ROOT / "lockfiles" / f"{CELL.id}.txt")
    return BuildPlan.make(CELL, lock, bootstrap_base(data.bases["3.11"]), "r.example.com/x", data, **kw)


def test_the_plan_decides_its_contract_and_layering_once_and_the_manifest_reads_them(data):
    plan = _plan(data)
    assert plan.contract == contract.of_cell(CELL, data)
    assert plan.layering == layering.split(plan.lock)
    facts = manifest(plan)
    assert facts["runtime"] == plan.contract.to_json()
    assert facts["torch"]["archs"] == list(plan.contract.sass) and facts["torch"]["ptx"] == plan.contract.ptx
    floor = rules.driver_floor(data, CELL.cuda)
    assert facts["driver"] == {"minimum": floor.minimum, "full_feature": floor.full}
    assert facts["layers"] == plan.layering.to_json()


def test_the_render_takes_the_plan_alone_and_asks_the_rules_nothing(data, monkeypatch):
    plan = _plan(data)
    expected = render.render_plan(plan)

    def asked(*_args, **_kw):
        raise AssertionError("the render asked again what the plan decided")

    for module, name in ((rules, "supported_archs"), (rules, "driver_floor"), (layering, "split")):
        monkeypatch.setattr(module, name, asked)
    monkeypatch.setattr(contract, "of_cell", asked)
    assert render.render_plan(plan) == expected


def test_the_template_sees_the_plans_image_options(data, monkeypatch):
    """A new `[image]` key reaches the Dockerfile through `options` (no new argument to the render)."""
    options = ImageOptions(command=("python", "/opt/app/train.py"), builder="buildkit")
    plan = _plan(data, options=options)
    seen: dict = {}

    class Template:
        def render(self, **values: object) -> str:
            seen.update(values)
            return ""

    class Environment:
        def get_template(self, name: str) -> Template:
            assert name == "Dockerfile.j2"
            return Template()

    monkeypatch.setattr(render, "environment", Environment)
    render.render_plan(plan)
    assert seen["options"] is options and seen["builder"] == "buildkit"


def test_the_base_rule_is_the_registry_base_for_the_python_else_a_bootstrapped_one(data):
    registry = BaseRef("py", "r.example.com/py@sha256:" + "a" * 64, "sha256:" + "a" * 64, "3.11", "2.36", registry=True)
    bases = {"3.11": registry}
    assert base_for("3.11", data, bases, ImageOptions()) == registry
    assert base_for("3.11", data, bases, ImageOptions(), platform=ARM64).platform == ARM64  # pulled for the platform
    own = base_for("3.12", data, bases, ImageOptions(compiler=False), epoch=1)
    assert own == bootstrap_base(data.bases["3.12"], 1, compiler=False) and not own.registry
    with pytest.raises(UsageError) as exc:
        base_for("2.7", data, {}, ImageOptions())
    assert "no base image known for Python 2.7" in exc.value.message and "3.11" in exc.value.hint
