"""Put the registry's choices into vLLM's ModelRegistry, once per process.

Each selected bundle registers `TT<arch>` lazily (`module:Class`, never imported here),
a TT_MODEL_CLASS_OVERRIDES entry the name written and its TT form;
bundle-sourced modules resolve through the loader's synthetic packages, so vLLM's
model-inspection subprocess, which runs the general plugins first, imports them the same
way. A bare architecture vLLM does not know gets a placeholder so that vLLM's own model
config checks accept the checkpoint; the TT worker serves the `TT<arch>` generator.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from ttbundles import envs
from ttbundles.errors import ConfigurationError, Severity, TTBundleError
from ttbundles.format.meshes import mesh_or_none
from ttbundles.format.metadata import capability_flags, tt_arch_name
from ttbundles.registry.registry import Entry, Registry, Source, Status, compute, table

# A child of vLLM's logger, so messages appear wherever vLLM's own do.
logger = logging.getLogger("vllm.ttbundles")

PLACEHOLDER = "ttbundles.serving.placeholder:TTPlaceholderForCausalLM"
PLACEHOLDER_POOLING = "ttbundles.serving.placeholder:TTPlaceholderForPooling"

# What this process registered last, keyed by the environment it was computed from.
_state: dict[str, object] = {}


def _key() -> tuple:
    # Any variable may appear in a bundle's `when`: the whole environment is the key.
    return tuple(sorted(os.environ.items()))


def current_registry() -> Registry:
    """The registry for this process's environment (computed once per environment)."""
    key = _key()
    if _state.get("key") != key:
        _state["registry"] = compute()
        _state["key"] = key
    return _state["registry"]  # type: ignore[return-value]


def checked_registry() -> Registry:
    """`current_registry`, refused under TT_BUNDLES_STRICT=1 when a bundle is broken or
    ambiguous, and reported once per process (the startup table and its warnings)."""
    registry = current_registry()
    if envs.TT_BUNDLES_STRICT and registry.fatal():
        raise ConfigurationError(registry.fatal())
    # Once per process and outcome: the environment changes under vLLM (variables the
    # platform sets), the table need not.
    # vLLM's CLI loads the general plugins before it configures logging: said then, the
    # table would be lost (only bare warnings reach stderr); the platform says it later.
    # The key is each entry's outcome, not its full row: a row's signer reads the bundle's
    # signature file, which every vLLM process would pay for here on every call.
    said = (outcome(registry), tuple(map(str, registry.problems)))
    if logger.hasHandlers() and _state.get("logged") != said:
        _state["logged"] = said
        log_table(registry)
    return registry


def outcome(registry: Registry) -> tuple:
    """What registration decided, entry by entry: what the startup summary says."""
    return tuple(e.outcome() for e in registry.entries)


def register_all() -> Registry:
    registry = checked_registry()
    if _state.get("registered_key") == _state["key"]:
        return registry
    from vllm.model_executor.models.registry import ModelRegistry

    known = set(ModelRegistry.get_supported_archs())
    for arch, entry in registry.registered.items():
        ModelRegistry.register_model(arch, entry.class_ref())
        assert entry.facts is not None
        bare = entry.facts.arch
        if bare == arch:
            continue
        if entry.override is not None and stands_for_vllm(entry):
            ModelRegistry.register_model(bare, entry.class_ref())
        elif bare not in known:
            ModelRegistry.register_model(bare, placeholder_for(entry))
    _state["registered_key"] = _state["key"]
    return registry


def placeholder_for(entry: Entry) -> str:
    """The placeholder a bare architecture gets: the pooling one for a bundle that only
    pools (schema 5's form 'forward') or that pools a classification architecture
    (`*ForSequenceClassification`, which vLLM pools by default), else the
    text-generation one."""
    pooling = entry.metadata.capabilities.pooling if entry.metadata is not None else None
    if pooling is None:
        return PLACEHOLDER
    classifier = entry.facts is not None and entry.facts.arch.endswith("ForSequenceClassification")
    return PLACEHOLDER_POOLING if pooling.form == "forward" or classifier else PLACEHOLDER


def stands_for_vllm(entry: Entry) -> bool:
    """Whether an override's class may take the bare architecture name in vLLM.

    The reference plugin registers an override under the bare name too: vLLM resolves the
    checkpoint's bare architecture before any platform hook, so a class written to stand
    there (a bridge with vLLM's model interface) must get it. A plain generator cannot:
    vLLM refuses a class without `embed_input_ids`, `forward` and `compute_logits` ("does
    not support --runner generate"), so the bare name keeps vLLM's own class or the
    placeholder, and the TT worker serves the generator either way. Read from source;
    where bases could not be read, the class gets the name, as in the reference plugin.
    """
    static = entry.static
    if static is None or not static.complete:
        return True
    return all(m in static.methods for m in VLLM_MODEL_METHODS)


# What vLLM's text-generation model interface needs (vllm/model_executor/models/interfaces_base.py).
VLLM_MODEL_METHODS = ("embed_input_ids", "forward", "compute_logits")


# The startup table's columns: (name, cell of a row). One place, so a column is added
# (or a cell computed differently) here alone.
TABLE_COLUMNS: list[tuple[str, Callable[[dict], str]]] = [
    ("status", lambda r: r["status_word"]),
    ("architecture", lambda r: r["tt_arch"] or "-"),
    ("bundle", lambda r: r["label"]),
    ("source", lambda r: r["source"]),
    ("path", lambda r: r["where"]),
    ("capabilities", lambda r: ",".join(capability_flags(r["capabilities"])) or "-"),
    ("signer", lambda r: r.get("signer") or "-"),
    ("reason", lambda r: r["reason"] or ""),
]

