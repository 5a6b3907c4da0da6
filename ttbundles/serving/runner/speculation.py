"""Speculative decoding in the runner: the verify step's inputs, accepting its output,
and the drafts for the next step (`format.speculative` is the contract).

A verify is the generator's `decode_forward` over `[B, 1+K]`: column 0 of a slot's row
is its last committed token at its next position, columns 1..K its drafts (the
scheduler's `scheduled_spec_decode_tokens`, up to the first placeholder), padded with
`PLACEHOLDER_TOKEN_ID` at position -1; `num_valid_drafts` says where each row's real
columns stop and `accepted_counts` how many tokens its previous step committed (1 after a
prefill or an ordinary step). It writes K/V for every real column; what a rejection
leaves beyond the accepted length is overwritten later, because vLLM's scheduler rolls
`num_computed_tokens` back by the rejected count (nothing to undo here).

The accept mode of a verify (`Speculation.spec_mode`): `argmax_ids` when every row is
greedy and asks for no logprobs, else `logits` (rejection sampling on the host, and
logprobs of each committed token read off the target's logits at its position,
`Speculation.logprobs`).

A step verifies when some row carries a draft, when some row's previous step committed
more than one token, or always when the plan does not offer narrow decode (the
reference plugin's `_step_verifies`); otherwise it is an ordinary decode.

Drafts: `ngram` proposes on the host from each request's tokens (`runner.ngram`);
`custom_class` asks the generator's `propose_draft_tokens` with the step's committed
block. Either way after every step, handed to vLLM by `take_draft_token_ids`; under
asynchronous scheduling vLLM schedules placeholders (-1) and never takes them, so each
request's latest proposal is kept here and fills its next verify's slots (`own_drafts`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ttbundles.format import speculative as spec
from ttbundles.serving.binding import GeneratorContractError
from ttbundles.serving.planning.plan import SpeculativePlan
from ttbundles.serving.runner.ngram import NgramProposer
from ttbundles.serving.runner.rejection import accept_row, is_greedy, target_logits
from ttbundles.serving.runner.step import StepState
from ttbundles.serving.stats import STATS


def check_verify_output(out: Any, mode: str, class_name: str, *, deferred: bool = False) -> None:
    """TTB239 unless the generator answered a verify of `mode` with a `VerifyOutput` of
    that mode (`deferred`: submitted with read_from_device=False, so its tensor is the
    one read_decode_output is handed)."""
    if isinstance(out, spec.VerifyOutput) and out.spec_mode == mode:
        return
    got = getattr(out, "spec_mode", type(out).__name__)
    how = ", read_from_device=False" if deferred else ""
    raise GeneratorContractError.single(
        "TTB239",
        f"{class_name}.decode_forward answered a verify (spec_mode={mode!r}{how}) with "
        f"{got!r}, not a VerifyOutput of that mode",
        hint="return format.speculative.VerifyOutput(spec_mode, argmax_ids=... or "
        "logits=...) when decode_forward gets spec_mode"
        + (", holding the device tensor read_decode_output reads" if deferred else ""),
    )


@dataclass(frozen=True)
class Verify:
    """A verify step's inputs, by slot, and what the accept walk needs back."""

    tokens: torch.Tensor  # [capacity, 1+K] int64
    positions: torch.Tensor  # [capacity, 1+K] int64
    num_valid: torch.Tensor  # [capacity] int32
    accepted_counts: torch.Tensor  # [capacity] int32
    spec_mode: str
    drafts: list[list[int]]  # per batch row, its valid drafts


