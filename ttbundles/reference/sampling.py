"""Sampling on the "device": the reference generator's sampler and its per-slot state.

What a TT-Metal sampler keeps per batch slot lives here too, so the host mesh exercises
the same commands a card needs (`models/common/decode_contract.py`):

- parameters (temperature, top-k, top-p, penalties, log-probs), uploaded by
  `reload_sampling_params`;
- the seed and its counter: `reload_sampling_params` registers a seed when it differs
  from the one held (conditional), `reset_sampling_state` re-registers every slot's
  unconditionally (a slot without a seed gets a fresh random stream) and aligns the
  counter to the slot's position; each sampled token advances it once;
- the penalty history (prompt tokens, output-token counts), rebuilt by
  `reset_sampling_state` from the `prompt_tokens` / `output_tokens` the worker sends and
  advanced by every sampled token.

A seeded slot draws the token for position p from a generator keyed on (seed, p): the same
seed gives the same tokens whatever else is in the batch and however it is ordered, as
long as the worker sends the commands that keep seed and counter right.

Penalties follow vLLM's (`vllm/model_executor/layers/utils.py`): repetition over prompt
and output tokens, then frequency and presence over output tokens. Log-probabilities are
of the raw logits (vLLM's default `raw_logprobs`), top `max_device_logprobs` per row.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ttbundles.format.contract import SamplingParams, seed_for_position

MAX_DEVICE_TOP_K = 20
"""How many top log-probabilities the reference returns per row that asks for them."""


def seeded_generator(seed: int, position: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed_for_position(seed, position))


def filtered_probs(
    logits: torch.Tensor, temperature: float, top_k: int, top_p: float
) -> torch.Tensor:
    """Sampling distribution `[V]` of one row, as vLLM's sampler computes it
    (`vllm/v1/sample/ops/topk_topp_sampler.py`): temperature, then top-k (keep what is at
    least the k-th largest), then top-p (drop the least likely tokens whose cumulative
    probability stays within 1 - top_p; the most likely one always stays), then softmax.

    top_k < 1 or >= V: no cut. top_p >= 1: no cut.
    """
    scaled = logits / temperature
    vocab = scaled.shape[-1]
    if 0 < top_k < vocab:
        kth_largest = torch.topk(scaled, top_k).values[-1]
        scaled = scaled.masked_fill(scaled < kth_largest, float("-inf"))
    if top_p < 1.0:
        ascending, order = scaled.sort()
        cumulative = ascending.softmax(dim=-1).cumsum(dim=-1)
        drop = cumulative <= 1 - top_p
        drop[-1] = False
        scaled = scaled.scatter(0, order, ascending.masked_fill(drop, float("-inf")))
    return scaled.softmax(dim=-1, dtype=torch.float32)


def draw(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    """One token from `probs [V]` by the exponential race vLLM's sampler runs
    (`random_sample`: argmax of probs / q, q ~ Exp(1) from the row's generator)."""
    q = torch.empty_like(probs).exponential_(generator=generator)
    return int((probs / q).argmax())


def apply_penalties(
    logits: torch.Tensor, params: SamplingParams, prompt: torch.Tensor, output_counts: torch.Tensor
) -> torch.Tensor:
    """One row's logits `[V]` after repetition, frequency and presence penalties (vLLM's
    order): `prompt` holds the prompt's token ids, `output_counts [V]` how often each token
    was generated so far."""
    repetition = float(params.repetition_penalty)
    frequency = float(params.frequency_penalty)
    presence = float(params.presence_penalty)
    if repetition == 1.0 and frequency == 0.0 and presence == 0.0:
        return logits
    logits = logits.clone()
    seen = output_counts > 0
    if repetition != 1.0:
        seen_any = seen.clone()
        seen_any[prompt[(prompt >= 0) & (prompt < logits.shape[0])]] = True
        penalised = torch.where(logits > 0, logits / repetition, logits * repetition)
        logits = torch.where(seen_any, penalised, logits)
    logits = logits - frequency * output_counts.float() - presence * seen.float()
    return logits


@dataclass
class SlotState:
    """What the sampler keeps for one batch slot between decodes."""

    params: SamplingParams = field(default_factory=lambda: SamplingParams(0.0, 1, 1.0))
    seed: int | None = None
    counter: int = 0  # the position the next drawn token takes; keys seeded draws
    stream: torch.Generator | None = None  # unseeded slots draw from their own stream
    prompt: torch.Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.int64))
    output_counts: torch.Tensor | None = None  # [V] int64, allocated on first use

    def reseed(self, seed: int | None) -> None:
        self.seed = seed
        self.stream = None
        if seed is None:
            self.stream = torch.Generator()
            self.stream.seed()