# The words `ttbundle list` uses, in its order.
STATUS_ORDER = ("registered", "not servable", "shadowed", "inactive", "skipped")


def startup_rows(registry: Registry, *, signer: bool = True) -> list[dict]:
    """The registry's rows as the startup log shows them: `ttbundle list`'s status words
    (a registered class this machine cannot import is "not servable", said without
    importing it), the bundle by its own name (a bundle whose metadata did not validate
    has none: its folder), and where it is, short: `built-in/<folder>` for a built-in,
    else the path relative to the current folder or `~` when that is shorter."""
    from ttbundles.registry.servable import opens_here, unservable

    mesh = registry.mesh
    try:
        cannot = unservable(registry) if opens_here(mesh_or_none(mesh)) else {}
    except TTBundleError:
        cannot = {}
    rows = []
    for r in table(registry, signer=signer):
        row = dict(r)
        not_here = r["status"] == Status.REGISTERED.value and r["tt_arch"] in cannot
        row["status_word"] = "not servable" if not_here else r["status"]
        row["label"] = (
            f"{r['bundle']}@{r['version']}" if r["bundle"] else f"{Path(r['path']).name} (folder)"
        )
        row["where"] = _where(r)
        if not_here and not row["reason"]:
            row["reason"] = "its module is not importable here (TTB058)"
        rows.append(row)
    return rows


def _where(row: dict) -> str:
    return short_where(row["path"], row["source"])


def short_where(path: str | None, source: str) -> str:
    """A bundle's folder as logs show it: `built-in/<folder>` for a built-in, else the
    shortest of the path, relative to the working folder, or from `~`."""
    if not path:
        return "-"
    if source == Source.BUILTIN.value:
        return f"built-in/{Path(path).name}"
    candidates = [path]
    with contextlib.suppress(ValueError):
        candidates.append(os.path.relpath(path))
    home = str(Path.home())
    if path.startswith(home + os.sep):
        candidates.append("~" + path[len(home) :])
    return min(candidates, key=len)


def summary_line(registry: Registry, rows: list[dict]) -> str:
    """One line: how many bundles, in list's words, and the architectures served."""
    counts = Counter(r["status_word"] for r in rows)
    parts = [f"{counts[w]} {w}" for w in STATUS_ORDER if counts.get(w)]
    served = [f"{r['tt_arch']} ({r['label']})" for r in rows if r["status_word"] == "registered"]
    listed = ", ".join(served[:4]) + (f" and {len(served) - 4} more" if len(served) > 4 else "")
    return (
        f"ttbundles: {len(rows)} bundle{'s' * (len(rows) != 1)} for mesh {registry.mesh or 'any'}: "
        + ", ".join(parts)
        + (f"; serving {listed}" if listed else "")
        + " (`ttbundle list` shows them; the table is logged at debug level)"
    )


def log_table(registry: Registry) -> None:
    """One startup summary per process: a line of counts in `ttbundle list`'s words, the
    full table at debug level (`VLLM_LOGGING_LEVEL=DEBUG`), and each problem.

    Each problem (a skipped bundle, an ambiguity) is also one WARNING line of its own
    (file:line, code, fix), so it shows at vLLM's default log level in every process's
    log, the API server's included. A skipped extra bundle that would have provided an
    architecture served by a built-in instead gets a line saying so: serving falls back
    to the built-in (loudly), and `TT_BUNDLES_STRICT=1` refuses to start instead.
    """
    # The signer column appears only in the debug table: below debug level no process
    # reads a signature file to log a summary line.
    debug = logger.isEnabledFor(logging.DEBUG)
    rows = startup_rows(registry, signer=debug)
    logger.info(summary_line(registry, rows))
    if debug:
        cells = [[cell(r) for _, cell in TABLE_COLUMNS] for r in rows]
        names = [name for name, _ in TABLE_COLUMNS]
        widths = [max(len(n), *(len(c[i]) for c in cells)) for i, n in enumerate(names)]
        lines = [f"ttbundles: TT architectures (mesh {registry.mesh or 'any'}):"]
        for line in [names, *cells]:
            lines.append("  " + "  ".join(v.ljust(w) for v, w in zip(line, widths)).rstrip())
        logger.debug("\n".join(lines))
    for problem in registry.problems:
        if problem.severity is not Severity.INFO:
            logger.warning("ttbundles: %s", problem)
    for line in fallbacks(registry):
        logger.warning("ttbundles: %s", line)


def fallbacks(registry: Registry) -> list[str]:
    """For each skipped extra bundle, which bundle serves its architecture instead."""
    registered = registry.registered
    out = []
    for entry in registry.entries:
        if entry.status is not Status.SKIPPED or entry.source is not Source.EXTRA:
            continue
        arch = tt_arch_name(entry.claimed_arch) if entry.claimed_arch else None
        serving = registered.get(arch) if arch else None
        if serving is None:
            continue
        out.append(
            f"{arch}: extra bundle {entry.label} ({entry.path}) was skipped; "
            f"{serving.label} ({serving.source.value}, {serving.path}) serves {arch} instead "
            "(fix the bundle, or set TT_BUNDLES_STRICT=1 to refuse to start)"
        )
    return out
