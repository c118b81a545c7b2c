"""The resources' declarations (reconcile/resources/<kind>.py) hold together: what a row reads is
declared, what it depends on comes before it, and a planner's item carries its row's name whatever
the planner wrote (the planner wrapper stamps it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from reconcile.plan import planner
from reconcile.plan.records import Action, Change, Ok
from reconcile.resources import BY_PROBE, PROBE_NAMES, TABLE, Observed
from reconcile.resources.common import Kind, change, ok
from reconcile.spec.loader import load_spec

ROOT = Path(__file__).resolve().parent.parent


def test_names_are_unique_and_every_probe_is_read() -> None:
    assert len({k.name for k in TABLE}) == len(TABLE)
    assert len(set(PROBE_NAMES)) == len(PROBE_NAMES)
    assert all(p in BY_PROBE for k in TABLE for p in k.probes)
    assert {p for k in TABLE for p in k.probes} == set(PROBE_NAMES)
    assert [k.name for k in TABLE if k.serves] == ["server"]


MACHINES = sorted(p for p in (ROOT / "specs").glob("*.toml") if p.name != "base.toml")


@pytest.mark.parametrize("spec", MACHINES, ids=lambda p: p.name)
def test_dependencies_come_before_what_needs_them(spec: Path) -> None:
    loaded = load_spec(str(spec))
    order = [k.name for k in TABLE]
    for k in TABLE:
        for dep in k.depends_on(loaded.spec):
            assert order.index(dep) < order.index(k.name), (k.name, dep)


def test_the_wrapper_stamps_the_rows_name_on_what_its_planner_returns(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    spec = load_spec(str(ROOT / "specs" / "cpu-demo.toml")).spec
    mislabelled = Change("not-me", Action.CHANGE, "s", "r")
    rows = (
        Kind("first", "machine", (), lambda s, o: ok("fine"), None),
        Kind("second", "machine", (), lambda s, o: mislabelled, None, lambda s: ("first",)),
        Kind("third", "machine", (), lambda s, o: change(Action.CREATE, "s", "r"), None),
    )
    monkeypatch.setattr(planner, "TABLE", rows)
    items = planner.plan_items(spec, Observed())
    assert [(type(i), i.resource) for i in items] == [(Ok, "first"), (Change, "second"), (Change, "third")]
    assert items[1].depends_on == ("first",)  # type: ignore[union-attr]


def test_observed_holds_the_declared_probes_only() -> None:
    assert Observed().venv is None and Observed()._fields == PROBE_NAMES
    assert Observed(venv=1) == Observed(venv=1) != Observed()
    with pytest.raises(TypeError, match="unknown probe"):
        Observed(nvlink=1)
    with pytest.raises(AttributeError):
        Observed().nvlink  # noqa: B018