@dataclass
class Speculation:
    """The runner's speculative state for one launch (`Plan.speculative`)."""

    method: str
    k: int
    accept_modes: tuple[str, ...]
    narrow: bool
    capacity: int
    vocab_size: int
    max_model_len: int = 0
    proposer: NgramProposer | None = None
    # Tokens each request's previous step committed (absent: 1).
    accepted: dict[str, int] = field(default_factory=dict)
    # The drafts proposed after the last step, until vLLM takes them.
    pending: tuple[list[str], list[list[int]]] | None = None
    # Each request's latest proposal: what its next verify checks under asynchronous
    # scheduling, where vLLM schedules placeholders and never takes the drafts.
    proposed: dict[str, list[int]] = field(default_factory=dict)
    # The hidden handle the last verify returned, for propose_draft_tokens.
    hidden: Any = None

    @classmethod
    def from_plan(
        cls, speculative: SpeculativePlan, *, capacity: int, vocab_size: int, max_model_len: int
    ) -> Speculation:
        from ttbundles.serving import compat

        proposer = None
        if speculative.method == "ngram":
            # vLLM's SpeculativeConfig always sets the n-gram window for method ngram.
            assert speculative.prompt_lookup_min is not None
            assert speculative.prompt_lookup_max is not None
            proposer = NgramProposer(
                min_n=speculative.prompt_lookup_min,
                max_n=speculative.prompt_lookup_max,
                k=speculative.k,
                max_model_len=max_model_len,
                style=compat.NGRAM_STYLE,
            )
        return cls(
            method=speculative.method,
            k=speculative.k,
            accept_modes=speculative.accept_modes,
            narrow=speculative.narrow,
            capacity=capacity,
            vocab_size=vocab_size,
            max_model_len=max_model_len,
            proposer=proposer,
        )

    # --- which steps verify -------------------------------------------------------------

    @staticmethod
    def valid_drafts(scheduled: dict[str, list[int]], req_ids: Sequence[str]) -> list[list[int]]:
        """Each row's drafts up to the first placeholder (vLLM pads with -1)."""
        rows = []
        for req_id in req_ids:
            drafts = scheduled.get(req_id) or []
            valid = []
            for token in drafts:
                if token < 0:
                    break
                valid.append(int(token))
            rows.append(valid)
        return rows

    def own_drafts(
        self, scheduled: dict[str, list[int]], req_ids: Sequence[str]
    ) -> list[list[int]]:
        """Under asynchronous scheduling: each row's own latest proposal, cut to the draft
        slots vLLM scheduled for it (placeholders, -1; fewer than K near max_model_len or
        the step's token budget). The scheduler counts every slot as drafted and rolls
        back the ones not accepted, so a shorter proposal is a rejection to it."""
        rows = []
        for req_id in req_ids:
            slots = len(scheduled.get(req_id) or ())
            rows.append(list(self.proposed.get(req_id, ())[:slots]) if slots else [])
        return rows

    def verifies(self, req_ids: Sequence[str], drafts: list[list[int]]) -> bool:
        if not self.narrow or any(drafts):
            return True
        return any(self.accepted.get(r, 1) > 1 for r in req_ids)

    # --- the verify's inputs ------------------------------------------------------------

    def verify_inputs(
        self,
        req_ids: Sequence[str],
        slots: np.ndarray,
        last_tokens: np.ndarray,
        computed: np.ndarray,
        drafts: list[list[int]],
        params: Sequence[Any],
    ) -> Verify:
        """The `[capacity, 1+K]` block: row `slots[i]` holds request i's last committed
        token (`last_tokens[i]`) at position `computed[i]`, then its drafts."""
        width = 1 + self.k
        tokens = torch.full((self.capacity, width), spec.PLACEHOLDER_TOKEN_ID, dtype=torch.int64)
        positions = torch.full((self.capacity, width), -1, dtype=torch.int64)
        tokens[:, 0] = 0  # padding rows: token 0 at position -1
        num_valid = torch.zeros(self.capacity, dtype=torch.int32)
        counts = torch.ones(self.capacity, dtype=torch.int32)
        for i, (req_id, slot) in enumerate(zip(req_ids, slots.tolist())):
            row = drafts[i][: self.k]
            n = len(row)
            tokens[slot, 0] = int(last_tokens[i])
            if n:
                tokens[slot, 1 : 1 + n] = torch.tensor(row, dtype=torch.int64)
            positions[slot, : 1 + n] = torch.arange(int(computed[i]), int(computed[i]) + 1 + n)
            num_valid[slot] = n
            counts[slot] = self.accepted.get(req_id, 1)
        mode = self.spec_mode(params)
        return Verify(tokens, positions, num_valid, counts, mode, [d[: self.k] for d in drafts])

    def spec_mode(self, params: Sequence[Any]) -> str:
        """`argmax_ids` when every row is greedy, asks for no logprobs and the plan offers
        it; `logits` otherwise: sampled rows are accepted by rejection sampling on the
        host, and a row's logprobs are read off the target's logits at each committed
        position (admission refuses what the plan's accept modes cannot serve)."""
        ids_suffice = all(is_greedy(p) and getattr(p, "logprobs", None) is None for p in params)
        if ids_suffice and spec.ACCEPT_MODE_ARGMAX_IDS in self.accept_modes:
            return spec.ACCEPT_MODE_ARGMAX_IDS
        return spec.ACCEPT_MODE_LOGITS

    # --- accepting ----------------------------------------------------------------------

    def accept(
        self,
        out: Any,
        verify: Verify,
        slots: np.ndarray,
        params: Sequence[Any],
        positions: np.ndarray,
        class_name: str,
    ) -> list[list[int]]:
        """The tokens each row commits, from the generator's `VerifyOutput`."""
        check_verify_output(out, verify.spec_mode, class_name)
        self.hidden = out.hidden
        committed: list[list[int]] = []
        if verify.spec_mode == spec.ACCEPT_MODE_ARGMAX_IDS:
            ids = torch.as_tensor(out.argmax_ids).reshape(self.capacity, -1)
            for drafts, slot in zip(verify.drafts, slots.tolist()):
                chosen = ids[slot, : len(drafts) + 1].tolist()
                row: list[int] = []
                for j, token in enumerate(chosen):
                    row.append(int(token))
                    if j == len(drafts) or token != drafts[j]:
                        break
                committed.append(row)
        else:
            logits = torch.as_tensor(out.logits)
            logits = logits.reshape(self.capacity, -1, logits.shape[-1])
            for drafts, slot, p, position in zip(
                verify.drafts, slots.tolist(), params, positions.tolist()
            ):
                committed.append(
                    accept_row(drafts, logits[slot, : len(drafts) + 1], p, position=position)
                )
        for row in committed:
            bad = [t for t in row if not 0 <= t < self.vocab_size]
            if bad:
                raise GeneratorContractError.single(
                    "TTB239",
                    f"{class_name}: the verify chose token ids outside the vocabulary "
                    f"({bad[:4]}, vocabulary {self.vocab_size})",
                    hint="return argmax ids of the target's logits at every real column",
                )
        return committed

    def logprobs(
        self,
        out: Any,
        slots: np.ndarray,
        committed: Sequence[Sequence[int]],
        params: Sequence[Any],
        score: Callable[..., Any],
        *,
        processed: bool,
    ) -> Any:
        """vLLM's logprobs of a `logits`-mode verify's committed tokens, one row per
        token (`compat.verify_logprobs`), or None when no row asks.

        Committed token j of a row was chosen at candidate position j (an accepted draft,
        the correction or recovered token at the first rejection, or the bonus), so its
        row is scored from the target's logits there, by `score` (the host batch's
        `logprobs`: what this server's host sampler reports for an ordinary decode, raw
        log-softmax by default), the same for every row of the step as vLLM's sampler
        scores every row when one asks. `processed`: the server reports processed
        logprobs (`--logprobs-mode processed_*`), those of the logits the acceptance
        drew from (`rejection.target_logits`)."""
        from ttbundles.serving import compat

        if not any(p is not None and p.logprobs is not None for p in params):
            return None
        logits = torch.as_tensor(out.logits)
        logits = logits.reshape(self.capacity, -1, logits.shape[-1])
        rows = [logits[slot, : len(tokens)] for slot, tokens in zip(slots.tolist(), committed)]
        raw = torch.cat(rows).float()
        flat_params = [p for p, tokens in zip(params, committed) for _ in tokens]
        changed = None
        if processed:
            changed = torch.cat([target_logits(r, p) for r, p in zip(rows, params)])
        tokens = torch.tensor([t for row in committed for t in row], dtype=torch.int64)
        tensors = score(raw, tokens, flat_params, processed=changed)
        return compat.verify_logprobs(tensors, [len(row) for row in committed])

    # --- what was committed, and the next drafts ----------------------------------------

    def committed(self, req_ids: Sequence[str], sampled: Sequence[Sequence[int]]) -> None:
        for req_id, tokens in zip(req_ids, sampled):
            self.accepted[req_id] = max(len(tokens), 1)

    def reset(self, req_id: str) -> None:
        """A prefill (or a finished request): back to the post-prefill count of 1."""
        self.accepted.pop(req_id, None)
        self.proposed.pop(req_id, None)

    def _hold(self, req_ids: Sequence[str], drafts: list[list[int]]) -> None:
        """This step's proposals: for vLLM to take, and each request's own."""
        self.pending = (list(req_ids), drafts)
        self.proposed.update(zip(req_ids, drafts))

    def propose_ngram(
        self,
        req_ids: Sequence[str],
        sampled: Sequence[Sequence[int]],
        batch: Any,
    ) -> None:
        """Drafts from each request's own tokens (after this step's commit), none for a
        row that sampled nothing (an incomplete prompt)."""
        assert self.proposer is not None
        index = batch.req_id_to_index
        drafts: list[list[int]] = []
        for req_id, tokens in zip(req_ids, sampled):
            row = index.get(req_id)
            if not tokens or row is None:
                drafts.append([])
                continue
            count = int(batch.num_tokens_no_spec[row])
            drafts.append(self.proposer.propose(batch.token_ids_cpu[row, :count]))
        self._hold(req_ids, drafts)

    def propose_model(
        self,
        propose: Any,
        req_ids: Sequence[str],
        slots: np.ndarray,
        sampled: Sequence[Sequence[int]],
        first_positions: np.ndarray,
        class_name: str,
    ) -> None:
        """Ask the generator's drafter, with this step's committed block by slot: row
        `slots[i]` holds request i's committed tokens at their positions, the rest of
        the block `PLACEHOLDER_TOKEN_ID` at position -1."""
        width = 1 + self.k
        tokens = torch.full((self.capacity, width), spec.PLACEHOLDER_TOKEN_ID, dtype=torch.int32)
        positions = torch.full((self.capacity, width), -1, dtype=torch.int32)
        counts = torch.ones(self.capacity, dtype=torch.int32)
        live = []
        for i, (slot, row) in enumerate(zip(slots.tolist(), sampled)):
            if not row:
                continue
            n = min(len(row), width)
            tokens[slot, :n] = torch.tensor(row[:n], dtype=torch.int32)
            start = int(first_positions[i])
            positions[slot, :n] = torch.arange(start, start + n, dtype=torch.int32)
            counts[slot] = n
            live.append(i)
        # Positionally, as the contract calls it (`contract.PROPOSE_DRAFT_TOKENS`).
        out = propose(self.k, tokens, positions, counts, hidden=self.hidden)
        self.hidden = None
        ids, valid = self._checked_drafts(out, class_name)
        drafts: list[list[int]] = [[] for _ in req_ids]
        for i in live:
            slot = int(slots[i])
            # As the n-gram proposer: no draft past max_model_len (the request holds
            # the committed tokens through position first + len - 1).
            room = self.max_model_len - (int(first_positions[i]) + len(sampled[i]))
            drafts[i] = ids[slot, : max(0, min(int(valid[slot]), room))].tolist()
        self._hold(req_ids, drafts)

    def _checked_drafts(self, out: Any, class_name: str) -> tuple[torch.Tensor, torch.Tensor]:
        """A `DraftOutput`'s ids `[capacity, K]` and counts `[capacity]`, checked for
        dtype, shape and range before vLLM stores them (a stored draft is verified next
        step and committed if the target agrees)."""

        def refuse(what: str) -> GeneratorContractError:
            return GeneratorContractError.single(
                "TTB239",
                f"{class_name}.propose_draft_tokens returned {what}",
                hint=f"return DraftOutput(draft_token_ids [B, {self.k}] int32 within the "
                f"vocabulary, num_valid [B] int32 in 0..{self.k} or None)",
            )

        if not isinstance(out, spec.DraftOutput):
            raise refuse(f"{type(out).__name__}, not a DraftOutput")
        ids = torch.as_tensor(out.draft_token_ids)
        if ids.is_floating_point() or tuple(ids.shape) != (self.capacity, self.k):
            raise refuse(f"draft_token_ids of {ids.dtype} {tuple(ids.shape)}")
        if out.num_valid is None:
            valid = torch.full((self.capacity,), self.k, dtype=torch.int64)
        else:
            valid = torch.as_tensor(out.num_valid)
            if valid.is_floating_point() or tuple(valid.shape) != (self.capacity,):
                raise refuse(f"num_valid of {valid.dtype} {tuple(valid.shape)}")
            if bool(((valid < 0) | (valid > self.k)).any()):
                raise refuse(f"num_valid outside 0..{self.k}: {valid.tolist()[:8]}")
        offered = torch.arange(self.k)[None, :] < valid[:, None]
        if bool(((ids < 0) | (ids >= self.vocab_size))[offered].any()):
            raise refuse("offered draft ids outside the vocabulary")
        return ids.long(), valid.long()

    def take(self) -> tuple[list[str], list[list[int]]] | None:
        pending, self.pending = self.pending, None
        return pending

    # --- the runner's verify step: what it commits, and the next drafts ---------------

    def commit_verify(
        self, step: StepState, batch: Any, class_name: str, *, processed_logprobs: bool
    ) -> tuple[list[list[int]], Any]:
        """A verify read back: each row's committed tokens (accepted drafts and the
        bonus token), and their logprobs where a row asked (a logits-mode verify)."""
        layout = step.layout
        committed = self.accept(
            step.verify_out, step.verify, layout.slots, layout.params, step.positions, class_name
        )
        STATS.count("speculative.committed_tokens", sum(len(c) for c in committed))
        logprobs = None
        if layout.any_logprobs:  # a logits-mode verify (`spec_mode`)
            logprobs = self.logprobs(
                step.verify_out,
                layout.slots,
                committed,
                layout.params,
                batch.logprobs,
                processed=processed_logprobs,
            )
        return committed, logprobs

    def after_commit(
        self,
        step: StepState,
        sampled: list[list[int]],
        batch: Any,
        propose: Callable[..., Any] | None,
        class_name: str,
    ) -> None:
        """Record what each row committed and propose its next drafts."""
        self.committed(step.req_ids, sampled)
        if self.method == "ngram":
            self.propose_ngram(step.req_ids, sampled, batch)
        else:
            self.propose_model(
                propose, step.req_ids, step.layout.slots, sampled, step.positions, class_name
            )

    def computed_under_async(
        self, computed: np.ndarray, totals: np.ndarray, batch: Any
    ) -> np.ndarray:
        """Each row's computed tokens as the runner knows them, under asynchronous
        scheduling with speculation. vLLM's scheduler builds a step before it has the
        previous one's acceptance: it counts that step's drafts (placeholders) as
        computed and rolls the rejected ones back only when the output arrives. The step
        before was drained (a verify is never overlapped), so a decoding row's committed
        tokens are all on the host and every one but the last is computed; a row in
        prefill has the scheduler's exact count (no drafts). Written back into the batch,
        where the rest of the step reads it."""
        known = np.minimum(computed, totals - 1)
        if (known != computed).any():
            STATS.count("speculative.async_rollback")
            batch.num_computed_tokens_cpu[: len(known)] = known
        return known


