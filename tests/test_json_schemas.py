"""Every JSON output against its schema in schemas/: `plan --json`, `apply --json` (converging, refused by
a preflight rule, a bad spec), last-run.json, and `schema --json` against the specs in specs/. The outputs
are real ones, from the CLI run on copies of the demo spec and on the reference spec."""

from __future__ import annotations

import importlib
import json
import pkgutil
import subprocess
import sys
from typing import Any

import jsonschema
import tomlkit
from referencing import Registry, Resource

import probes
from reconcile.plan.jsondata import TYPE_TAGS
from reconcile.record import Record
from tests.apply_support import REPO, Demo

SCHEMAS = REPO / "schemas"


def _registry() -> Registry:
    resources = []
    for path in SCHEMAS.glob("*.schema.json"):
        schema = json.loads(path.read_text())
        jsonschema.Draft202012Validator.check_schema(schema)
        resources.append((path.name, Resource.from_contents(schema)))
    return Registry().with_resources(resources)


def check(name: str, document: Any) -> None:
    """Validate against schemas/<name>.schema.json; on failure, every error with its path."""
    schema = json.loads((SCHEMAS / f"{name}.schema.json").read_text())
    validator = jsonschema.Draft202012Validator(schema, registry=_registry())
    errors = [f"{list(e.absolute_path)}: {e.message[:300]}" for e in validator.iter_errors(document)]
    assert not errors, "\n".join(errors)


def _quick(doc: Any) -> None:
    for section in ("venv", "server"):
        del doc[section]


def test_plan_json_of_the_demo_and_the_reference_spec_match_the_schema(demo: Demo) -> None:
    drift = demo.cli("plan", "--json")
    assert drift.returncode == 2, drift.stderr
    data = drift.json()
    check("plan", data)
    assert data["format"] == "reconcile-plan-json/1"
    assert len({frozenset(r) for r in data["resources"]}) == 1  # one shape, whatever the status
    assert data["observed"]["venv"]["_type"] == "absent"
    reference = demo.cli("plan", "--json", spec=REPO / "specs" / "blackwell-2x5090.toml")
    check("plan", reference.json())


def test_apply_json_and_last_run_match_their_schemas_converging_then_nothing_to_do(demo: Demo) -> None:
    demo.write_spec(_quick)
    first = demo.cli("apply", "--json")
    assert first.returncode == 2, first.output
    data = first.json()
    check("apply", data)
    assert (data["format"], data["changed"], data["converged"], data["error"]) == (
        "reconcile-apply-json/1",
        True,
        True,
        None,
    )
    assert {r["resource"] for r in data["results"]} == {"model.files", "model.config", "api_key"}
    check("last-run", json.loads(demo.last_run.read_text()))
    again = demo.cli("apply", "--json")
    assert again.returncode == 0
    check("apply", again.json())
    assert again.json()["results"] == [] and again.json()["changed"] is False


def test_apply_json_refused_by_preflight_names_the_rule_and_its_fix(demo: Demo) -> None:
    def too_long(doc: Any) -> None:
        del doc["venv"]
        doc["server"]["args"]["max-model-len"] = 100000

    demo.write_spec(too_long)
    run = demo.cli("apply", "--json")
    assert run.returncode == 1
    data = run.json()
    check("apply", data)
    assert data["error"]["rule"] == "max-model-len.derived"
    assert "100,000" in data["error"]["message"] and data["error"]["fix"]
    assert not demo.key_file.exists()


def test_apply_json_of_a_bad_spec_is_one_document_with_the_file_line_message(demo: Demo) -> None:
    text = demo.spec_path.read_text().replace("port = ", 'port = "eighty" #', 1)
    demo.spec_path.write_text(text)
    run = demo.cli("apply", "--json")
    assert run.returncode == 1
    data = run.json()
    check("apply", data)
    line = next(i for i, row in enumerate(text.splitlines(), 1) if '"eighty"' in row)
    assert data["error"]["message"].startswith(f"{demo.spec_path}:{line}: server.port:")
    assert run.stderr.startswith(
        f"reconcile: {demo.spec_path}:{line}: server.port:"
    )  # and the line for people


def test_schema_json_is_a_json_schema_every_complete_spec_validates_against() -> None:
    run = subprocess.run(
        [sys.executable, "-m", "reconcile", "schema", "--json"], capture_output=True, text=True
    )
    schema = json.loads(run.stdout)
    assert schema["$id"].endswith("/spec-1.schema.json")
    jsonschema.Draft202012Validator.check_schema(schema)
    validator = jsonschema.Draft202012Validator(schema)
    for path in sorted((REPO / "specs").glob("*.toml")):
        if path.name == "base.toml":  # a partial spec, completed by the specs that extend it
            continue
        doc = tomlkit.parse(path.read_text()).unwrap()
        assert not list(validator.iter_errors(doc)), path
    bad = tomlkit.parse((REPO / "specs" / "cpu-demo.toml").read_text()).unwrap()
    bad["server"]["port"], bad["server"]["stop_timeout"], bad["server"]["colour"] = "eighty", "soon", "red"
    wrong = {tuple(e.absolute_path) for e in validator.iter_errors(bad)}
    assert wrong == {("server",)}  # the three are reported under [server] (anyOf with null)


def test_every_probe_result_type_has_a_stable_tag() -> None:
    untagged = []
    for info in pkgutil.iter_modules(probes.__path__):
        module = importlib.import_module(f"probes.{info.name}")
        for name, value in vars(module).items():
            if (
                isinstance(value, type)
                and issubclass(value, Record)
                and value.__module__ == module.__name__
                and name not in TYPE_TAGS
            ):
                untagged.append(f"probes.{info.name}.{name}")
    assert untagged == []
    assert len(set(TYPE_TAGS.values())) == len(TYPE_TAGS)
