"""The model runner: drives a TT generator from vLLM's scheduler output, step by step,
through the real generator contract (`ttbundles.format.contract`). One concept a module,
as vLLM's own runner (`vllm/v1/worker/gpu/`) keeps them:

- `model_runner`: `TTModelRunner`, the orchestration of each step (execute, prefill,
  decode, verify, sample, drain), over the objects below that it owns;
- `states`: the request states and host batch mirrored from each `SchedulerOutput`
  (vLLM's `states.py`), and the step's rows;
- `slots`: which request holds which device row, per lane;
- `block_table`: the persistent page tables by slot, one per KV-cache group (vLLM's
  `BlockTables`);
- `contract_binding`: the generator's methods bound once, what cannot be driven refused;
- `sample`: what the device sampler is told, device log-probs as vLLM's, prefill logits;
- `images`: a prefill's image inputs;
- `step`: one step's state and the layout of a batch's rows;
- `commands`: what a decode tells the generator (decode contract v1);
- `history`: the penalty history a device sampler rebuilds its state from;
- `readback`: a decode whose tokens are still being read back (async decode), and when
  to drain;
- `families`: what particular TT-Metal families need passed (`tt_data_parallel`);
- `speculation`: speculative decoding's verify inputs, accepting and committing it, the
  next drafts; `ngram`: the host n-gram proposer; `rejection`: accepting drafts (greedy,
  rejection sampling).
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
