"""Preflight rules for the CUDA toolchain FlashInfer's JIT needs: nvcc, its GPU archs, headers, ninja, PATH.

Run by `reconcile.preflight.gather`; same context, same Findings.
Rule ids and the article's failures they catch: docs/preflight.md.
"""

from __future__ import annotations

import os

from reconcile.plan.records import Finding
from reconcile.preflight.context import RuleContext, finding
from reconcile.vllm.toolchain import compute_arch, cuda_suffix, header_package, min_cuda_for
from reconcile.vllm.versions import numbers

TYPE_CHECKING = False
if TYPE_CHECKING:
    from reconcile.plan.records import Severity

# The toolkit to move to when the present one is too old: vLLM 0.26's wheels are built for CUDA 13.0.
RECOMMENDED = "13.0"


def _version(text: str | None) -> tuple[int, int] | None:
    major_minor = numbers(text)[:2]
    return (major_minor[0], major_minor[1]) if len(major_minor) == 2 else None


def _apt(c: RuleContext) -> list[str]:
    return list(c.spec.apt.packages) if c.spec.apt else []


def _planned_cuda(c: RuleContext) -> tuple[int, int] | None:
    """The toolkit version apply will put under CUDA_HOME when it differs from the probed one:
    from [cuda] target ("/usr/local/cuda-13.0"), else from a single cuda-nvcc-X-Y in [apt] packages."""
    planned = _version(c.spec.cuda.target) if c.spec.cuda and c.spec.cuda.target else None
    if planned is None:
        nvcc = {
            _version(p.split("=")[0][len("cuda-nvcc-") :].replace("-", "."))
            for p in _apt(c)
            if p.startswith("cuda-nvcc-")
        }
        planned = nvcc.pop() if len(nvcc) == 1 else None
    return planned if planned and planned != _version(c.inputs.nvcc_version) else None


def _capabilities(c: RuleContext) -> list[str]:
    if c.gpus:
        return sorted({g.compute_capability for g in c.gpus})
    return [c.spec.gpu.compute_capability] if c.spec.gpu and c.spec.gpu.compute_capability else []


def _needed_cuda(c: RuleContext) -> tuple[tuple[int, int] | None, str]:
    """The oldest nvcc the GPUs (and [cuda] min_version) allow, and why."""
    need, why = None, ""
    for cc in _capabilities(c):
        v = min_cuda_for(cc)
        if v and (need is None or v > need):
            need, why = v, f"sm_{compute_arch(cc)[8:]}"
    floor = _version(c.spec.cuda.min_version) if c.spec.cuda and c.spec.cuda.min_version else None
    if floor and (need is None or floor > need):
        need, why = floor, "[cuda] min_version"
    return need, why


def _dotted(v: tuple[int, int]) -> str:
    return f"{v[0]}.{v[1]}"


def _flashinfer_says(why: str) -> str:
    return ' (FlashInfer: "SM 12.x requires CUDA >= 12.9")' if why.startswith("sm_12") else ""


def _nvcc(c: RuleContext) -> list[Finding]:
    rule = "toolchain.nvcc"
    need, why = _needed_cuda(c)
    planned = _planned_cuda(c)
    have = _version(c.inputs.nvcc_version) if c.inputs.nvcc_path else None
    wanted = f" (>= {_dotted(need)} for {why})" if need else ""
    if planned and (need is None or planned >= need):
        state = f"nvcc {c.inputs.nvcc_version} at {c.inputs.nvcc_path}" if have else "no nvcc yet"
        return [finding(rule, "warning", f"{state}; apply brings CUDA {_dotted(planned)}{wanted}")]
    if planned and need:
        return [
            finding(
                rule,
                "error",
                f"the spec's CUDA {_dotted(planned)} is too old for {why}: needs CUDA >= {_dotted(need)}"
                + _flashinfer_says(why),
                "point [cuda] target at /usr/local/cuda-13.0 and list cuda-nvcc-13-0 in [apt] packages",
            )
        ]
    if have is None:
        severity: Severity = "error" if c.spec.cuda or c.gpus else "warning"
        home = c.spec.cuda.home if c.spec.cuda else "/usr/local/cuda"
        return [
            finding(
                rule,
                severity,
                f"no nvcc under {home}/bin nor on PATH: FlashInfer's JIT fails with \"Could not "
                f"find nvcc and default cuda_home='{home}' doesn't exist\"",
                "list cuda-nvcc-13-0 (and its dev headers) in [apt] packages; "
                '[cuda] target = "/usr/local/cuda-13.0"',
            )
        ]
    if need and have < need:
        return [
            finding(
                rule,
                "error",
                f"nvcc {c.inputs.nvcc_version} is too old for {why}: needs CUDA >= {_dotted(need)}"
                + _flashinfer_says(why),
                'set [cuda] target = "/usr/local/cuda-13.0" and list cuda-nvcc-13-0 in [apt] packages',
                nvcc=c.inputs.nvcc_path,
            )
        ]
    return [finding(rule, "info", f"nvcc {c.inputs.nvcc_version} at {c.inputs.nvcc_path}{wanted}")]


