"""The pooling runner: vLLM's `--runner pooling` over a generator of either pooling form.

No prefill/decode split, no sampling, no KV cache of vLLM's: each step's new requests are
whole prompts (the plan keeps chunked prefill off and the step budget at least
`max_model_len`), pooled in the step they are scheduled.

- The form `forward`, the reference plugin's design (`TTPoolingModelRunner`): the prompts
  right-padded into one batch, the generator's `forward(input_ids, attention_mask)`
  returns one pooled row per prompt, and what vLLM's pooler does after pooling runs here
  with vLLM's own heads, so each request's pooling parameters mean what they mean in vLLM
  (`normalize`/`use_activation` and `dimensions` for `embed`, the activation and the
  checkpoint's logit calibration for `classify`).
- The form `prefill_hidden`: the generation contract's `prefill_forward`, asked for the
  final hidden states of every prompt position over a cache private to this runner (sized
  for one step's prompts, written again every step), and vLLM's whole pooler on the
  host (`runner.pooler`): pooling method, projector, normalisation, classifier.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import torch

from ttbundles.format import contract
from ttbundles.serving import compat
from ttbundles.serving.binding import GeneratorContractError, bind
from ttbundles.serving.runner.kv.cache import Allocator
from ttbundles.serving.runner.kv.tables import prefill_table
from ttbundles.serving.runner.pooler import build_pooler, pooling_metadata

if TYPE_CHECKING:  # vLLM's types, for annotations only
    from vllm.config import VllmConfig
    from vllm.v1.core.sched.output import SchedulerOutput

    from ttbundles.serving.planning.plan import PoolingPlan

logger = logging.getLogger("vllm.ttbundles")


class TTPoolingRunner:
    """One batch of whole prompts per step through the bundle's pooling form."""

    def __init__(
        self, vllm_config: VllmConfig, generator_cls: type, mesh_device: Any, pooling: PoolingPlan
    ) -> None:
        self.vllm_config = vllm_config
        self.model_config = vllm_config.model_config
        self.generator_cls = generator_cls
        self.class_name = generator_cls.__name__
        self.mesh_device = mesh_device
        self.tasks = tuple(pooling.tasks)
        self.form = pooling.form
        self.max_num_reqs = vllm_config.scheduler_config.max_num_seqs
        self.max_model_len = self.model_config.max_model_len
        self.block_size = vllm_config.cache_config.block_size
        self.generator: Any = None
        self._forward: Any = None
        self._heads: dict[str, Any] = {}
        self._hidden: HiddenStates | None = None
        self.initialize = bind(
            generator_cls,
            contract.INITIALIZE,
            [k for k in contract.INITIALIZE.passes if k != "optimizations"],
            class_name=self.class_name,
        )

    def load_model(self) -> None:
        self.generator = self.initialize(
            hf_config=self.model_config.hf_config,
            mesh_device=self.mesh_device,
            max_batch_size=self.max_num_reqs,
            max_seq_len=self.max_model_len,
            tt_data_parallel=1,
        )
        if self.form == "prefill_hidden":
            self._hidden = HiddenStates.load(self)
            return
        self._forward = bind(
            self.generator,
            contract.POOLING_FORWARD,
            contract.POOLING_FORWARD.passes,
            class_name=self.class_name,
        )
        if self._forward is None:
            raise GeneratorContractError.single(
                "TTB053",
                f"{self.class_name} has no forward(input_ids, attention_mask), which its "
                "bundle's pooling form 'forward' calls",
                hint="implement it (docs/authors/generator-contract.md, pooling)",
            )
        self._heads = {task: self._head(task) for task in self.tasks}

    def _head(self, task: str) -> Any:
        """vLLM's own head for `task`, as its poolers build it (`pooler_for_embed`,
        `pooler_for_classify`), less the pooling the generator did."""
        from vllm.model_executor.layers.pooler.activations import (
            PoolerNormalize,
            resolve_classifier_act_fn,
        )
        from vllm.model_executor.layers.pooler.seqwise.heads import (
            ClassifierPoolerHead,
            EmbeddingPoolerHead,
        )

        if task == "embed":
            return EmbeddingPoolerHead(activation=PoolerNormalize())
        pooler_config = self.model_config.pooler_config
        return ClassifierPoolerHead(
            logit_mean=getattr(pooler_config, "logit_mean", None),
            logit_sigma=getattr(pooler_config, "logit_sigma", None),
            activation=resolve_classifier_act_fn(
                self.model_config, static_num_labels=False, act_fn=None
            ),
        )

    @torch.inference_mode()
    def execute_model(self, scheduler_output: SchedulerOutput) -> Any:
        new = list(scheduler_output.scheduled_new_reqs)
        if not new:
            return compat.model_runner_output([], {}, [], None)
        rows = []
        for request in new:
            tokens = list(request.prompt_token_ids or ())
            scheduled = scheduler_output.num_scheduled_tokens.get(request.req_id, 0)
            if scheduled != len(tokens):
                # The plan keeps chunked prefill off for pooling; a chunk here would be
                # pooled over part of its prompt, so it is a bug, not an answer.
                raise RuntimeError(
                    f"pooling request {request.req_id} was scheduled {scheduled} of its "
                    f"{len(tokens)} prompt tokens; pooling needs whole prompts"
                )
            rows.append(tokens)
        params = [r.pooling_params for r in new]
        for task in {p.task for p in params}:
            if task not in self.tasks:
                raise RuntimeError(f"pooling task {task!r} is not served (served: {self.tasks})")
        if self._hidden is not None:
            outputs = self._hidden.pool(rows, params)
        else:
            outputs = self._pool_forward(rows, params)
        req_ids = [r.req_id for r in new]
        return compat.model_runner_output(
            req_ids,
            {r: i for i, r in enumerate(req_ids)},
            [[] for _ in req_ids],
            None,
            pooler_output=outputs,
        )

    def _pool_forward(self, rows: list[list[int]], params: list[Any]) -> list[torch.Tensor]:
        """The form `forward`: one right-padded batch, one pooled row per prompt, vLLM's
        head per task."""
        longest = max(len(r) for r in rows)
        input_ids = torch.zeros((len(rows), longest), dtype=torch.int64)
        attention_mask = torch.zeros((len(rows), longest), dtype=torch.float32)
        for i, tokens in enumerate(rows):
            input_ids[i, : len(tokens)] = torch.tensor(tokens, dtype=torch.int64)
            attention_mask[i, : len(tokens)] = 1.0
        pooled = self._forward(input_ids=input_ids, attention_mask=attention_mask)
        pooled = torch.as_tensor(pooled).detach().to("cpu", torch.float32)
        if pooled.dim() != 2 or pooled.shape[0] != len(rows):
            raise GeneratorContractError.single(
                "TTB271",
                f"{self.class_name}.forward returned shape {tuple(pooled.shape)} for "
                f"{len(rows)} prompts; the form 'forward' returns one row per prompt "
                "([B, hidden] or [B, num_labels])",
                hint="return a [B, N] tensor, row i pooled over prompt i's tokens",
            )
        outputs: list[torch.Tensor] = [pooled[i] for i in range(len(rows))]
        by_task: dict[str, list[int]] = {}
        for i, p in enumerate(params):
            by_task.setdefault(p.task, []).append(i)
        for task, indices in by_task.items():
            finished = self._heads[task](
                torch.stack([outputs[i] for i in indices]), _Params([params[i] for i in indices])
            )
            for i, row in zip(indices, finished):
                outputs[i] = row
        return outputs

    def take_draft_token_ids(self) -> None:
        """Pooling never speculates: no drafts to hand the scheduler."""
        return None

    def sample_tokens(self, grammar_output: Any) -> Any:
        """Never called: a pooling step's output is whole after `execute_model`."""
        raise RuntimeError("a pooling step has no sampling: its output came from execute_model")

    # --- what the worker asks of every runner (`runner.interface`) ----------------------

    def describe(self) -> str:
        return f"pooling {'+'.join(self.tasks)}, form {self.form!r}, no KV cache of vLLM's"

    def supported_tasks(self) -> tuple[str, ...]:
        # vLLM's API server opens the pooling endpoints of these tasks (the plan's: those
        # the bundle declares and --convert asks for).
        return self.tasks

    def get_kv_cache_spec(self) -> dict[str, Any]:
        """None: vLLM's engine runs a model with no KV cache as attention-free (the form
        `prefill_hidden` keeps a cache of its own, `HiddenStates`)."""
        return {}

    def cache_block_size_bytes(self) -> int:
        return 0

    def determine_available_memory(self) -> int:
        return 0

    def initialize_kv_cache(self, kv_cache_config: Any) -> None:
        """Nothing of vLLM's to take on."""