def verify_block(out: Any, mode: str, class_name: str) -> Any:
    """The device tensor of a deferred verify's `VerifyOutput` (its `argmax_ids` or
    `logits`), the one `read_decode_output` is handed."""
    check_verify_output(out, mode, class_name, deferred=True)
    return out.argmax_ids if mode == spec.ACCEPT_MODE_ARGMAX_IDS else out.logits


def read_back_verify(step: StepState, block: Any, capacity: int) -> None:
    """A deferred verify read back: its host block (`[B, 1+K]` ids or `[B, 1+K, V]`
    logits, in whatever shape `process_decode_output_host` gave it) put in a host
    `VerifyOutput` with the hidden handle the verify returned, on the step, which is then
    accepted and committed as a synchronous verify is."""
    verify = step.verify
    width = int(verify.tokens.shape[1])
    hidden = getattr(step.verify_out, "hidden", None)
    host = torch.as_tensor(block)
    if verify.spec_mode == spec.ACCEPT_MODE_ARGMAX_IDS:
        out = spec.VerifyOutput(
            verify.spec_mode, argmax_ids=host.reshape(capacity, width), hidden=hidden
        )
    else:
        out = spec.VerifyOutput(
            verify.spec_mode, logits=host.reshape(capacity, width, -1), hidden=hidden
        )
    step.verify_out = out
    step.readback = None
