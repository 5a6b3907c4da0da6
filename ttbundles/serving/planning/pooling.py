"""The pooling decisions at configuration: vLLM's runner (generation or pooling) with
the tasks a bundle serves, and the refusals that need the checkpoint's files (a classifier
without its head, TTB273), read from the safetensors headers alone, no tensor loaded.

The runner's pooler (`serving.runner.pooler`) loads the head these checks found.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ttbundles.errors import ConfigurationError, Diagnostic, Severity
from ttbundles.format import capabilities as catalogue
from ttbundles.serving.checkpoint_files import (
    SCORE_WEIGHT,
    checkpoint_folder,
    file_holding,
    headless_classifier,
)
from ttbundles.serving.planning.plan import Plan, PoolingPlan

if TYPE_CHECKING:  # vLLM's config imports the platform: import it only for type hints
    from vllm.config import VllmConfig

    from ttbundles.format.metadata import BundleMetadata


def _error(code: str, message: str, hint: str | None = None) -> ConfigurationError:
    return ConfigurationError(Diagnostic(code, Severity.ERROR, message, hint=hint))


def refuse_headless_classifier(model_config: Any) -> None:
    """TTB273 at configuration, from the safetensors headers alone, when the checkpoint
    has no classification head."""
    if file_holding(checkpoint_folder(model_config.model), SCORE_WEIGHT) is None:
        raise headless_classifier(model_config)


def _pooling_asked_by(model_config: Any) -> str:
    """Who made vLLM choose its pooling runner, in the words the user would recognise:
    the flag they passed, or the checkpoint itself (vLLM pools a checkpoint with a
    sentence-transformers `modules.json` or a `*ForSequenceClassification` architecture
    by default, with no flag at all)."""
    asked = []
    if model_config.runner == "pooling":
        asked.append("--runner pooling")
    if model_config.convert not in ("auto", "none"):
        asked.append(f"--convert {model_config.convert}")
    if asked:
        return " ".join(asked)
    return (
        "the checkpoint (vLLM pools it by default: a sentence-transformers modules.json or "
        "a pooling architecture)"
    )


# The tasks vLLM's `--convert` asks for (`vllm.config.model`: `embed` makes an embedding
# model, which also answers per-token embeddings; `classify` a classifier, whose /score
# and /rerank are classification of a pair). "none" (a checkpoint vLLM pools natively)
# asks for no task in particular: every task the bundle declares.
CONVERT_TASKS: dict[str, tuple[str, ...]] = catalogue.CONVERT_TASKS


def plan_runner(vllm_config: VllmConfig, plan: Plan, meta: BundleMetadata) -> None:
    """vLLM's runner, decided aloud with the pooling tasks served. Pooling asked of a
    bundle without the task is refused (TTB270): vLLM's pooling configuration used to
    reach a generation worker, which served completions and answered 404 on
    /v1/embeddings. Generation asked of a bundle that only pools is refused too
    (TTB272)."""
    model_config = vllm_config.model_config
    runner = model_config.runner_type
    bundle = plan.bundle.label
    pooling = meta.capabilities.pooling
    asked = None if model_config.runner == "auto" else model_config.runner
    if runner == "pooling":
        by = _pooling_asked_by(model_config)
        if pooling is None:
            raise _error(
                "TTB270",
                f"{by} asks for a pooling server (embeddings, classification, scores), but "
                f"{bundle} declares no pooling task: its generator "
                f"{plan.bundle.declared_class} only generates text",
                "serve it as a generation model (drop --runner pooling and --convert, or "
                "pass --runner generate), or use a bundle that declares the pooling tasks",
            )
        convert = model_config.convert_type
        wanted = CONVERT_TASKS.get(convert)
        served = [t for t in pooling.tasks if wanted is None or t in wanted]
        if not served:
            other = "classify" if convert == "embed" else "embed"
            raise _error(
                "TTB270",
                f"{by} asks for {convert} pooling ({', '.join(wanted or ())}), but {bundle} "
                f"declares the pooling tasks {', '.join(pooling.tasks)} only",
                f"serve it with --convert {other}"
                if other in pooling.tasks
                else "use a bundle that declares the task",
            )
        if pooling.form == "prefill_hidden" and "classify" in served:
            refuse_headless_classifier(model_config)
        plan.pooling = PoolingPlan(tuple(served), pooling.form)
        plan.decide(
            "runner",
            asked,
            "pooling",
            f"{bundle} pools ({by}): tasks {', '.join(served)}, form {pooling.form!r}",
        )
        return
    if pooling is not None and pooling.form == "forward":
        raise _error(
            "TTB272",
            f"vLLM's runner is {runner!r} (text generation), but {bundle} only pools "
            f"({', '.join(pooling.tasks)}: its generator has forward(input_ids, "
            "attention_mask), no prefill or decode)",
            "serve it with --runner pooling (and --convert embed or --convert classify for "
            "a *ForCausalLM checkpoint)",
        )
    plan.decide(
        "runner",
        asked,
        runner,
        f"{bundle} generates text" + ("" if asked else " (vLLM's default)"),
    )
