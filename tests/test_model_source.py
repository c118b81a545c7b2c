"""Issue 13, item 6: a local model source is compared with its copy by content, and a symlinked
model dir is refused. The real CLI on a spec with only [machine] and [model] (source = a copy of the
demo model), against real files."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.apply_support import DEMO_MODEL, Run


class Model:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.source = root / "source"
        self.dir = root / "models" / "m"
        self.spec = root / "spec.toml"
        shutil.copytree(DEMO_MODEL, self.source)
        self.write_spec()

    def write_spec(self, model_dir: Path | None = None) -> None:
        self.spec.write_text(
            f'[machine]\nstate_dir = "{self.root}/state"\n\n'
            f'[model]\nsource = "{self.source}"\ndir = "{model_dir or self.dir}"\n'
            'config = { rope_parameters = { rope_type = "yarn", factor = 2.0 } }\n'
        )

    def cli(self, *args: str) -> Run:
        argv = [sys.executable, "-m", "reconcile", *args, "--spec", str(self.spec)]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=self.root)
        return Run(argv, proc.returncode, proc.stdout, proc.stderr)


@pytest.fixture
def model(tmp_path: Path) -> Model:
    m = Model(tmp_path)
    run = m.cli("apply")
    assert run.returncode == 2, run.output
    assert m.cli("plan").returncode == 0
    return m


def edit_keeping_size_and_mtime(path: Path, old: bytes, new: bytes) -> None:
    assert len(old) == len(new)
    st = path.stat()
    path.write_bytes(path.read_bytes().replace(old, new, 1))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert path.stat().st_size == st.st_size


def test_a_source_edit_that_keeps_size_and_mtime_is_planned_and_copied(model: Model) -> None:
    name = "tokenizer_config.json"
    edit_keeping_size_and_mtime(model.source / name, b'"<s>"', b'"<S>"')
    current = os.readlink(model.dir)  # the store: [model] dir links to the old content's realization
    plan = model.cli("plan")
    assert plan.returncode == 2, plan.output  # old code: exit 0, sizes were all it compared
    assert "copy" in plan.output and current not in plan.output  # a new realization, by content
    assert model.cli("apply").returncode == 2
    assert (model.dir / name).read_bytes() == (model.source / name).read_bytes()  # old code: never copied
    assert model.cli("plan").returncode == 0


def test_a_same_size_edit_of_config_json_reaches_the_patched_copy(model: Model) -> None:
    edit_keeping_size_and_mtime(model.source / "config.json", b'"silu"', b'"gelu"')
    assert model.cli("apply").returncode == 2
    patched = json.loads((model.dir / "config.json").read_text())
    assert patched["hidden_act"] == "gelu" and patched["rope_parameters"]["rope_type"] == "yarn"
    assert json.loads((model.dir / "config.json.bak").read_text())["hidden_act"] == "gelu"


def test_a_touched_source_file_is_not_copied(model: Model) -> None:
    name = "chat_template.jinja"
    before = (model.dir / name).stat().st_ino
    os.utime(model.source / name)  # new mtime, same bytes
    # The store addresses the realization by the source's content: the same bytes, the same one.
    plan = model.cli("plan")
    assert plan.returncode == 0, plan.output
    run = model.cli("apply")
    assert run.returncode == 0, run.output
    assert (model.dir / name).stat().st_ino == before


def test_a_symlinked_model_dir_is_refused_and_its_target_left_alone(tmp_path: Path) -> None:
    m = Model(tmp_path)
    elsewhere = tmp_path / "someone-elses-model"
    shutil.copytree(DEMO_MODEL, elsewhere)
    original = (elsewhere / "config.json").read_bytes()
    link = tmp_path / "models" / "link"
    link.parent.mkdir(parents=True)
    link.symlink_to(elsewhere)
    m.write_spec(model_dir=link)
    plan = m.cli("plan")
    assert plan.returncode == 1, plan.output
    assert f"[model].dir {link} is a symlink (to {elsewhere})" in plan.output
    run = m.cli("apply")
    assert run.returncode == 1, run.output
    # Old code: config.json patched through the link and "original kept as config.json.bak" there.
    assert (elsewhere / "config.json").read_bytes() == original
    assert not (elsewhere / "config.json.bak").exists()
