"""The served side of `ttbundle test`: a bundle run by vLLM's own engine, in this process.

`ttbundle test` runs `python -m ttbundles.serving.harness SPEC.json` (a process of its own,
so registration and the environment are those of a server: EXTRA_MODELS_DIR holds only the
bundle under test, MESH_DEVICE the mesh). vLLM's `LLM` with
`VLLM_ENABLE_V1_MULTIPROCESSING=0` keeps the engine core here; the platform, the phase
scheduler, the worker, the model runner and the bundle's generator class are the ones
`vllm serve` runs, untouched. What is compared is read at two places:

- the logits: the model runner's step observer (`TTModelRunner.observer`), called after
  each prefill_forward / decode_forward returned, with the request of each row and the
  positions it computed. Only host-sampled steps have logits; they are keyed by the
  request's prompt and the step (the position predicted minus the prompt length);
- tokens, cached-token counts and the device's top log-probabilities: vLLM's own outputs;
- the pooled vectors of a pooling bundle: vLLM's `LLM.embed` / `LLM.classify`, each twice,
  with vLLM's head as a request gets it by default (normalised, or the activation) and
  with `use_activation=False` (the raw vector, the logits), with the pooler configuration
  the engine resolved (which pooling the golden must do).

The engines, one after the other (each configured as a server would be for that path):
"host" (sampling on the host: prefill, decode, prefix_cache, perplexity), "chunked"
(a step budget of chunk_size tokens: chunked_prefill), "device" (sample_on_device_mode:
device_sampling), "pool-embed" and "pool-classify" (vLLM's pooling runner, as
`vllm serve --runner pooling --convert TASK` is: pooling_embed, pooling_classify).
Progress goes to the original stdout as JSON lines, anything else
printed here to stderr; the results to `out_dir` (result.json, logits.npz). The process
ends with os._exit: vLLM's interpreter-exit cleanup expects an accelerator.
"""

from __future__ import annotations

import contextlib
import gc
import json
import math
import os
import sys
import time
import traceback
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from ttbundles.format.capabilities import POOLING_PATHS

HOST_RUNS = ("prefill", "decode", "prefix_cache", "perplexity")
# The pooling paths -> the task each asks of vLLM's pooling runner.
POOLING_RUNS = POOLING_PATHS


class Events:
    """JSON lines on the original stdout; fd 1 itself then points at stderr, so that
    nothing vLLM or a generator prints can be mistaken for an event."""

    def __init__(self) -> None:
        self._out = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
        sys.stdout.flush()
        os.dup2(2, 1)

    def emit(self, event: str, **data: Any) -> None:
        self._out.write(json.dumps({"event": event, **data}, default=str) + "\n")
        self._out.flush()


class Recorder:
    """The runner's step observer: every host-sampled step's logits, by prompt and step."""

    def __init__(self, runner: Any):
        self.runner = runner
        self.reset()

    def reset(self) -> None:
        self.logits: dict[tuple[int, ...], dict[int, np.ndarray]] = {}
        self.chunks: Counter[tuple[int, ...]] = Counter()
        self.first_start: dict[tuple[int, ...], int] = {}

    def __call__(
        self, kind: str, req_ids: list[str], starts: list[int], ends: list[int], logits: Any
    ) -> None:
        for row, req_id in enumerate(req_ids):
            state = self.runner.requests.get(req_id)
            if state is None:
                continue
            prompt = tuple(state.prompt_token_ids or ())
            if int(starts[row]) < len(prompt):
                # A call that computed prompt positions: a prefill chunk, or the decode
                # call the runner sends a prompt's last single token through.
                self.chunks[prompt] += 1
                self.first_start.setdefault(prompt, int(starts[row]))
            if logits is None:
                continue
            step = int(ends[row]) - len(prompt)
            if step >= 0:  # an earlier chunk of the prompt predicts nothing that counts
                steps = self.logits.setdefault(prompt, {})
                steps.setdefault(step, logits[row].detach().float().numpy().copy())

    def steps(self, prompt: list[int], count: int, vocab: int) -> np.ndarray:
        """`[count, V]` float32; a step nothing was recorded for is NaN."""
        recorded = self.logits.get(tuple(prompt), {})
        out = np.full((count, vocab), np.nan, dtype=np.float32)
        for step, row in recorded.items():
            if step < count:
                out[step, : row.shape[0]] = row[:vocab]
        return out


