"""The model runner: drives a TT generator from vLLM's scheduler output, step by step,
through the real generator contract (`ttbundles.format.contract`). One concept a module,
as vLLM's own runner (`vllm/v1/worker/gpu/`) keeps them:

- `interface`: the one surface the worker drives (`Runner`) and the one choice of runner
  (`make_runner`: generation or pooling);
- `model_runner`: `TTModelRunner`, the orchestration of each step (execute, prefill,
  decode, verify, sample, drain), over the objects below that it owns;
- `pooling`: `TTPoolingRunner`, vLLM's pooling runner over either pooling form, and
  `pooler`: vLLM's own pooler over the hidden states a generator returns;
- `kv/`: the KV cache, every kind of it (layer groups, sizing, allocation, page tables);
- `states`: the request states and host batch mirrored from each `SchedulerOutput`
  (vLLM's `states.py`), and the step's rows;
- `slots`: which request holds which device row, per lane;
- `contract_binding`: the generator's methods bound once, what cannot be driven refused;
- `sample`: what the device sampler is told, device log-probs as vLLM's, prefill logits;
  `sampling_path`: where each request is sampled (device or host, and why);
- `prompt_logprobs`: prompt log-probabilities from a prefill's every-position logits;
- `outputs`: a step's `ModelRunnerOutput`, committed tokens and log-probs;
- `images`: a prefill's image inputs; `pixel_store`: the pixels of images in flight;
- `step`: one step's state and the layout of a batch's rows;
- `commands`: what a decode tells the generator (decode contract v1);
- `history`: the penalty history a device sampler rebuilds its state from;
- `readback`: a decode whose tokens are still being read back (async decode), and when
  to drain;
- `families`: what particular TT-Metal families need passed (`tt_data_parallel`);
- `speculation`: speculative decoding's verify inputs, accepting and committing it, the
  next drafts; `ngram`: the host n-gram proposer; `rejection`: accepting drafts (greedy,
  rejection sampling).

From configuration time it takes only the plan (`planning.plan`); what it shares with the
lane coordinator is `serving.lane_output` (`tests/test_architecture.py`).
"""

from ttbundles.serving.runner.commands import DecodeCommands
from ttbundles.serving.runner.families import tt_data_parallel
from ttbundles.serving.runner.model_runner import TTModelRunner
from ttbundles.serving.runner.readback import TTAsyncOutput
from ttbundles.serving.runner.step import EMPTY_POSITION, StepObserver

__all__ = [
    "EMPTY_POSITION",
    "DecodeCommands",
    "StepObserver",
    "TTAsyncOutput",
    "TTModelRunner",
    "tt_data_parallel",
]
