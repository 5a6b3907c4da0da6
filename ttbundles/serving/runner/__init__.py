"""The model runner: drives a TT generator from vLLM's scheduler output, step by step,
through the real generator contract (`ttbundles.format.contract`). One concept a module:

- `model_runner`: `TTModelRunner`, binding the contract, the slots and per-slot page
  table, the bookkeeping beside the host batch (`serving.compat.host_batch()`), assembling
  each prefill and decode, and sampling;
- `step`: one step's state and the layout of a batch's rows;
- `commands`: what a decode tells the generator (decode contract v1);
- `history`: the penalty history a device sampler rebuilds its state from;
- `readback`: a decode whose tokens are still being read back (async decode);
- `families`: what particular TT-Metal families need passed (`tt_data_parallel`).
- `speculation`: speculative decoding's verify step, accepting it, the next drafts;
- `ngram`: the host n-gram proposer; `rejection`: accepting drafts (greedy, rejection
  sampling).
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