def _arch(c: RuleContext) -> list[Finding]:
    rule = "toolchain.arch"
    wanted = sorted(
        {compute_arch(cc) for cc in _capabilities(c)} | set(c.spec.cuda.gpu_arch if c.spec.cuda else [])
    )
    listed = c.inputs.nvcc_arch_list
    if not c.inputs.nvcc_path or not wanted:
        return []
    if _planned_cuda(c):
        return [
            finding(rule, "info", f"{', '.join(wanted)}: checked again once apply has changed the toolkit")
        ]
    if listed is None:
        return [finding(rule, "warning", "`nvcc --list-gpu-arch` was not run: GPU archs not checked")]
    missing = [a for a in wanted if a not in listed]
    fix = "install an nvcc that knows the arch (CUDA >= 12.9 for sm_120) and point [cuda] target at it"
    if not listed:
        return [
            finding(
                rule,
                "error",
                "`nvcc --list-gpu-arch` prints nothing: FlashInfer then reports the misleading "
                '"FlashInfer requires GPUs with sm75 or higher"',
                fix,
                nvcc=c.inputs.nvcc_path,
            )
        ]
    if missing:
        return [
            finding(
                rule,
                "error",
                f"nvcc {c.inputs.nvcc_version} cannot target {', '.join(missing)} (FlashInfer: "
                '"FlashInfer requires GPUs with sm75 or higher")',
                fix,
                listed=list(listed),
            )
        ]
    return [finding(rule, "info", f"nvcc lists {', '.join(wanted)}")]


def _package_toolkit(c: RuleContext) -> str | None:
    """The CUDA version whose -X-Y packages to name: the one apply brings, else the probed nvcc's when it
    is new enough, else the RECOMMENDED one the nvcc rule asks for."""
    planned = _planned_cuda(c)
    if planned:
        return _dotted(planned)
    have, (need, _why) = _version(c.inputs.nvcc_version), _needed_cuda(c)
    if have and (need is None or have >= need):
        return c.inputs.nvcc_version
    if have or need:
        return RECOMMENDED
    return c.spec.cuda.target if c.spec.cuda else None