def find_runner(llm: Any) -> Any:
    """The TT model runner behind an in-process engine (vLLM 0.33's object graph)."""
    try:
        core = llm.llm_engine.engine_core.engine_core
        return core.model_executor.driver_worker.worker.model_runner
    except AttributeError as exc:
        raise RuntimeError(
            "cannot reach the model runner through the engine: the engine runs in another "
            "process (VLLM_ENABLE_V1_MULTIPROCESSING must be 0) or vLLM's object graph "
            f"changed ({exc})"
        ) from exc


def close(llm: Any) -> None:
    """Shut the engine down now (not at interpreter exit), so the next one can start."""
    # The engine's last teardown step empties an accelerator cache the host mesh lacks.
    with contextlib.suppress(Exception):
        llm.llm_engine.engine_core.shutdown()
    gc.collect()


CONFORMANCE_BLOCK_SIZE = 16
"""The KV block size `ttbundle test` serves with (see `engine_plan`)."""


def pooling_convert(task: str, architectures: list[str]) -> dict[str, str]:
    """The `LLM` arguments that make vLLM pool `task`, as an operator asks a server: the
    pooling runner, and `convert` unless vLLM pools the architecture for that task by
    itself (a `*ForSequenceClassification` classifies)."""
    native = task == "classify" and any(
        a.endswith("ForSequenceClassification") for a in architectures
    )
    return {"runner": "pooling"} if native else {"runner": "pooling", "convert": task}


def engine_plan(
    spec: dict[str, Any],
    lengths: dict[str, int],
    max_positions: int | None,
    architectures: list[str] | None = None,
):
    """`[(name, LLM keyword arguments, runs)]` for the paths asked for."""
    paths = spec["paths"]
    longest = max(lengths.values())
    # A pooling path serves the prompt only; the generation paths decode after it.
    decodes = any(p not in POOLING_RUNS for p in paths)
    need = longest + (2 * spec["max_tokens"] if decodes else 0) + 1
    if spec.get("perplexity_ids"):
        need = max(need, len(spec["perplexity_ids"]) + 1)
    # A reranker's pairs (`Session.scored_pairs`) are two prompts and a separator long:
    # room for them where the caps allow (a pair that does not fit fails on its own).
    room = max(need, 2 * longest + 8) if "pooling_classify" in paths else need
    max_model_len = max(128, 64 * math.ceil(room / 64))
    caps = [c for c in (spec.get("max_model_len"), max_positions) if c]
    if caps:
        if need > min(caps):
            raise ValueError(
                f"the longest test sequence needs {need} tokens; the bundle's target or the "
                f"checkpoint allows {min(caps)}: shorten the prompts or max_tokens"
            )
        max_model_len = min(max_model_len, min(caps))
    max_num_seqs = spec.get("max_num_seqs") or 32
    base = {
        "model": spec["checkpoint"],
        "enforce_eager": True,
        # Small KV blocks, so that the test's short sequences cross block boundaries and
        # every path reads the page table past a sequence's first block, whatever vLLM's
        # default (16 tokens in 0.33.0, 64 in 0.34.0).
        "block_size": spec.get("block_size") or CONFORMANCE_BLOCK_SIZE,
        "seed": 0,
        "max_model_len": max_model_len,
        "max_num_seqs": max_num_seqs,
        "disable_log_stats": True,
    }
    engines = []
    host = [r for r in HOST_RUNS if r in paths or (r == "perplexity" and spec["perplexity_ids"])]
    if host:
        # vLLM's hybrid hook asserts chunked prefill wherever a checkpoint with recurrent
        # layers caches prefixes (before any plan runs); prompts this short stay whole.
        recurrent = "prefix_cache" in paths and _keeps_recurrent_state(spec["checkpoint"])
        engines.append(
            (
                "host",
                {
                    **base,
                    "enable_prefix_caching": "prefix_cache" in paths,
                    "enable_chunked_prefill": recurrent,
                    "additional_config": {"tt": {}},
                },
                host,
            )
        )
    if "chunked_prefill" in paths:
        chunk = spec.get("chunk_size") or max(1, math.ceil(min(lengths.values()) / 2))
        engines.append(
            (
                "chunked",
                {
                    **base,
                    "enable_chunked_prefill": True,
                    "max_num_batched_tokens": chunk,
                    "max_num_seqs": min(max_num_seqs, chunk),
                    "enable_prefix_caching": False,
                    "additional_config": {"tt": {}},
                },
                ["chunked_prefill"],
            )
        )
    if "device_sampling" in paths:
        engines.append(
            (
                "device",
                {
                    **base,
                    "enable_prefix_caching": False,
                    "enable_chunked_prefill": False,
                    "additional_config": {"tt": {"sample_on_device_mode": spec["device_mode"]}},
                },
                ["device_sampling"],
            )
        )
    for path, task in POOLING_RUNS.items():
        if path not in paths:
            continue
        # No KV cache, whole prompts (the pooling plan keeps chunked prefill off).
        pooled = {k: v for k, v in base.items() if k != "block_size"}
        engines.append(
            (
                f"pool-{task}",
                {
                    **pooled,
                    **pooling_convert(task, architectures or []),
                    "enable_prefix_caching": False,
                    "enable_chunked_prefill": False,
                },
                [path],
            )
        )
    return engines


