"""`venv.features` and `venv.requirements`: the distributions each enabled feature imports (vLLM 0.26's
table) against what the venv holds, read from real dist-info directories; vLLM's other declared
requirements the venv lacks as an info line."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from probes.venv import read_venv, requires
from reconcile.plan.prober import Observed
from reconcile.preflight.gather import inputs_from
from reconcile.spec.models import Spec
from tests.test_preflight import BASE, findings, of, spec, the

# What the H200 lab's --no-deps venv held on 2026-12-01 before lm-format-enforcer was added.
LAB = {"vllm": "0.26.0", "xgrammar": "0.2.6", "llguidance": "1.7.6", "compressed-tensors": "0.17.0",
       "loguru": "0.7.3", "openai": "2.48.0"}  # fmt: skip
VLLM_REQUIRES = (
    "regex",
    "lm-format-enforcer==0.11.3",
    'xgrammar<1.0.0,>=0.2.1; platform_machine == "x86_64" or platform_machine == "aarch64"',
    "flashinfer-python==0.6.14",
    'pandas; extra == "bench"',
    'six>=1.16.0; python_version > "3.11"',
)


def no_deps(**server: Any) -> Spec:
    data = copy.deepcopy(BASE)
    data["venv"]["no_deps"] = True
    data["server"]["env"] = {"VLLM_USE_FLASHINFER_SAMPLER": "0"}
    data["server"]["args"].update(server)
    return Spec.model_validate(data)


def errors(found: list[Any]) -> list[str]:
    return [f.message for f in of(found, "venv.features") if f.severity == "error"]


def test_tool_calls_without_lm_format_enforcer_fail_the_plan() -> None:
    found = findings(no_deps(), venv_distributions=LAB)
    assert errors(found) == [
        "structured outputs (a named or required tool_choice, response_format json_schema) needs "
        "lm-format-enforcer, interegular, missing from /opt/vllm-venv (installed with --no-deps): every such "
        "request answers HTTP 500 while /health and plain chat look fine"
    ]
    f = next(f for f in of(found, "venv.features") if f.severity == "error")
    assert f.fix == 'add lm-format-enforcer = "*", interegular = "*" to [venv] packages'
    fixed = {**LAB, "lm-format-enforcer": "0.11.3", "interegular": "0.3.3"}
    assert errors(findings(no_deps(), venv_distributions=fixed)) == []
    assert {f.severity for f in of(findings(no_deps(), venv_distributions=fixed), "venv.features")} == {
        "info"
    }


def test_packages_the_spec_lists_count_as_brought_by_apply() -> None:
    data = no_deps().model_dump()
    data["venv"]["packages"].update({"lm-format-enforcer": "==0.11.3", "interegular": "*"})
    assert errors(findings(Spec.model_validate(data), venv_distributions=LAB)) == []


def test_the_flashinfer_sampler_needs_flashinfer_unless_turned_off() -> None:
    data = no_deps().model_dump()
    data["server"]["env"] = {}
    data["server"]["args"]["enable-auto-tool-choice"] = False
    found = errors(findings(Spec.model_validate(data), venv_distributions=LAB))
    assert (
        len(found) == 1 and "FlashInfer's top-p/top-k sampler" in found[0] and "flashinfer-python" in found[0]
    )
    assert errors(findings(no_deps(**{"enable-auto-tool-choice": False}), venv_distributions=LAB)) == []


def test_a_parser_brings_its_own_imports() -> None:
    s = no_deps(**{"tool-call-parser": "mistral"})
    fixed = {**LAB, "lm-format-enforcer": "0.11.3", "interegular": "0.3.3"}
    assert errors(findings(s, venv_distributions=fixed)) == [
        "tool-call-parser 'mistral' needs ijson, mistral-common, missing from /opt/vllm-venv (installed with "
        "--no-deps): the server fails at start: the parser's module does not import"
    ]
    assert errors(findings(no_deps(), venv_distributions=fixed)) == []  # hermes imports nothing extra


def test_a_venv_pip_will_fill_with_vllm_requirements_is_not_judged_before_it_exists() -> None:
    assert of(findings(spec(), venv_distributions=None), "venv.features") == []
    assert errors(findings(no_deps(), venv_distributions=None)) != []  # --no-deps: only the listed packages


def test_the_other_declared_requirements_are_an_info_line() -> None:
    found = findings(no_deps(), venv_distributions=LAB, vllm_requires=VLLM_REQUIRES, venv_python="3.10.12")
    (line,) = of(found, "venv.requirements")
    assert line.severity == "info"
    assert line.message == (
        "3 of the 4 requirements vLLM 0.26.0 declares are not in the venv (most are optional at run time): "
        "flashinfer-python, lm-format-enforcer, regex"
    )
    # six is only required from Python 3.12 on: judged by the venv's interpreter, not reconcile's.
    py312 = findings(no_deps(), venv_distributions=LAB, vllm_requires=VLLM_REQUIRES, venv_python="3.12.3")
    assert the(py312, "venv.requirements").evidence["missing"][-1] == "six"


def test_the_planner_reads_the_venv_and_the_dirs_its_pth_files_add(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    site = venv / "lib" / "python3.12" / "site-packages"
    other = tmp_path / "torch-env" / "site-packages"
    for root in (site, other):
        root.mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\nversion = 3.12.3\n")
    header = "Metadata-Version: 2.1\nName: {}\nVersion: {}\n{}\nbody\nRequires-Dist: not-a-header\n"
    for root, name, version, extra in (
        (site, "vllm", "0.26.0", "".join(f"Requires-Dist: {r}\n" for r in VLLM_REQUIRES)),
        (site, "xgrammar", "0.2.6", ""),
        (other, "lm_format_enforcer", "0.11.3", ""),
    ):
        d = root / f"{name}-{version}.dist-info"
        d.mkdir()
        (d / "METADATA").write_text(header.format(name, version, extra))
    (site / "torch-env.pth").write_text(f"{other}\n")
    seen = read_venv(str(venv))
    assert not isinstance(seen, type(None)) and hasattr(seen, "distributions")
    assert requires(seen.distributions["vllm"]) == VLLM_REQUIRES  # type: ignore[union-attr]
    inputs = inputs_from(spec(), Observed(venv=seen))
    assert inputs.venv_distributions is not None
    assert {"vllm", "xgrammar", "lm-format-enforcer"} <= set(inputs.venv_distributions)
    assert inputs.vllm_requires == VLLM_REQUIRES and inputs.venv_python == "3.12.3"


def test_a_bench_profile_without_aiohttp_in_a_no_deps_venv_is_a_warning_not_an_error() -> None:
    data = no_deps().model_dump()
    data["bench"] = {"gate": True}
    found = findings(Spec.model_validate(data), venv_distributions=LAB)
    (bench,) = [f for f in of(found, "venv.features") if "vllm bench serve" in f.message]
    assert bench.severity == "warning"
    assert "needs aiohttp, aiosignal" in bench.message and "every switch fails its gate" in bench.message
    assert bench.fix is not None and bench.fix.startswith('add aiohttp = "*"')
    without = findings(no_deps(), venv_distributions=LAB)
    assert not [f for f in of(without, "venv.features") if "vllm bench serve" in f.message]