class DeviceSampler:
    """The reference's on-device sampler for `capacity` slots of a vocabulary of `vocab`."""

    def __init__(self, capacity: int, vocab: int):
        self.vocab = vocab
        self.slots = [SlotState() for _ in range(capacity)]

    def ensure_capacity(self, capacity: int) -> None:
        while len(self.slots) < capacity:
            self.slots.append(SlotState())

    # ---- commands -----------------------------------------------------------------------

    def remap(self, slot_remap: list[int]) -> None:
        """`slot_remap[i] = j`: slot i takes the state slot j holds now (applied once)."""
        old = list(self.slots)
        for i, j in enumerate(slot_remap):
            self.slots[i] = old[int(j)]

    def reload_params(self, slots: list[int], params: SamplingParams, positions: list[int]) -> None:
        """Upload parameters; register a seed where it differs from the one held.

        Row r of `params` and `positions` belongs to slot `slots[r]`; a slot of -1 is a
        padding row. `positions[r]` is the position the slot's next token takes.
        """
        for row, slot in enumerate(slots):
            if slot < 0:
                continue
            state = self.slots[slot]
            wanted = params.row(row)
            state.params = wanted
            if wanted.seed != state.seed or (wanted.seed is None and state.stream is None):
                state.reseed(wanted.seed)
                state.counter = positions[row]

    def reset_state(
        self,
        slots: list[int],
        params: SamplingParams,
        positions: list[int],
        prompt_tokens: torch.Tensor | None,
        output_tokens: torch.Tensor | None,
    ) -> None:
        """Rebuild every listed slot's seed, counter and penalty history (rows as in
        `reload_params`; `prompt_tokens` / `output_tokens` are `[B, L]`, -1 padded)."""
        for row, slot in enumerate(slots):
            if slot < 0:
                continue
            state = self.slots[slot]
            state.reseed(params.row(row).seed)
            state.counter = positions[row]
            state.prompt = _history(prompt_tokens, row)
            counts = torch.zeros(self.vocab, dtype=torch.int64)
            history = _history(output_tokens, row)
            history = history[(history >= 0) & (history < self.vocab)]
            counts.index_add_(0, history, torch.ones_like(history))
            state.output_counts = counts

    # ---- sampling -----------------------------------------------------------------------

    def sample(
        self, logits: torch.Tensor, slots: list[int], grammar_bitmask: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor] | None]:
        """Tokens `[B]` for logits `[B, V]` (row i in slot `slots[i]`), and the top
        log-probabilities `([B, K], [B, K])` when any row asked for them (else None).
        Padding rows (slot -1) get token 0. `grammar_bitmask` (`[B, W]` packed int32, the
        contract's `grammar_bitmask`) masks each row's disallowed tokens first, as vLLM
        masks the logits before its sampler."""
        if grammar_bitmask is not None:
            logits = apply_bitmask(logits, grammar_bitmask)
        greedy = torch.argmax(logits, dim=-1).tolist()  # every row's argmax, in one call
        tokens = [0] * logits.shape[0]
        want_logprobs = False
        for i, slot in enumerate(slots):
            if slot < 0:
                continue
            state = self.slots[slot]
            params = state.params
            want_logprobs |= bool(params.enable_log_probs)
            row = logits[i]
            penalised = state.output_counts is not None
            if penalised:
                row = apply_penalties(row, params, state.prompt, state.output_counts)
            temperature = float(params.temperature)
            if temperature <= 0.0:
                token = int(torch.argmax(row)) if penalised else greedy[i]
            else:
                probs = filtered_probs(row, temperature, int(params.top_k), float(params.top_p))
                generator = (
                    state.stream
                    if state.seed is None
                    else seeded_generator(int(state.seed), state.counter)
                )
                token = draw(probs, generator)
            tokens[i] = token
            state.counter += 1
            if state.output_counts is not None and 0 <= token < self.vocab:
                state.output_counts[token] += 1
        logprobs = None
        if want_logprobs:
            enabled = [s >= 0 and bool(self.slots[s].params.enable_log_probs) for s in slots]
            logprobs = top_logprobs(logits, enabled)
        return torch.tensor(tokens, dtype=torch.int64), logprobs


def apply_bitmask(logits: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
    """`logits [B, V]` with -inf where row b's packed `bitmask [B, W]` has token t's bit
    (bit t % 32 of word t // 32) clear, as vLLM's `apply_grammar_bitmask`; tokens past
    the mask's 32 * W are disallowed. An all-ones row (-1 words) leaves its row as it is."""
    vocab = logits.shape[-1]
    packed = torch.as_tensor(bitmask).to(torch.int64)[: logits.shape[0]]
    tokens = torch.arange(min(vocab, packed.shape[-1] * 32))
    allowed = torch.zeros((logits.shape[0], vocab), dtype=torch.bool)
    bits = (packed[:, tokens // 32] >> (tokens % 32)) & 1
    allowed[: packed.shape[0], : len(tokens)] = bits.bool()
    allowed[packed.shape[0] :] = True
    return logits.masked_fill(~allowed, float("-inf"))


def top_logprobs(
    logits: torch.Tensor, enabled: list[bool], k: int = MAX_DEVICE_TOP_K
) -> tuple[torch.Tensor, torch.Tensor]:
    """`(top_logprobs [B, K] float32, top_token_ids [B, K] int64)` of the raw logits;
    rows that did not ask are zeros."""
    k = min(k, logits.shape[-1])
    values, indices = torch.log_softmax(logits.float(), dim=-1).topk(k, dim=-1)
    mask = torch.tensor(enabled, dtype=torch.bool)[:, None]
    return values.masked_fill(~mask, 0.0), indices.masked_fill(~mask, 0)


def _history(tokens: torch.Tensor | None, row: int) -> torch.Tensor:
    """Row `row` of a padded `[B, L]` history (-1 pads), as a 1-D tensor without pads."""
    if tokens is None or row >= tokens.shape[0]:
        return torch.zeros(0, dtype=torch.int64)
    values = torch.as_tensor(tokens[row]).reshape(-1).long()
    return values[values >= 0]