def tokenize(spec: dict[str, Any]) -> tuple[dict[str, list[int]], list[int] | None]:
    """Prompt ids as vLLM tokenizes a text prompt (special tokens added)."""
    try:
        from vllm.tokenizers import get_tokenizer
    except ImportError:  # another vLLM layout: transformers' tokenizer is what it loads
        from transformers import AutoTokenizer as _Auto

        def get_tokenizer(name: str) -> Any:
            return _Auto.from_pretrained(name)

    tokenizer = None
    ids: dict[str, list[int]] = {}
    for prompt in spec["prompts"]:
        if prompt.get("images"):
            continue  # `image_inputs`
        if prompt["token_ids"] is not None:
            ids[prompt["name"]] = list(prompt["token_ids"])
            continue
        tokenizer = tokenizer or get_tokenizer(spec["checkpoint"])
        ids[prompt["name"]] = list(tokenizer.encode(prompt["text"]))
    perplexity = None
    if spec.get("perplexity_text"):
        tokenizer = tokenizer or get_tokenizer(spec["checkpoint"])
        perplexity = list(tokenizer.encode(spec["perplexity_text"]))
    return ids, perplexity


def image_inputs(spec: dict[str, Any]) -> dict[str, tuple[str, list[Any], int]]:
    """Each image prompt as vLLM gets it, `{name: (prompt text, PIL images, prompt
    length)}`: the user message rendered by the checkpoint's chat template (the images,
    then the text), as the chat API renders a message with image parts. The length is the
    checkpoint's processor's (placeholders expanded), for sizing the engine; the token ids
    compared are those vLLM reports it prefilled."""
    prompts = [p for p in spec["prompts"] if p.get("images")]
    if not prompts:
        return {}
    from transformers import AutoProcessor

    from ttbundles.format.prompts import load_image

    processor = AutoProcessor.from_pretrained(spec["checkpoint"])
    out = {}
    for prompt in prompts:
        images = [load_image(i) for i in prompt["images"]]
        content = [{"type": "image"} for _ in images] + [{"type": "text", "text": prompt["text"]}]
        text = processor.apply_chat_template(
            [{"role": "user", "content": content}], add_generation_prompt=True, tokenize=False
        )
        length = len(processor(text=[text], images=images)["input_ids"][0])
        out[prompt["name"]] = (text, images, length)
    return out


def pooler_config(llm: Any) -> dict[str, Any]:
    """What vLLM's pooler does for this engine, as it resolved it from the checkpoint (its
    sentence-transformers files), `--convert` and the architecture's default: the pooling
    of a sequence (LAST, MEAN, CLS) and the classifier's logit calibration. The golden
    pools and calibrates the same way."""
    config = llm.llm_engine.vllm_config.model_config.pooler_config
    return {
        "seq_pooling_type": getattr(config, "seq_pooling_type", None),
        "logit_mean": getattr(config, "logit_mean", None),
        "logit_sigma": getattr(config, "logit_sigma", None),
    }


def _keeps_recurrent_state(checkpoint: str) -> bool:
    """Whether the checkpoint's config.json gives any layer recurrent state."""
    from ttbundles.format.layer_kinds import layer_kinds

    path = Path(checkpoint) / "config.json"
    if not path.is_file():
        return False
    return bool(layer_kinds(json.loads(path.read_text())).recurrent)


def model_config(checkpoint: str) -> dict[str, Any]:
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(checkpoint).to_dict()


