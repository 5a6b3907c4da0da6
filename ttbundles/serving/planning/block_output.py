"""Block-output decode admitted at configuration: a class declaring
`output_tokens_per_step` k > 1 (TT-Metal's Kolibri 1, Muse-Glimmer, DiffusionGemma)
returns k tokens per row from one device decode.

Served as the reference plugin serves it: synchronous decode on the device sampler, one
engine step per block. The plan records k (the runner hands the block to vLLM as one
step's output, the scheduler counts it: `serving.scheduler.BlockOutputMixin`) and says it
in its decisions (`ttbundle plan`, the start-up report). What a block cannot follow is
refused here, with the same code `ttbundle plan` gives (TTB275):

- asynchronous scheduling: vLLM's output placeholders count one token per step;
- speculative decoding: a verify is itself a multi-token step, over drafts;
- in-process lanes: their coordinator's per-lane schedulers do not count blocks;
- a scheduler class other than ours (it would not count the block's KV);
- no device sampling: a block is drawn by the device sampler (the host draws one token
  from one step's logits), so the plan chooses a mode the bundle declares.

The class is read from source (`check.static_reader`), never imported, as the window
admission reads it; a width the source does not spell as a literal is not seen here, and
the runner refuses at load a class whose width is not the plan's (TTB275).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ttbundles.errors import ConfigurationError
from ttbundles.format.contract import CAPABILITIES_ATTRIBUTE, OUTPUT_TOKENS_PER_STEP_KEY

if TYPE_CHECKING:
    from vllm.config import VllmConfig

    from ttbundles.format.tt_options import TTOptions
    from ttbundles.serving.planning.plan import Plan

HINT = "docs/authors/generator-contract.md#block-output"


def declared_block(entry: Any) -> Any:
    """The `output_tokens_per_step` the class of registry `entry` declares in its source
    (1 when absent or not read)."""
    static = entry.class_source()
    return static.literals.get(OUTPUT_TOKENS_PER_STEP_KEY, 1) if static is not None else 1


def plan_block_output(
    vllm_config: VllmConfig,
    plan: Plan,
    entry: Any,
    options: TTOptions,
    *,
    scheduler_cls: str,
) -> TTOptions:
    """Record the class's block in the plan, or refuse what it cannot follow (TTB275).
    Returns the device options, with a sampling mode chosen where none was set."""
    if plan.pooling is not None:
        return options
    meta = entry.metadata
    name = meta.main_class.rpartition(":")[2]
    k = declared_block(entry)
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise _refuse(
            f"{name}.{CAPABILITIES_ATTRIBUTE}[{OUTPUT_TOKENS_PER_STEP_KEY!r}] is {k!r}, "
            "not a positive integer",
            f"declare the tokens one decode returns per row as an int ({HINT})",
        )
    if k == 1:
        return options
    summary = f"{name} returns {k} tokens per row per decode (output_tokens_per_step)"
    sched = vllm_config.scheduler_config
    unserved = [
        (what, fix)
        for what, on, fix in (
            (
                "asynchronous scheduling (vLLM counts one output placeholder per step)",
                bool(sched.async_scheduling),
                "declare capabilities.async_decode: false in the bundle, or serve with "
                "--no-async-scheduling",
            ),
            (
                "speculative decoding",
                vllm_config.speculative_config is not None,
                "drop --speculative-config",
            ),
            (
                "in-process data-parallel lanes",
                plan.lanes > 1,
                "serve without lanes (--data-parallel-size 1)",
            ),
            (
                f"the scheduler {sched.scheduler_cls}",
                sched.scheduler_cls != scheduler_cls,
                "drop --scheduler-cls",
            ),
        )
        if on
    ]
    if unserved:
        what, fix = unserved[0]
        raise _refuse(f"{summary}; block output is not served with {what}", f"{fix} ({HINT})")
    mode = options.sample_on_device_mode
    if mode is None:
        declared = meta.capabilities.sample_on_device
        chosen = next((m for m in ("decode_only", "all") if m in declared), None)
        if chosen is None:
            raise _refuse(
                f"{summary}, drawn by the device sampler, but {meta.name} declares no "
                "sample_on_device mode",
                f"declare capabilities.sample_on_device: [decode_only] ({HINT})",
            )
        plan.decide(
            "tt.sample_on_device_mode",
            None,
            chosen,
            "block output: the device sampler draws the block",
        )
        options = options.model_copy(update={"sample_on_device_mode": chosen})
    plan.output_tokens_per_step = plan.decide(
        "output_tokens_per_step",
        None,
        k,
        f"block output: {name} returns {k} tokens per row per decode, one engine step "
        "per block (vLLM cuts at stops inside it)",
    )
    return options


def _refuse(message: str, hint: str) -> ConfigurationError:
    return ConfigurationError.single("TTB275", message, hint=hint)
