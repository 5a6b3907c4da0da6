"""Which registered bundle serves a checkpoint: the first of its architectures that one
serves, else why none does (TTB202 for an architecture no bundle could serve, TTB200
with what is servable here). The planner selects with it, and so does the parse hook's
length check (`flag_refusals`), which names the selected bundle's target cap.
"""

from __future__ import annotations

from ttbundles.errors import ConfigurationError, Diagnostic, Severity
from ttbundles.format.contract import unservable_reason
from ttbundles.format.metadata import tt_arch_name
from ttbundles.registry.registry import Registry, Status


def _error(code: str, message: str, hint: str | None = None) -> ConfigurationError:
    return ConfigurationError(Diagnostic(code, Severity.ERROR, message, hint=hint))


def select_entry(architectures: list[str], registry: Registry):
    """The registered bundle serving the first of `architectures` that has one."""
    registered = registry.registered
    for arch in architectures:
        entry = registered.get(tt_arch_name(arch))
        if entry is not None:
            return entry
    for arch in architectures:  # no bundle, and none could serve it: say why
        reason = unservable_reason(arch)
        if reason is not None:
            raise _error(
                "TTB202",
                f"{arch} cannot be served: {reason}",
                "serve a model vLLM knows (for images: Qwen2.5-VL, Qwen3-VL, Gemma 3)",
            )
    raise _error("TTB200", *_none_serves(architectures, registry))


def _none_serves(architectures: list[str], registry: Registry) -> tuple[str, str]:
    """TTB200's message and fix, in `ttbundle list`'s words: only what can be served
    here is called registered; the rest is counted with why (listing 13 architectures
    the line above calls not servable as "registered" sent users the wrong way)."""
    from ttbundles.registry.servable import mark_unservable, not_servable_counts

    mark_unservable(registry)  # the error path: the registry is not used again
    servable = registry.registered
    listing = "".join(f"\n  {a} ({e.label}, {e.source.value})" for a, e in sorted(servable.items()))
    others = [e for e in registry.entries if e.status is Status.UNSERVABLE]
    rest = (
        f"; {len(others)} more registered but not servable here: "
        f"{not_servable_counts([e.reason for e in others])}"
        if others
        else ""
    )
    wanted = ", ".join(architectures) or "this model"
    return (
        f"no TT architecture servable here serves {wanted} "
        f"(looked for {', '.join(tt_arch_name(a) for a in architectures)}); "
        f"servable:{listing or ' none'}{rest}",
        _bundle_for(architectures),
    )


def _bundle_for(architectures: list[str]) -> str:
    """TTB200's fix: the bundle that would serve the checkpoint, by what it is. One the
    torch reference reads: `init --reference` makes it, serving on the host mesh at once;
    an encoder has no reference: a bundle of the pooling form `forward` over the author's
    own generator; anything else: a bundle of one's own."""
    from ttbundles.check.reference_archs import REFERENCE_MISSING, TEXT_ARCHITECTURES

    install = (
        "into a folder named by EXTRA_MODELS_DIR (ttbundle list shows what is servable and "
        "why not; docs/operators/installing.md)"
    )
    read = [a for a in architectures if a in TEXT_ARCHITECTURES]
    if read:
        return (
            f"make a bundle on the torch reference ({read[0]}), which serves on the host "
            "mesh at once: ttbundle init models/NAME --reference --from-hf MODEL, then "
            "EXTRA_MODELS_DIR=models; or add a bundle of your own " + install
        )
    if any(a in REFERENCE_MISSING and "encoder" in REFERENCE_MISSING[a] for a in architectures):
        return (
            "an encoder has no torch reference: write a bundle of the pooling form "
            "'forward' (capabilities.pooling: {tasks, form: forward}) over your own "
            "generator's forward(input_ids, attention_mask) (docs/authors/"
            "generator-contract.md#pooling), and add it " + install
        )
    return "add a bundle for it " + install
