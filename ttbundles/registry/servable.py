"""What registration cannot afford to check and the server dies on later: is this machine
able to open the mesh, and can the selected class be imported here.

Registration runs in every vLLM process and must stay at the cost of reading JSON, so it
never looks for TT-Metal. These checks are cheap but not free (they walk `sys.path`),
and they answer a different question: not "what registers" but "would `vllm serve` on
this machine get past loading the model". `ttbundle list`, `plan` and `doctor` ask it,
and the platform asks it once, when the server's configuration is decided, so the
server fails with the same words before any engine starts. Nothing is imported.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from ttbundles import envs
from ttbundles.errors import ConfigurationError, Diagnostic, Severity
from ttbundles.format.contract import unservable_reason
from ttbundles.format.meshes import Mesh, mesh_or_none
from ttbundles.registry.registry import Entry, Registry, Source, Status
from ttbundles.tt_metal import ttnn_origin


def opens_here(mesh: Mesh | None) -> bool:
    """Whether this machine can open `mesh`: the host mesh always, a device with ttnn."""
    if mesh is not None and mesh.is_host:
        return True
    return ttnn_origin() is not None


def device_problem(mesh: Mesh | None) -> Diagnostic | None:
    """TTB107 when `mesh` is a Tenstorrent mesh and ttnn cannot be imported here."""
    if mesh is None or mesh.is_host or ttnn_origin() is not None:
        return None
    return Diagnostic(
        "TTB107",
        Severity.ERROR,
        f"MESH_DEVICE={mesh.name} asks for a Tenstorrent mesh, but ttnn (TT-Metal) is not "
        "importable in this Python",
        hint="run inside the TT-Metal environment (its python_env, PYTHONPATH set), or "
        "use MESH_DEVICE=HOST for the host mesh",
    )


def require_device(mesh: Mesh | None) -> None:
    """Raise TTB107 where `device_problem` finds one."""
    problem = device_problem(mesh)
    if problem is not None:
        raise ConfigurationError(problem)


def class_module(class_ref: str) -> str | None:
    """The module of a `module:Class` that comes from the environment; None for one the
    loader serves from a bundle folder (registration checked that file exists)."""
    from ttbundles.format.loader import PACKAGE_PREFIX

    module = class_ref.partition(":")[0]
    return None if module.startswith(PACKAGE_PREFIX) else module


def module_findable(module: str) -> bool:
    """Whether `module` is on this interpreter's path, found on disk without importing."""
    from ttbundles.check.static_reader import environment_roots

    roots = environment_roots(module)
    return roots is not None and roots.module_file(module) is not None


def import_problem(entry: Entry) -> Diagnostic | None:
    """TTB058 (as an error: the engine would die importing it) when an environment or
    override class is not importable here."""
    if entry.facts is None:
        return None
    module = class_module(entry.class_ref())
    if module is None or module_findable(module):
        return None
    where = "TT_MODEL_CLASS_OVERRIDES" if entry.source is Source.OVERRIDE else "the environment"
    return Diagnostic(
        "TTB058",
        Severity.ERROR,
        f"{entry.label} serves {entry.tt_arch} with {entry.class_ref()} from {where}, but "
        f"module {module!r} is not importable here: loading the model would fail",
        file=None if entry.source is Source.OVERRIDE else str(entry.path),
        hint="run where TT-Metal is installed (PYTHONPATH includes its checkout), or serve "
        "this architecture with a bundle that ships its module",
    )


def unservable(registry: Registry) -> dict[str, Diagnostic]:
    """Each registered architecture whose class cannot be imported here, by TT name."""
    found = {}
    for arch, entry in registry.registered.items():
        problem = import_problem(entry)
        if problem is not None:
            found[arch] = problem
    return found


# Why a registered entry is not servable, by the code its reason starts with: one
# wording for `list`'s folded line and `doctor`'s count.
NOT_SERVABLE_WHY = {"TTB058": "not importable here", "TTB202": "served by no tested vLLM"}


def not_servable_counts(reasons: list[str | None]) -> str:
    """`14 not importable here (TTB058), 1 served by no tested vLLM (TTB202)`."""
    codes = [(reason or "").split(" ")[0] for reason in reasons]
    return ", ".join(
        f"{codes.count(c)} {NOT_SERVABLE_WHY.get(c, c)} ({c})" for c in dict.fromkeys(codes)
    )


def mark_unservable(registry: Registry) -> list[Diagnostic]:
    """Mark each registered entry whose class cannot be imported here UNSERVABLE, where
    this machine opens the registry's mesh (elsewhere the question is for that machine).

    Returns one TTB058 warning naming them all (the server starts; serving one of them
    fails), not one per bundle: without TT-Metal that is every TT-Metal built-in.
    """
    mesh = mesh_or_none(registry.mesh)
    if not opens_here(mesh):
        return []
    found = []
    for entry in registry.registered.values():
        refused = unservable_reason(entry.facts.arch) if entry.facts else None
        if refused is not None:
            # Whatever the machine: no tested vLLM can serve the architecture (the
            # platform refuses it with TTB202 before loading anything).
            entry.status = Status.UNSERVABLE
            entry.reason = "TTB202 " + refused.split(";")[0]
            continue
        problem = import_problem(entry)
        if problem is not None:
            entry.status = Status.UNSERVABLE
            entry.reason = "TTB058 " + problem.message.split(", but ")[-1]
            found.append(entry)
    if not found:
        return []
    names = ", ".join(e.tt_arch or e.label for e in found)
    return [
        Diagnostic(
            "TTB058",
            Severity.WARNING,
            f"{len(found)} registered architecture{'s' * (len(found) != 1)} cannot be "
            f"served here, their classes' modules not being importable: {names}",
            hint="run where TT-Metal is installed (PYTHONPATH includes its checkout) to "
            "serve them; the reason column names each module",
        )
    ]


