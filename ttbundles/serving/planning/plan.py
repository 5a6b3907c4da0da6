"""The serving plan: what ttbundles decided for one `vllm serve` (the bundle served, its
topology, the features and options in force, every decision and warning).

`configuration.plan_config` makes it from vLLM's config and the bundle's metadata; it
travels to the engine's processes inside `additional_config` (`to_dict`, `from_dict`).
A module of its own, importing neither vLLM nor the rest of the serving side, so that
every module that reads or adds to a plan can name its type.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field, fields
from typing import TYPE_CHECKING, Any

from ttbundles.errors import Diagnostic, Severity
from ttbundles.format.tt_options import ServerOptions, TTOptions
from ttbundles.serving.planning.options import TT_DEFAULTS, parse_tt_options

if TYPE_CHECKING:  # vLLM's config imports the platform: import it only for type hints
    from vllm.config import VllmConfig

logger = logging.getLogger("vllm.ttbundles")


@dataclass(frozen=True)
class Decision:
    setting: str
    requested: Any
    effective: Any
    reason: str

    def __str__(self) -> str:
        change = (
            f"{self.requested!r} -> {self.effective!r}"
            if self.requested != self.effective
            else f"{self.effective!r}"
        )
        return f"{self.setting}: {change} ({self.reason})"


@dataclass(frozen=True)
class BundleRef:
    """The bundle a plan serves: what the engine imports (`main_class`, under the bundle's
    package when it is the bundle's own module, from `path`) and what logs and errors
    call it (`label`, `declared_class` as the bundle wrote it)."""

    name: str
    version: str
    source: str  # built-in, extra, installed, ... (`registry.Source`)
    path: str
    main_class: str
    declared_class: str = ""

    @property
    def label(self) -> str:
        return f"{self.name}@{self.version}"


@dataclass(frozen=True)
class SpeculativePlan:
    """Speculative decoding as admitted (`serving.planning.spec_admission`): what the runner
    verifies and drafts, and what `validate_request` refuses while speculating."""

    method: str  # vLLM's method: ngram, or the bundle's own drafter
    k: int  # the draft length in force (the generator's spec_plan may lower it)
    accept_modes: tuple[str, ...]  # the served accept modes of the generator's plan
    narrow: bool  # the generator verifies narrow decodes (supports_narrow_decode)
    prompt_lookup_min: int | None = None  # the n-gram window (ngram only)
    prompt_lookup_max: int | None = None
    # The generator's SpecPlan as it answered it (`format.speculative.SpecPlan.to_dict`).
    generator_plan: dict[str, Any] = field(default_factory=dict)
    asynchronous: bool = False  # each verify is read back before the next step is built

    def to_dict(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "k": self.k,
            "accept_modes": list(self.accept_modes),
            "narrow": self.narrow,
            "prompt_lookup_min": self.prompt_lookup_min,
            "prompt_lookup_max": self.prompt_lookup_max,
            "plan": self.generator_plan,
            "async": self.asynchronous,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SpeculativePlan:
        return cls(
            method=data["method"],
            k=int(data["k"]),
            accept_modes=tuple(data["accept_modes"]),
            narrow=bool(data["narrow"]),
            prompt_lookup_min=data.get("prompt_lookup_min"),
            prompt_lookup_max=data.get("prompt_lookup_max"),
            generator_plan=dict(data.get("plan") or {}),
            asynchronous=bool(data.get("async")),
        )


@dataclass(frozen=True)
class PoolingPlan:
    """What vLLM's pooling runner serves of the bundle's pooling (schema 5): the tasks
    asked for and declared, and the contract form."""

    tasks: tuple[str, ...]
    form: str

    def to_dict(self) -> dict[str, Any]:
        return {"tasks": list(self.tasks), "form": self.form}


ChatSettings = dict[str, "str | bool"]
"""vLLM serve options the bundle's serving defaults supply, by their argument name
(tool_call_parser, enable_auto_tool_choice, chat_template, reasoning_parser): what is
applied to the API server's arguments, so a mapping is its type."""


class FrozenPlanError(AttributeError):
    """A plan changed after it was made: the engine's processes each read their own copy
    (`from_dict`), so a change made there would hold in one process only."""


@dataclass
class Plan:
    tt_arch: str
    bundle: BundleRef
    mesh: str | None
    # The effective device options (the user's over the target's defaults over ours).
    options: TTOptions
    lanes: int = 1
    decisions: list[Decision] = field(default_factory=list)
    # Multi-process data parallelism: each local rank's chip ids (its TT_VISIBLE_DEVICES)
    # and the shape of the submesh it opens; empty with one engine.
    device_groups: list[list[int]] = field(default_factory=list)
    submesh_shape: list[int] = field(default_factory=list)
    # Several hosts (vLLM's multi-node data parallelism): the ranks on every host together,
    # this host's first global rank and its name; `device_groups` are this host's ranks
    # only, by local rank (each host plans, and splits its own mesh, for itself).
    dp_size: int = 1
    dp_start_rank: int = 0
    dp_local: int = 0
    host: str = ""
    # The head's data-parallel address and RPC port when the ranks span hosts ("": one
    # host); every engine and the head keep in touch there (`serving.host_watch`).
    dp_address: str = ""
    dp_rpc_port: int = 0
    # Items per prompt for each modality served besides text ({}: text only).
    inputs: dict[str, int] = field(default_factory=dict)
    # What the server does differently from what the user asked (each a WARNING):
    # logged at start-up and shown by `ttbundle plan`.
    warnings: list[Diagnostic] = field(default_factory=list)
    # The settings lowered below what the user asked for (`lowered`, each with its TTB246
    # warning): what `lowered_length` and the length refusals read.
    lowered_settings: list[str] = field(default_factory=list)
    # Speculative decoding as admitted (`serving.planning.spec_admission`; None: not speculating).
    speculative: SpeculativePlan | None = None
    # The API server's options (the user's only, never a target's).
    server: ServerOptions = field(default_factory=ServerOptions)
    # The bundle declares prompt logprobs (schema 3): requests may ask for them.
    prompt_logprobs: bool = False
    # The bundle declares capabilities.async_decode: async scheduling may stay on, and the
    # generator keeps its decode inputs resident. The one source of it: the runner reads
    # this, and refuses at load a class whose model_capabilities disagrees (TTB056).
    async_decode: bool = False
    # The bundle's KV groups are served on vLLM's hybrid KV-cache manager (schema 5,
    # `serving.planning.kv_admission`): what the platform answers `support_hybrid_kv_cache`.
    kv_groups: bool = False
    # The chat settings the bundle's serving defaults supply (schema 4), those the
    # operator left unset only: tool_call_parser, enable_auto_tool_choice, chat_template
    # (an absolute path), reasoning_parser (`serving.planning.chat_defaults`).
    chat: ChatSettings = field(default_factory=dict)
    # What the bundle's evidence says of this mesh: tested, stale, failed or untested
    # (`check.support`), and the one line the plan and the start-up report give when it
    # is not "tested" ("": nothing to say).
    evidence: str = "untested"
    evidence_note: str = ""
    # What vLLM's pooling runner serves (None: a generation server).
    pooling: PoolingPlan | None = None
    # Snapshots of recurrent state the generator keeps for the prefix cache (its
    # `recurrent_prefix_snapshots`; 0: no prefix cache over recurrent state).
    recurrent_snapshots: int = 0
    # Who holds the recurrent state served ("generator": its own slots; "vllm": MambaSpec
    # groups in vLLM's KV manager, allocated per layer; "": no recurrent state).
    recurrent_owner: str = ""
    # Tokens per row a device decode of the class returns (its `output_tokens_per_step`;
    # 1: one-token decode). Above 1 (block output, `serving.planning.block_output`): the
    # runner hands the block to vLLM as one step's output and the scheduler counts it.
    output_tokens_per_step: int = 1
    # Set by `freeze`: from then on every assignment raises `FrozenPlanError`.
    frozen: bool = field(default=False, init=False, compare=False, repr=False)

    def __setattr__(self, name: str, value: Any) -> None:
        if getattr(self, "frozen", False):
            raise FrozenPlanError(f"the plan is frozen once made: cannot set {name}")
        object.__setattr__(self, name, value)

    def freeze(self) -> Plan:
        """End the planning: the lists become tuples and no field can be set again. The
        configuration hook freezes the plan it made; `from_dict` gives a frozen one."""
        for name in ("decisions", "device_groups", "submesh_shape", "warnings"):
            value = getattr(self, name)
            object.__setattr__(
                self, name, tuple(tuple(v) if isinstance(v, list) else v for v in value)
            )
        object.__setattr__(self, "lowered_settings", tuple(self.lowered_settings))
        object.__setattr__(self, "frozen", True)
        return self

    def decide(self, setting: str, requested: Any, effective: Any, reason: str) -> Any:
        if self.frozen:
            raise FrozenPlanError(f"the plan is frozen once made: cannot decide {setting}")
        self.decisions.append(Decision(setting, requested, effective, reason))
        return effective

    def __post_init__(self) -> None:
        # Plain data where a caller (or `from_dict`) gives it: typed from here on.
        if not isinstance(self.options, TTOptions):
            self.options = TTOptions.model_validate(self.options)
        if not isinstance(self.server, ServerOptions):
            self.server = ServerOptions.model_validate(self.server)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON data (what travels in `additional_config` and `ttbundle plan`
        prints): the options as their non-default values, warnings as diagnostics."""
        data = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "frozen"}
        data["bundle"] = asdict(self.bundle)
        data["decisions"] = [asdict(d) for d in self.decisions]
        data["device_groups"] = [list(group) for group in self.device_groups]
        data["submesh_shape"] = list(self.submesh_shape)
        data["inputs"] = dict(self.inputs)
        data["lowered_settings"] = list(self.lowered_settings)
        data["options"] = self.options.model_dump(exclude_none=True)
        data["server"] = self.server.model_dump()
        data["warnings"] = [w.to_dict() for w in self.warnings]
        data["speculative"] = self.speculative.to_dict() if self.speculative else {}
        data["chat"] = dict(self.chat)
        data["pooling"] = self.pooling.to_dict() if self.pooling else {}
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Plan:
        """The plan `to_dict` wrote, typed and frozen (what every engine process reads)."""
        values = dict(data)
        values["decisions"] = [Decision(**d) for d in values.get("decisions", ())]
        values["bundle"] = BundleRef(**values["bundle"])
        values["warnings"] = [
            Diagnostic(**{**w, "severity": Severity(w["severity"])})
            for w in values.get("warnings", ())
        ]
        speculative = values.get("speculative")
        values["speculative"] = SpeculativePlan.from_dict(speculative) if speculative else None
        pooling = values.get("pooling")
        values["pooling"] = (
            PoolingPlan(tuple(pooling["tasks"]), pooling["form"]) if pooling else None
        )
        return cls(**values).freeze()

    def lowered(self, setting: str, asked: Any, effective: Any, limit: str) -> Any:
        """A setting the user asked for and the bundle's target cannot give: decided,
        and a TTB246 warning naming the bundle, the target, the asked value and where the
        limit is written. `limit` is the target's key (`max_model_len`)."""
        reason = f"bundle {self.bundle.label}'s target {self.mesh} supports at most {effective}"
        self.decide(setting, asked, effective, reason)
        self.lowered_settings.append(setting)
        option = "--" + setting.replace("_", "-")
        self.warnings.append(
            Diagnostic(
                "TTB246",
                Severity.WARNING,
                f"{setting} {asked} lowered to {effective}: {reason} "
                f"(targets.{self.mesh}.{limit} in its vllm_metadata.json)",
                hint=f"ask for at most {effective} ({option} {effective}), or serve on a "
                "mesh whose target allows more",
            )
        )
        return effective

    def lowered_length(self) -> tuple[int, int] | None:
        """(asked, effective) when max_model_len was lowered from what the user asked."""
        if "max_model_len" not in self.lowered_settings:
            return None
        d = next(d for d in self.decisions if d.setting == "max_model_len")
        return d.requested, d.effective

    def capped_length(self) -> tuple[int, int] | None:
        """(vLLM's max_model_len, the bundle target's cap) when the target lowered it,
        whether the user asked for more (`lowered_length`) or the checkpoint allows more:
        every length refusal names the cap then."""
        d = next((d for d in self.decisions if d.setting == "max_model_len"), None)
        if d is None or not isinstance(d.requested, int) or d.effective >= d.requested:
            return None
        return d.requested, d.effective

    @property
    def server_options(self) -> ServerOptions:
        """The API server's options in force (image URL fetching)."""
        return self.server

    @property
    def tt_options(self) -> TTOptions:
        """The effective device options (user over target defaults over ours)."""
        return self.options

    def log(self) -> None:
        from ttbundles.serving.registration import short_where

        source = self.bundle.source
        where = short_where(self.bundle.path, source)
        lines = [
            f"ttbundles: serving {self.tt_arch} with {self.bundle.label} "
            f"({source}{'' if source == 'built-in' else ', ' + where}) "
            f"on mesh {self.mesh or 'unset'}:"
        ]
        lines += [f"  {d}" for d in self.decisions]
        if self.evidence_note:
            lines.append(f"  {self.evidence_note}")
        logger.info("\n".join(lines))
        for warning in self.warnings:
            logger.warning(
                "%s ttbundles: %s (fix: %s)", warning.code, warning.message, warning.hint
            )


PLAN_KEY = "ttbundles"  # where the plan travels inside additional_config


def served_plan(vllm_config: VllmConfig) -> Plan | None:
    """The plan the platform stored in the configuration (None: no TT plan was made).

    The one hand-off from the configuration hook to the worker, runner and scheduler: it
    travels inside `additional_config` (the only part of the configuration that reaches
    every process unchanged) and is read back typed here, never by string keys.
    """
    data = (vllm_config.additional_config or {}).get(PLAN_KEY)
    return Plan.from_dict(data) if data else None


def effective_options(vllm_config: VllmConfig) -> TTOptions:
    """The device options in force: the plan's, or (a scheduler or runner built without
    the platform's hook, as in unit tests) the user's over the defaults, checked the same
    way the plan checks them."""
    plan = served_plan(vllm_config)
    if plan is not None:
        return plan.tt_options
    raw = (vllm_config.additional_config or {}).get("tt")
    return parse_tt_options(raw).merged_over(TT_DEFAULTS)