class _Params:
    """What vLLM's sequence heads read of their `PoolingMetadata`: the requests' pooling
    parameters (the rest, the prompt and the pooling cursor, served the pooling the
    generator already did)."""

    def __init__(self, pooling_params: list[Any]) -> None:
        self.pooling_params = pooling_params


class HiddenStates:
    """The form `prefill_hidden`: `prefill_forward(..., return_hidden_states=True)` over a
    KV cache of this runner's own, then vLLM's pooler.

    The cache holds one step's prompts: a step's prompts are at most the step budget in
    tokens and `max_num_seqs` in number, so `ceil(budget / block_size) + max_num_seqs`
    blocks hold them whole (each row's last block partly filled). Every step overwrites
    it from block 0: a pooling request never returns to its KV."""

    def __init__(self, runner: TTPoolingRunner, prefill: Any, cache: Any, per_layer: int) -> None:
        self.runner = runner
        self.prefill = prefill
        self.kv_cache = cache
        self.per_layer = per_layer  # layers of a per-layer cache (0: one allocation)
        self.pooler = build_pooler(runner.vllm_config, runner.tasks)

    @classmethod
    def load(cls, runner: TTPoolingRunner) -> HiddenStates:
        generator, name = runner.generator, runner.class_name
        prefill = bind(
            generator,
            contract.PREFILL,
            (*contract.PREFILL.passes, contract.HIDDEN_STATES_KEYWORD),
            class_name=name,
        )
        config, parallel = runner.model_config, runner.vllm_config.parallel_config
        sched = runner.vllm_config.scheduler_config
        budget = max(sched.max_num_batched_tokens, runner.max_model_len)
        blocks = -(-budget // runner.block_size) + runner.max_num_reqs
        heads, size = config.get_num_kv_heads(parallel), config.get_head_size()
        shape = (blocks, heads, runner.block_size, size)
        layers = config.get_num_layers(parallel)
        # The generation runner's allocator, in the model's dtype as that runner asks (the
        # reference keeps float32).
        allocator = Allocator.bind(
            generator, name, needed_by="the pooling form 'prefill_hidden' (for its prefill)"
        )
        cache, per_layer = allocator.allocate(shape, config.dtype, layers)
        return cls(runner, prefill, cache, per_layer)

    def pool(self, rows: list[list[int]], params: list[Any]) -> list[torch.Tensor]:
        """Each prompt's pooled output: the hidden states of its positions, flattened
        request after request, through vLLM's pooler."""
        lengths = [len(r) for r in rows]
        longest = max(lengths)
        tokens = torch.zeros((len(rows), longest), dtype=torch.int64)
        blocks: list[list[int]] = []
        for i, prompt in enumerate(rows):
            tokens[i, : len(prompt)] = torch.tensor(prompt, dtype=torch.int64)
            first = sum(len(b) for b in blocks)  # each row's blocks follow the last row's
            blocks.append(list(range(first, first + -(-len(prompt) // self.runner.block_size))))
        # The generation runner's table builder: row r the r-th prompt's blocks.
        page_table = prefill_table(blocks)
        extra = {"page_tables_per_layer": [page_table] * self.per_layer} if self.per_layer else {}
        hidden = self.prefill(
            **extra,
            tokens=tokens,
            page_table=page_table,
            kv_cache=self.kv_cache,
            prompt_lens=torch.tensor(lengths),
            empty_slots=list(range(len(rows))),
            enable_trace=False,
            start_pos=torch.zeros(len(rows), dtype=torch.int64),
            **{contract.HIDDEN_STATES_KEYWORD: True},
        )
        hidden = torch.as_tensor(hidden).detach().to("cpu", torch.float32)
        name = self.runner.class_name
        if hidden.dim() != 3 or hidden.shape[0] != len(rows) or hidden.shape[1] < longest:
            raise GeneratorContractError.single(
                "TTB271",
                f"{name}.prefill_forward returned shape {tuple(hidden.shape)} with "
                f"{contract.HIDDEN_STATES_KEYWORD}=True for {len(rows)} prompts of up to "
                f"{longest} tokens; the form 'prefill_hidden' returns [B, L, hidden]",
                hint="return the final hidden states (after the last norm) of every "
                "position of each row's prompt",
            )
        flat = torch.cat([hidden[i, :n] for i, n in enumerate(lengths)])
        metadata = pooling_metadata(rows, params, self.pooler)
        return list(self.pooler(flat, metadata))