def refusals(
    registry: Registry, *, what_if: bool = False, environ: Mapping[str, str] | None = None
) -> list[Diagnostic]:
    """What would stop `vllm serve` from starting in `environ` with this registry: under
    TT_BUNDLES_STRICT=1 every skipped bundle and warning (as errors, as the plugin
    raises them), and a Tenstorrent mesh this machine cannot open (TTB107). `what_if`:
    the mesh was chosen for another machine (`--mesh`), so not opening it here is not
    a refusal."""
    found = []
    if envs.read("TT_BUNDLES_STRICT", environ):
        found += [replace(d, severity=Severity.ERROR) for d in registry.fatal()]
    if not what_if:
        device = device_problem(mesh_or_none(registry.mesh))
        if device is not None:
            found.append(device)
    return found


def listing_rows(registry: Registry) -> list[dict]:
    """`ttbundle list`'s rows for the architectures no tested vLLM serves
    (`contract.UNSERVABLE_ARCHITECTURES`), where no bundle registers one: a listing
    entry says why TT-Metal's class is not offered, without shipping a bundle that could
    never validate or serve. Only alongside the built-ins, which they stand beside, and
    where `mark_unservable` judges (this machine opens the registry's mesh), as it
    judged the bundle that stood here before."""
    from ttbundles.format.contract import UNSERVABLE_ARCHITECTURES

    if not opens_here(mesh_or_none(registry.mesh)):
        return []
    if not any(e.source is Source.BUILTIN for e in registry.entries):
        return []
    present = {e.tt_arch for e in registry.entries}
    return [
        {
            "tt_arch": f"TT{arch}",
            "bundle": None,
            "version": None,
            "source": "listing",
            "path": "",
            "status": Status.UNSERVABLE.value,
            "reason": "TTB202 " + reason.split(";")[0],
            "main_class": None,
            "capabilities": None,
            "signer": None,
        }
        for arch, reason in UNSERVABLE_ARCHITECTURES.items()
        if f"TT{arch}" not in present
    ]


def skipped_for(registry: Registry, tt_arch: str) -> list[Entry]:
    """The bundles for `tt_arch` that registration skipped (a refused signature, ...)."""
    return [e for e in registry.entries if e.status is Status.SKIPPED and e.tt_arch == tt_arch]


def _skip_fix(code: str) -> str:
    """What fixes a bundle skipped with `code`: its own fix (a trust refusal: sign it or
    trust its signer; a class the adapter does not define: define it, ...)."""
    from ttbundles.codes import WHAT_TO_DO

    fix = WHAT_TO_DO.get(code)
    if fix is None:
        return "ttbundle validate DIR says what is wrong"
    first = fix.split(". ")[0].rstrip(".")
    return first[:1].lower() + first[1:]


def require_importable(class_ref: str, label: str, skipped: Sequence[Entry] = ()) -> None:
    """Raise TTB058 when the class the plan chose cannot be imported here.

    `skipped`: bundles for the same architecture that registration skipped (an unsigned
    one under a trust policy, TTB140). The chosen class is then only the fallback, and the
    true cause is the skip: said first, with its own code, rather than "add a bundle for
    this architecture" to a user who did."""
    module = class_module(class_ref)
    if module is None or module_findable(module):
        return
    if skipped:
        first = skipped[0]
        code, _, why = first.reason.partition(" ")
        code = code if code.startswith("TTB") else "TTB058"
        raise ConfigurationError(
            Diagnostic(
                code,
                Severity.ERROR,
                f"{why or first.reason} (bundle {first.label} at {first.path} skipped); "
                f"the fallback {label} serves this model with {class_ref}, but module "
                f"{module!r} is not importable here",
                file=str(first.path),
                hint=f"fix the skipped bundle: {_skip_fix(code)} (ttbundle list shows why "
                "each bundle is skipped)",
            )
        )
    raise ConfigurationError(
        Diagnostic(
            "TTB058",
            Severity.ERROR,
            f"{label} serves this model with {class_ref}, but module {module!r} is not "
            "importable here: loading the model would fail",
            hint="run where TT-Metal is installed (PYTHONPATH includes its checkout), or "
            "add a bundle for this architecture that ships its module (EXTRA_MODELS_DIR)",
        )
    )


__all__ = [
    "class_module",
    "mark_unservable",
    "refusals",
    "device_problem",
    "import_problem",
    "module_findable",
    "opens_here",
    "require_device",
    "listing_rows",
    "require_importable",
    "skipped_for",
    "unservable",
]
