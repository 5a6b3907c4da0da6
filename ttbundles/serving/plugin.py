"""vLLM's entry points into ttbundles; vLLM calls them in every process.

Kept cheap on purpose: importing this module imports nothing beyond the standard
library, `platform_plugin` never imports ttnn (it only looks for it), and
`register_models` reads bundle metadata without importing any adapter.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping

from ttbundles.tt_metal import ttnn_origin

# A child of vLLM's logger, so messages appear wherever vLLM's own do.
logger = logging.getLogger("vllm.ttbundles")

PLATFORM_QUALNAME = "ttbundles.serving.platform.TTPlatform"


def activation(environ: Mapping[str, str] | None = None) -> tuple[bool, str]:
    """Whether the TT platform activates in `environ`, and why (for logs and doctor).

    It activates where a Tenstorrent stack is present (ttnn findable) or where
    MESH_DEVICE is set at all: MESH_DEVICE is Tenstorrent's own variable, so whoever sets
    it means this platform, and activating lets a wrong value or a missing TT-Metal be
    reported by us (TTB106, TTB107) instead of vLLM's "Failed to infer device type".
    Otherwise it stays inert (a CUDA box with ttbundles installed must never select it).
    Never imports ttnn; only looks for it.
    """
    from ttbundles import envs

    value = envs.read("MESH_DEVICE", environ)
    if value:
        from ttbundles.errors import TTBundleError
        from ttbundles.format.meshes import parse_mesh  # plain data: cheap

        try:
            mesh = parse_mesh(value)
        except TTBundleError:
            return True, f"MESH_DEVICE={value!r} is set (not a mesh: startup reports it)"
        if mesh.is_host:
            return True, f"MESH_DEVICE={value} asks for the host mesh"
        return True, f"MESH_DEVICE={value} asks for a Tenstorrent mesh ({mesh.describe()})"
    if ttnn_origin() is not None:
        return True, "ttnn (TT-Metal) is importable and MESH_DEVICE is unset"
    return False, "MESH_DEVICE is unset and ttnn (TT-Metal) is not importable"


def platform_plugin() -> str | None:
    """The TT platform when `activation` says so (see there); None keeps ttbundles inert.

    A valid MESH_DEVICE is rewritten to its canonical spelling (`t3k` -> `T3K`) in this
    process's environment, inherited by vLLM's child processes: TT-Metal's model code
    looks presets up by that spelling.
    """
    active, why = activation()
    if not active:
        logger.debug("ttbundles: TT platform not activated: %s", why)
        explain_missing_device()
        return None
    from ttbundles import envs
    from ttbundles.errors import TTBundleError
    from ttbundles.format.meshes import canonical

    value = envs.raw("MESH_DEVICE")
    try:
        name = canonical(value)
    except TTBundleError:
        name = None
    if value and name and name != value:
        os.environ["MESH_DEVICE"] = name
    logger.debug("ttbundles: activating the TT platform: %s", why)
    warn_outside_window()
    return PLATFORM_QUALNAME


NO_DEVICE_LINE = (
    "TTB245 ttbundles: no Tenstorrent device and MESH_DEVICE is unset, so vLLM found no "
    "platform to serve on. Set MESH_DEVICE=HOST to run on the host mesh (the CPU), or "
    "MESH_DEVICE=N150 (T3K, ...) for a card; check a card with `ls /dev/tenstorrent` or "
    "`tt-smi`, and the whole set-up with `ttbundle doctor`"
)


def explain_missing_device() -> None:
    """Where the platform stays inert, turn vLLM's later "Failed to infer device type"
    (a 35-line traceback that names neither MESH_DEVICE nor the host mesh) into
    `NO_DEVICE_LINE` and exit 1, and drop the "Failed to import from vllm._C" warning an
    unspecified platform logs first (an empty build has no _C: the warning misleads).

    Only that error and that warning: any other exception keeps its traceback, and
    VLLM_LOGGING_LEVEL=DEBUG (what vLLM's message asks for) keeps vLLM's own report. On
    a machine where another platform activates (a CUDA box), vLLM infers its device and
    neither ever fires. Cheap: installs a hook and a log filter, imports nothing.
    """
    import sys

    from ttbundles import envs

    if (envs.raw("VLLM_LOGGING_LEVEL") or "").upper() == "DEBUG":
        return
    previous = sys.excepthook
    if getattr(previous, "_ttbundles_no_device", False):
        return

    def hook(kind, value, traceback):  # noqa: ANN001 - sys.excepthook's signature
        if isinstance(value, RuntimeError) and "Failed to infer device type" in str(value):
            sys.stderr.write(f"{NO_DEVICE_LINE}\n")
            return  # an uncaught exception: the interpreter exits 1
        previous(kind, value, traceback)

    hook._ttbundles_no_device = True  # type: ignore[attr-defined]
    sys.excepthook = hook
    logging.getLogger("vllm.platforms.interface").addFilter(_drop_missing_c_warning)


def _drop_missing_c_warning(record: logging.LogRecord) -> bool:
    """Keep every record but the unspecified platform's missing-_C warning (see
    `explain_missing_device`); where a platform was resolved, keep that one too."""
    if not record.getMessage().startswith("Failed to import from vllm._C"):
        return True
    import sys

    platforms = sys.modules.get("vllm.platforms")
    current = getattr(platforms, "_current_platform", None) if platforms else None
    return current is not None and not current.is_unspecified()


_WARNED_ENV = "TTBUNDLES_VLLM_WINDOW_WARNED"


def warn_outside_window() -> str | None:
    """One WARNING when the installed vLLM is outside the tested window: the version,
    the window and what to do. Once for a whole `vllm serve` (vLLM's child processes
    inherit the mark); reads distribution metadata only. Returns the line logged."""
    from ttbundles import envs, vllm_window

    if envs.read(_WARNED_ENV):
        return None
    version = vllm_window.installed_vllm()
    if version is None:
        return None
    verdict = vllm_window.verdict(version)
    if verdict.tested:
        return None
    os.environ[_WARNED_ENV] = "1"
    line = f"TTB217 ttbundles: {verdict.line()}"
    logger.warning("%s", line)
    return line


def register_models() -> None:
    """Register every selected bundle's TT<arch> with vLLM (idempotent, lazy).

    Both general-plugin names point here: `tt_model_registry` (the reference plugin's, so
    its VLLM_PLUGINS filters select us) and `ttbundles` (the alias of earlier releases).
    With VLLM_PLUGINS unset vLLM calls each name, so this runs twice in one process; the
    registration itself runs once per process and environment (`register_all`).
    """
    from ttbundles import torchvision_compat
    from ttbundles.errors import TTBundleError
    from ttbundles.serving.registration import register_all

    # Every vLLM process passes here first (the model-inspection subprocess included), so
    # vLLM's vision modules import torchvision in each of them (see torchvision_compat).
    torchvision_compat.install()
    if activation()[0]:
        # The generator's own drafter as vLLM's `custom_class` speculative method, known
        # in every process before any config is built (a dict entry; vLLM's method
        # registry imports nothing heavy).
        from ttbundles.serving import compat

        compat.register_model_owned_drafter()
    try:
        register_all()
    except TTBundleError:
        # Raised before any platform hook, in every vLLM process: end `vllm serve` with
        # the message (TTB104 names the bad item), not a traceback.
        report_errors_cleanly()
        raise


def report_errors_cleanly() -> None:
    """Make an uncaught ttbundles error end the process with its message, not a traceback.

    Whoever catches the error (`ttbundle plan`, tests) still gets the exception. Only an
    uncaught one reaches this hook, and other exceptions keep Python's usual report.
    """
    import sys

    from ttbundles.errors import TTBundleError

    previous = sys.excepthook
    if getattr(previous, "_ttbundles", False):
        return

    def hook(kind, value, traceback):  # noqa: ANN001 - sys.excepthook's signature
        if isinstance(value, TTBundleError):
            sys.stderr.write(f"{value}\n")
            return
        from ttbundles.serving.faults import debugging, engine_report

        if kind is KeyboardInterrupt and str(value) == "terminated" and not debugging():
            # vLLM's API server turns a SIGTERM during startup into this exception.
            sys.stderr.write("ttbundles: vllm serve stopped by SIGTERM while starting\n")
            return

        # vLLM's "Engine core initialization failed" after the engine said why (one
        # line, in its log): that line again, not the API server's traceback.
        line = engine_report(value)
        if line is not None and not debugging():
            sys.stderr.write(f"ttbundles: the engine did not start: {line}\n")
            return
        previous(kind, value, traceback)

    hook._ttbundles = True  # type: ignore[attr-defined]
    sys.excepthook = hook
