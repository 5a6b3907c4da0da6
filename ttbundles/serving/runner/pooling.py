"""The pooling runner: vLLM's `--runner pooling` over a generator of the `forward` form.

The reference plugin's design (`TTPoolingModelRunner`): no KV cache, no page tables, no
prefill/decode split, no sampling. Each step's new requests are whole prompts (the plan
keeps chunked prefill off and the step budget at least `max_model_len`), right-padded
into one batch, and the generator's `forward(input_ids, attention_mask)` returns one
pooled row per prompt. What vLLM's pooler does after pooling runs here on the host with
vLLM's own heads, so each request's pooling parameters mean what they mean in vLLM:
`normalize`/`use_activation` and `dimensions` for `embed`, the activation (softmax, or
sigmoid for one label) and the checkpoint's logit calibration for `classify`.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import torch

from ttbundles.format import contract
from ttbundles.serving import compat
from ttbundles.serving.binding import GeneratorContractError, bind

if TYPE_CHECKING:  # vLLM's types, for annotations only
    from vllm.config import VllmConfig
    from vllm.v1.core.sched.output import SchedulerOutput

logger = logging.getLogger("vllm.ttbundles")


class TTPoolingRunner:
    """One batch of whole prompts per step through `forward`; vLLM's heads finish."""

    def __init__(
        self, vllm_config: VllmConfig, generator_cls: type, mesh_device: Any, tasks: list[str]
    ) -> None:
        self.vllm_config = vllm_config
        self.model_config = vllm_config.model_config
        self.generator_cls = generator_cls
        self.class_name = generator_cls.__name__
        self.mesh_device = mesh_device
        self.tasks = tuple(tasks)
        self.max_num_reqs = vllm_config.scheduler_config.max_num_seqs
        self.max_model_len = self.model_config.max_model_len
        self.generator: Any = None
        self._forward: Any = None
        self._heads: dict[str, Any] = {}
        # Requests seen but not finished (a request pools in the step it is scheduled).
        self._pending: set[str] = set()
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
        for req_id in scheduler_output.finished_req_ids:
            self._pending.discard(req_id)
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
        for i, request in enumerate(new):
            by_task.setdefault(request.pooling_params.task, []).append(i)
        for task, indices in by_task.items():
            head = self._heads.get(task)
            if head is None:
                raise RuntimeError(f"pooling task {task!r} is not served (served: {self.tasks})")
            params = [new[i].pooling_params for i in indices]
            finished = head(torch.stack([outputs[i] for i in indices]), _Params(params))
            for i, row in zip(indices, finished):
                outputs[i] = row
        req_ids = [r.req_id for r in new]
        return compat.model_runner_output(
            req_ids,
            {r: i for i, r in enumerate(req_ids)},
            [[] for _ in req_ids],
            None,
            pooler_output=outputs,
        )

    def take_draft_token_ids(self) -> None:
        """Pooling never speculates: no drafts to hand the scheduler."""
        return None


class _Params:
    """What vLLM's sequence heads read of their `PoolingMetadata`: the requests' pooling
    parameters (the rest, the prompt and the pooling cursor, served the pooling the
    generator already did)."""

    def __init__(self, pooling_params: list[Any]) -> None:
        self.pooling_params = pooling_params