class Session:
    """One harness run: engines one after the other, results collected in `self.out`."""

    def __init__(self, spec: dict[str, Any], events: Events):
        self.spec = spec
        self.events = events
        self.arrays: dict[str, np.ndarray] = {}
        self.where = "tokenizing the prompts"
        self.out: dict[str, Any] = {"runs": {}, "engines": []}

    def run(self) -> None:
        from vllm import LLM

        spec = self.spec
        ids, perplexity_ids = tokenize(spec)
        spec["perplexity_ids"] = perplexity_ids
        self.where = "preparing the image prompts"
        self.images = image_inputs(spec)
        config = model_config(spec["checkpoint"])
        self.vocab = int(config.get("vocab_size") or 0)
        self.out["model"] = config
        self.out["prompts"] = [
            {"name": p["name"], "text": p["text"], "token_ids": ids[p["name"]]}
            for p in spec["prompts"]
            if p["name"] in ids
        ]
        self.out["perplexity"] = {"text": spec.get("perplexity_text"), "token_ids": perplexity_ids}
        self.ids = ids
        lengths = {name: len(v) for name, v in ids.items()}
        lengths.update({name: length for name, (_, _, length) in self.images.items()})
        engines = engine_plan(
            spec,
            lengths,
            config.get("max_position_embeddings"),
            list(config.get("architectures") or []),
        )
        total = sum(1 + len(runs) for _, _, runs in engines)
        self.events.emit("plan", total=total, engines=[name for name, _, _ in engines])
        for name, kwargs, runs in engines:
            self.where = f"starting the {name} engine"
            self.events.emit("progress", label=f"starting the {name} engine")
            started = time.perf_counter()
            llm = LLM(**kwargs)
            runner = find_runner(llm)
            pooling = kwargs.get("runner") == "pooling"
            recorder = None if pooling else Recorder(runner)
            if recorder is not None:
                runner.observer = recorder
                self.vocab = self.vocab or int(runner.input_batch.vocab_size)
            cache = llm.llm_engine.vllm_config.cache_config
            sched = llm.llm_engine.vllm_config.scheduler_config
            engine = {
                "name": name,
                "options": {k: v for k, v in kwargs.items() if k != "model"},
                "block_size": cache.block_size,
                "prefix_caching": bool(cache.enable_prefix_caching),
                "chunked_prefill": bool(sched.enable_chunked_prefill),
                "max_num_batched_tokens": sched.max_num_batched_tokens,
                "async_scheduling": bool(sched.async_scheduling),
                "generator": runner.class_name,
                "start_seconds": round(time.perf_counter() - started, 3),
            }
            if pooling:
                engine["pooler"] = pooler_config(llm)
            self.out["engines"].append(engine)
            self.events.emit("advance", label=f"{name} engine started")
            self.llm, self.runner, self.recorder = llm, runner, recorder
            for run in runs:
                self.where = f"the {name} engine, {run}"
                self.events.emit("progress", label=f"{name}: {run}")
                getattr(self, f"run_{run}")()
                self.events.emit("advance", label=f"{name}: {run} done")
            if recorder is not None:
                runner.observer = None
            close(llm)
            del llm, runner
            self.llm = self.runner = self.recorder = None
        for prompt in spec["prompts"]:  # image prompts: the token ids vLLM prefilled
            served = [
                case["context"]
                for run in ("prefill", "decode")
                for case in self.out["runs"].get(run, [])
                if case["prompt"] == prompt["name"] and case.get("images")
            ]
            if served:
                self.out["prompts"].append(
                    {
                        "name": prompt["name"],
                        "text": prompt["text"],
                        "token_ids": served[0],
                        "images": len(prompt["images"]),
                    }
                )

    # --- helpers ------------------------------------------------------------------------

    def generate(self, sequences: list[list[int]], params: Any) -> list[Any]:
        prompts = [{"prompt_token_ids": ids} for ids in sequences]
        return self.llm.generate(prompts, params, use_tqdm=False)

    def greedy(self, max_tokens: int) -> Any:
        from vllm import SamplingParams

        return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)

    def logits_case(self, path: str, name: str, sequence: list[int], output: Any) -> dict:
        """One prompt of a host-sampled path: tokens, logits, what the cache did."""
        tokens = list(output.outputs[0].token_ids)
        key = f"{path}/{name}"
        self.arrays[key] = self.recorder.steps(sequence, len(tokens), self.vocab)
        prompt = tuple(sequence)
        return {
            "prompt": name,
            "context": sequence,
            "tokens": tokens,
            "logits": key,
            "num_cached_tokens": int(getattr(output, "num_cached_tokens", 0) or 0),
            "prefill_chunks": int(self.recorder.chunks.get(prompt, 0)),
            "first_start": int(self.recorder.first_start.get(prompt, 0)),
        }

    def host_path(
        self, path: str, sequences: dict[str, list[int]], max_tokens: int, images: bool = False
    ) -> list:
        """Every sequence greedily, in one batch; with `images`, the image prompts in the
        same batch (mixed prefills), compared on the token ids vLLM prefilled for them."""
        self.recorder.reset()
        prompts: list[dict[str, Any]] = [{"prompt_token_ids": ids} for ids in sequences.values()]
        names = list(sequences)
        if images:
            for name, (text, pictures, _) in self.images.items():
                prompts.append({"prompt": text, "multi_modal_data": {"image": pictures}})
                names.append(name)
        if not prompts:
            return []
        outputs = self.llm.generate(prompts, self.greedy(max_tokens), use_tqdm=False)
        cases = []
        for name, out in zip(names, outputs):
            case = self.logits_case(path, name, list(out.prompt_token_ids), out)
            if name in self.images:
                case["images"] = True
            cases.append(case)
        return cases

    # --- the runs -----------------------------------------------------------------------

    def run_prefill(self) -> None:
        self.llm.reset_prefix_cache()
        self.out["runs"]["prefill"] = self.host_path("prefill", self.ids, 1, images=True)

    def run_decode(self) -> None:
        self.llm.reset_prefix_cache()
        self.out["runs"]["decode"] = self.host_path(
            "decode", self.ids, self.spec["max_tokens"], images=True
        )

    def run_prefix_cache(self) -> None:
        """The decode path's sequences (prompt and continuation) sent again: their full
        blocks come from the prefix cache, the rest is prefilled after them, then as many
        tokens again are decoded."""
        decoded = self.out["runs"].get("decode")
        if decoded is None:  # decode not asked for: its sequences are made here, unreported
            self.llm.reset_prefix_cache()
            self.recorder.reset()
            outputs = self.generate(list(self.ids.values()), self.greedy(self.spec["max_tokens"]))
            decoded = [
                {"prompt": n, "context": s, "tokens": list(o.outputs[0].token_ids)}
                for (n, s), o in zip(self.ids.items(), outputs)
            ]
        sequences = {case["prompt"]: case["context"] + case["tokens"] for case in decoded}
        groups = getattr(self.runner, "kv_groups", None)
        if groups is not None and any(groups.reach):
            # vLLM's hybrid KV-cache manager keeps a sliding-window group's blocks only
            # where a later request can resume, at the end of a prompt (0.34's
            # `replay_boundaries`), never the blocks a decode filled: the sequences are
            # prefilled once as prompts, so each group caches their blocks, and sent again.
            self.generate(list(sequences.values()), self.greedy(1))
        if getattr(self.runner, "snapshots", False):
            # Recurrent state is restored from snapshots taken where a prompt chunk ends
            # on a block boundary: each sequence's whole blocks are prefilled once as a
            # prompt (a snapshot at its end), and the sequence sent again hits them.
            block = self.runner.block_size
            whole = [s[: len(s) // block * block] for s in sequences.values()]
            self.generate([s for s in whole if s], self.greedy(1))
        if getattr(self.runner, "align_state", False):
            # vLLM's "align" mode keeps the recurrent state of a prompt's last block
            # boundary below its last token (and of shared-prefix junctions), not the
            # boundaries a decode crossed: each sequence's whole blocks and one token more
            # are prefilled once as a prompt, and the sequence sent again hits them.
            block = self.runner.block_size
            ahead = [s[: len(s) // block * block + 1] for s in sequences.values()]
            self.generate([s for s in ahead if len(s) > block], self.greedy(1))
        self.out["runs"]["prefix_cache"] = self.host_path(
            "prefix_cache", sequences, self.spec["max_tokens"]
        )

    def run_perplexity(self) -> None:
        ids = self.spec["perplexity_ids"]
        self.llm.reset_prefix_cache()
        self.recorder.reset()
        prefixes = [ids[:i] for i in range(1, len(ids))]
        self.generate(prefixes, self.greedy(1))
        rows = np.stack([self.recorder.steps(p, 1, self.vocab)[0] for p in prefixes])
        self.arrays["perplexity"] = rows
        self.out["runs"]["perplexity"] = {"token_ids": ids, "logits": "perplexity"}

    def run_chunked_prefill(self) -> None:
        self.out["runs"]["chunked_prefill"] = self.host_path(
            "chunked_prefill", self.ids, self.spec["max_tokens"]
        )
        self.out["chunk_size"] = self.out["engines"][-1]["max_num_batched_tokens"]

    def pooled(self, path: str, outputs: dict[str, list[Any]]) -> None:
        """One case per prompt: each served vector (`{kind: outputs}`, in prompt order)
        stored as an array `PATH/PROMPT/KIND`."""
        cases = []
        for i, (name, ids) in enumerate(self.ids.items()):
            vectors = {}
            for kind, served in outputs.items():
                key = f"{path}/{name}/{kind}"
                self.arrays[key] = np.asarray(served[i], dtype=np.float32)
                vectors[kind] = key
            cases.append({"prompt": name, "context": ids, "vectors": vectors})
        self.out["runs"][path] = cases
        self.out.setdefault("pooler", {})[POOLING_RUNS[path]] = self.out["engines"][-1]["pooler"]

    def run_pooling_embed(self) -> None:
        """Every prompt in one batch (the generator pools right-padded rows), twice: as
        `/v1/embeddings` answers by default (normalised by vLLM's head) and with
        `use_activation=False` (the vector the generator pooled)."""
        from vllm import PoolingParams

        if not self.ids:  # image prompts only: they run on the generation paths
            self.out["runs"]["pooling_embed"] = []
            return
        prompts = [{"prompt_token_ids": ids} for ids in self.ids.values()]
        normalised = self.llm.embed(prompts, use_tqdm=False)
        raw = self.llm.embed(
            prompts, use_tqdm=False, pooling_params=PoolingParams(use_activation=False)
        )
        self.pooled(
            "pooling_embed",
            {
                "embedding": [o.outputs.embedding for o in normalised],
                "raw": [o.outputs.embedding for o in raw],
            },
        )

    def run_pooling_classify(self) -> None:
        """Every prompt in one batch, twice: the probabilities `/classify` answers (vLLM's
        activation) and the logits (`use_activation=False`)."""
        from vllm import PoolingParams

        if not self.ids:
            self.out["runs"]["pooling_classify"] = []
            return
        prompts = [{"prompt_token_ids": ids} for ids in self.ids.values()]
        probs = self.llm.classify(prompts, use_tqdm=False)
        logits = self.llm.classify(
            prompts, use_tqdm=False, pooling_params=PoolingParams(use_activation=False)
        )
        self.pooled(
            "pooling_classify",
            {
                "probs": [o.outputs.probs for o in probs],
                "logits": [o.outputs.probs for o in logits],
            },
        )
        self.scored_pairs()

    def scored_pairs(self) -> None:
        """A one-label classifier (a reranker) as `/score` and `/rerank` ask it: the first
        text prompt the query, each other one a document, through vLLM's own pairing
        (`LLM.score`: its separator or concatenation, its template), twice as above. Each
        pair is a case on the token ids vLLM made of it, which the golden reads too."""
        from vllm import PoolingParams

        labels = self.out["model"].get("id2label") or {}
        count = int(self.out["model"].get("num_labels") or len(labels) or 2)
        texts = [
            (p["name"], p["text"])
            for p in self.spec["prompts"]
            if p.get("text") and not p.get("images") and p["name"] in self.ids
        ]
        if count != 1 or len(texts) < 2:
            return
        (query_name, query), documents = texts[0], texts[1:]
        # A pair is the two prompts and a separator: the documents it fits with.
        room = self.llm.llm_engine.vllm_config.model_config.max_model_len
        documents = [
            (name, text)
            for name, text in documents
            if len(self.ids[query_name]) + len(self.ids[name]) + 8 <= room
        ]
        if not documents:
            return
        docs = [text for _, text in documents]
        probs = self.llm.score(query, docs, use_tqdm=False)
        logits = self.llm.score(
            query, docs, use_tqdm=False, pooling_params=PoolingParams(use_activation=False)
        )
        cases = self.out["runs"]["pooling_classify"]
        for (name, _), prob, logit in zip(documents, probs, logits):
            pair = f"{query_name}+{name}"
            vectors = {}
            for kind, output in (("probs", prob), ("logits", logit)):
                key = f"pooling_classify/{pair}/{kind}"
                self.arrays[key] = np.asarray([output.outputs.score], dtype=np.float32)
                vectors[kind] = key
            cases.append(
                {
                    "prompt": pair,
                    "pair": [query_name, name],
                    "context": list(prob.prompt_token_ids),
                    "vectors": vectors,
                }
            )

    def run_device_sampling(self) -> None:
        """Greedy on the device (with the device's top log-probabilities where it returns
        them), then seeded sampling: each prompt alone, then all in one batch."""
        from vllm import SamplingParams

        from ttbundles.serving.stats import STATS

        spec, n = self.spec, self.spec["max_tokens"]
        if not self.ids:  # image prompts only: they run on the host paths
            self.out["runs"]["device_sampling"] = []
            return
        top = int(self.runner.device_support.top_logprobs)
        want = min(5, top) if top else None
        before = dict(STATS.snapshot())
        greedy = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True, logprobs=want)
        greedy_out = self.generate(list(self.ids.values()), greedy)
        sampling = spec["sampling"]

        def seeded(index: int) -> Any:
            return SamplingParams(
                max_tokens=n,
                temperature=sampling["temperature"],
                top_k=sampling["top_k"],
                top_p=sampling["top_p"],
                seed=sampling["seed"] + index,
                ignore_eos=True,
            )

        names = list(self.ids)
        alone = [
            list(self.generate([self.ids[name]], seeded(i))[0].outputs[0].token_ids)
            for i, name in enumerate(names)
        ]
        batch = self.llm.generate(
            [{"prompt_token_ids": self.ids[name]} for name in names],
            [seeded(i) for i in range(len(names))],
            use_tqdm=False,
        )
        after = dict(STATS.snapshot())
        cases = []
        for i, name in enumerate(names):
            out = greedy_out[i].outputs[0]
            logprobs = None
            if want and out.logprobs:
                logprobs = [
                    sorted(
                        ([int(t), float(lp.logprob)] for t, lp in step.items()), key=lambda x: -x[1]
                    )
                    for step in out.logprobs
                ]
            cases.append(
                {
                    "prompt": name,
                    "context": self.ids[name],
                    "tokens": list(out.token_ids),
                    "logprobs": logprobs,
                    "seed": sampling["seed"] + i,
                    "seeded_alone": alone[i],
                    "seeded_batch": list(batch[i].outputs[0].token_ids),
                }
            )
        self.out["runs"]["device_sampling"] = cases
        self.out["device_steps"] = {
            key: int(after.get(key, 0)) - int(before.get(key, 0))
            for key in ("sampling.device", "sampling.host")
        }
        self.out["device_top_logprobs"] = top


def _die_with_parent(parent: int | None) -> None:
    """Ask the kernel (Linux) to kill this process when `ttbundle test` ends, however it
    ends: Ctrl-C while it was still starting this process, or a `kill -9`. A serving
    process is never left running orphaned."""
    if parent is None:
        return
    with contextlib.suppress(OSError, AttributeError):
        import ctypes
        import signal

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:  # it ended before the request took effect
        os._exit(1)


def main(spec_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text(encoding="utf-8"))
    _die_with_parent(spec.get("parent"))
    events = Events()
    os.environ.update(
        {
            **spec.get("env", {}),
            "MESH_DEVICE": spec["mesh"],
            "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
            "EXTRA_MODELS_DIR": spec["models_dir"],
            "TT_VLLM_BUILTIN_MODELS": "0",
        }
    )
    out_dir = Path(spec["out_dir"])
    session = Session(spec, events)
    code = 0
    try:
        session.run()
        np.savez(out_dir / "logits.npz", **session.arrays)
        (out_dir / "result.json").write_text(json.dumps(session.out, default=str))
        events.emit("done")
    except BaseException as exc:  # noqa: BLE001 - reported to the CLI, which renders it
        diagnostics = [d.to_dict() for d in getattr(exc, "diagnostics", [])]
        traceback.print_exc()
        events.emit(
            "error",
            message=f"{type(exc).__name__}: {exc}",
            diagnostics=diagnostics,
            where=session.where,
        )
        code = 1
    sys.stderr.flush()
    os._exit(code)  # vLLM's interpreter-exit cleanup expects an accelerator


if __name__ == "__main__":
    main(sys.argv[1])