def _headers(c: RuleContext) -> list[Finding]:
    rule = "toolchain.headers"
    listed = list(c.spec.cuda.headers) if c.spec.cuda else []
    probed = c.inputs.headers_missing
    if probed is not None and not probed:
        return [finding(rule, "info", f"headers present: {', '.join(listed)}")] if listed else []
    # Not probed (no toolkit yet): every listed header must come from [apt] packages.
    missing = list(probed) if probed is not None else listed
    if not missing:
        return []
    toolkit = _package_toolkit(c)
    packages = {h: header_package(h, toolkit) for h in missing}
    queued = [p for p in packages.values() if p and p in _apt(c)]
    lacking = [f"{h} ({p})" if p else h for h, p in packages.items() if p not in queued]
    unknown = [p for p in queued if p in c.inputs.apt_unknown]
    if not lacking and unknown:  # listed, but "apply installs" would be a promise apt cannot keep
        return [
            finding(
                rule,
                "warning",
                f"missing: {', '.join(missing)}; [apt] packages lists {', '.join(unknown)}, but apt on this "
                f"machine cannot install {'it' if len(unknown) == 1 else 'them'} yet (apply runs apt-get "
                "update first, and fails if apt still cannot)",
                "add the repository that has it to [apt] repositories (NVIDIA's CUDA repository for "
                "cuda-*/lib*-dev packages), or check the name with apt-cache search",
            )
        ]
    if not lacking:
        now = "missing now" if probed is not None else "toolkit not probed"
        return [finding(rule, "warning", f"{now}: {', '.join(missing)}; apply installs {', '.join(queued)}")]
    add = [p for p in packages.values() if p and p not in queued]
    fix = (
        f"add {', '.join(add)} to [apt] packages"
        if add
        else f"find the package: apt-file search {missing[0]}"
    )
    where = (
        "missing from the toolkit's include dirs" if probed is not None else "not brought by [apt] packages"
    )
    msg = (
        f"{where}: {', '.join(lacking)}: FlashInfer's JIT stops with "
        f'"fatal error: {missing[0]}: No such file or directory"'
    )
    # Without a probe the header may still be there: a warning, not a verdict.
    return [
        finding(rule, "error" if probed is not None else "warning", msg, fix, suffix=cuda_suffix(toolkit))
    ]


def _venv_bin(c: RuleContext) -> str:
    if c.spec.venv:
        return c.spec.venv.path.rstrip("/") + "/bin"
    return os.path.dirname(c.server.executable or "/usr/bin/vllm")


def _ninja(c: RuleContext) -> list[Finding]:
    rule = "toolchain.ninja"
    if c.spec.venv is None:
        return []
    listed = "ninja" in {p.lower() for p in c.spec.venv.packages}
    if c.inputs.venv_has_ninja:
        return [finding(rule, "info", f"ninja in {_venv_bin(c)}")]
    if c.inputs.ninja_on_path and not listed:
        return [finding(rule, "info", f"ninja on the server's PATH: {c.inputs.ninja_on_path}")]
    if listed:
        return [
            finding(rule, "warning", f"no ninja in {_venv_bin(c)} yet; apply installs it ([venv] packages)")
        ]
    # An error when the spec declares FlashInfer's JIT build ([cuda] headers); other deployments
    # (eager mode, prebuilt kernels) may never call ninja.
    severity: Severity = "error" if c.spec.cuda and c.spec.cuda.headers else "warning"
    msg = f"no ninja in {_venv_bin(c)}, nor in [venv] packages: a JIT build fails with \"'ninja' not found\""
    return [finding(rule, severity, msg, 'add ninja = "*" to [venv] packages')]


def _path(c: RuleContext) -> list[Finding]:
    rule = "toolchain.path"
    venv_bin = _venv_bin(c)
    home = c.spec.cuda.home.rstrip("/") if c.spec.cuda else None
    first = [venv_bin] + ([home + "/bin"] if home else [])
    out = []
    env_path = c.server.env.get("PATH")
    if env_path is not None and sorted(env_path.split(":")[: len(first)]) != sorted(first):
        out.append(
            finding(
                rule,
                "error",
                f"[server] env PATH = {env_path!r} does not start with {':'.join(first)}: the "
                "workers then miss ninja (\"'ninja' not found\") or the right nvcc",
                f"drop PATH from [server] env (the launcher builds {':'.join(first)}:<rest>)",
            )
        )
    cuda_home = c.server.env.get("CUDA_HOME")
    if cuda_home is not None and home and cuda_home.rstrip("/") != home:
        out.append(
            finding(
                rule,
                "error",
                f"[server] env CUDA_HOME = {cuda_home!r} but [cuda] home = {home!r}: FlashInfer runs "
                "$CUDA_HOME/bin/nvcc, not the one the plan checked",
                "drop CUDA_HOME from [server] env",
            )
        )
    if not out:
        tail = f", CUDA_HOME={home}" if home else " (no [cuda]: CUDA_HOME unset, nvcc from PATH)"
        out.append(finding(rule, "info", f"server PATH starts {':'.join(first)}{tail}"))
    return out


RULES = (_nvcc, _arch, _headers, _ninja, _path)
