"""What `ttbundle test` runs: the bundle's `tests` section, its defaults, the command line.

The plan is resolved once, here, without vLLM or torch: which prompts (texts and the
prompt file), which serving paths (the bundle's capabilities decide the default; a path
the bundle does not declare is an error, TTB110), how many tokens, the seeded sampling
and the thresholds. The serving side (`serving.harness`) gets it as one JSON document.

A bundle that pools (`capabilities.pooling`) gets a pooling path per task it declares
(`pooling_embed`, `pooling_classify`), whatever `tests.paths` says (the schema's list
names generation paths only); one of the form 'forward' has no generation path at all.

A checkpoint with a sliding window is tested past it (`cover_window`): short prompts
attend in full whatever the generator does with the window, so a run whose prompts all
fit in it proves nothing of the windowed layers. Unless a prompt is surely longer, the
plan adds one (`window`, of `WINDOW_WORDS` repeated), or says why it cannot (the
target's length, a recorded golden); the run then reports which prompts crossed it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ttbundles.check.tests_section import (
    POOLING_PATHS,
    declares,
    image_prompt_problems,
    path_problems,
)
from ttbundles.errors import Diagnostic, InvalidBundleError, Severity
from ttbundles.format.meshes import HOST, canonical
from ttbundles.format.metadata import TEST_PATHS, BundleMetadata, BundleTests
from ttbundles.format.prompts import (
    DEFAULT_PROMPTS,
    Prompt,
    PromptFileError,
    image_prompts,
    read_prompt_file,
    text_prompts,
)

# The paths whose logits are read on the host (sampling on the host); perplexity runs
# with them, in the same engine.
HOST_PATHS = ("prefill", "decode", "prefix_cache")


ALL_PATHS: tuple[str, ...] = (*TEST_PATHS, *POOLING_PATHS)
"""Every path `--path` may name: the generation paths, then the pooling ones."""


def default_paths(metadata: BundleMetadata) -> list[str]:
    """Every path the bundle declares, in ALL_PATHS order."""
    return [p for p in ALL_PATHS if declares(metadata, p)]


def pooling_paths(metadata: BundleMetadata) -> list[str]:
    """The pooling paths of the tasks the bundle declares (none for one that only
    generates)."""
    return [p for p in POOLING_PATHS if declares(metadata, p)]


WINDOW_PROMPT = "window"
WINDOW_WORDS = ("the", "cat", "sat", "on", "a", "mat", "and", "the", "dog", "ran", "to", "it")
"""The window prompt's words, repeated: short common words, each one token or more in
the tokenizers of the families that have windows (a word is never merged with its
neighbour), so `size + WINDOW_MARGIN` words are at least that many tokens."""
WINDOW_MARGIN = 8


@dataclass
class WindowCoverage:
    """Whether a run reaches past the checkpoint's sliding window: the plan's side (the
    prompt it added, or why it could not) and, once served, the prompts that crossed."""

    size: int
    layers: str  # `AttentionWindow.describe()`
    added: str | None = None  # the prompt added to cross it
    reason: str | None = None  # why no prompt was added (none may cross)
    longest: int | None = None  # the longest served prompt, in tokens
    crossed_by: list[str] = field(default_factory=list)  # prompts longer than the window

    @property
    def crossed(self) -> bool:
        return bool(self.crossed_by)

    def served(self, lengths: dict[str, int]) -> None:
        """The served prompts' lengths in tokens: which crossed the window in prefill."""
        self.longest = max(lengths.values(), default=None)
        self.crossed_by = [name for name, length in lengths.items() if length > self.size]

    def describe(self) -> str:
        """One line for the report: crossed by which prompts, or not and why."""
        if self.crossed:
            names = ", ".join(self.crossed_by)
            return f"{self.layers}: crossed by {names} (longest prompt {self.longest} tokens)"
        why = f": {self.reason}" if self.reason else ""
        longest = f"longest prompt {self.longest} tokens" if self.longest else "no prompt"
        return (
            f"{self.layers}: NOT crossed ({longest}), so the windowed layers attended in "
            f"full and this run does not prove them{why}"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "size": self.size,
            "layers": self.layers,
            "crossed": self.crossed,
            "crossed_by": list(self.crossed_by),
            "longest_prompt": self.longest,
            "added_prompt": self.added,
            "reason": self.reason,
        }


@dataclass
class TestPlan:
    """One resolved `ttbundle test` run."""

    __test__ = False  # not a pytest class

    bundle_dir: Path
    metadata: BundleMetadata
    tests: BundleTests
    prompts: list[Prompt]
    paths: list[str]
    max_tokens: int
    mesh: str
    device_mode: str | None
    window: WindowCoverage | None = None

    def cover_window(
        self, window: Any, *, max_positions: int | None = None, recorded: bool = False
    ) -> None:
        """Reach past the checkpoint's sliding window (`format.attention_window`; None:
        none): add the window prompt unless a text prompt is surely longer, or record why
        it cannot be added (`WindowCoverage.reason`)."""
        if window is None:
            return
        coverage = WindowCoverage(size=window.size, layers=window.describe())
        self.window = coverage
        words = window.size + WINDOW_MARGIN
        if any(p.text and len(p.text.split()) >= words for p in self.prompts):
            return  # a prompt crosses it already (the run says which)
        if recorded:
            coverage.reason = (
                "a recorded golden (--golden FILE) holds its own prompts; record one with "
                "a prompt longer than the window"
            )
            return
        target = self.metadata.target(self.mesh)
        # The harness's room: the prompt, decoding after it twice over, one more.
        need = words + 2 + (2 * self.max_tokens if self.generation_paths else 0)
        caps = {
            f"the bundle's {self.mesh} target (max_model_len)": target.max_model_len
            if target
            else None,
            "the checkpoint's positions": max_positions,
        }
        for where, cap in caps.items():
            if cap and need > cap:
                coverage.reason = (
                    f"a prompt past the window needs about {need} tokens and {where} "
                    f"allows {cap}; raise it, or add a prompt longer than the window"
                )
                return
        name = WINDOW_PROMPT
        taken = {p.name for p in self.prompts}
        while name in taken:
            name += "_"
        text = " ".join(WINDOW_WORDS[i % len(WINDOW_WORDS)] for i in range(words))
        self.prompts.append(Prompt(name, text=text.capitalize()))
        coverage.added = name

    @property
    def thresholds(self):  # noqa: ANN201 - format.metadata.Thresholds
        return self.tests.thresholds

    @property
    def has_images(self) -> bool:
        """Whether an image prompt runs (they run on the prefill and decode paths)."""
        return any(p.images for p in self.prompts) and any(
            p in ("prefill", "decode") for p in self.paths
        )

    @property
    def pooling(self) -> list[str]:
        """The pooling tasks checked (`embed`, `classify`), in path order."""
        return [POOLING_PATHS[p] for p in self.paths if p in POOLING_PATHS]

    @property
    def generation_paths(self) -> list[str]:
        return [p for p in self.paths if p not in POOLING_PATHS]

    @property
    def runs_perplexity(self) -> bool:
        return self.tests.perplexity_text is not None and any(p in HOST_PATHS for p in self.paths)

    def harness_spec(self, *, models_dir: Path, checkpoint: str, out_dir: Path) -> dict[str, Any]:
        """The document `serving.harness` runs."""
        target = self.metadata.target(self.mesh)
        env = dict(self.metadata.when.env)
        return {
            "bundle": self.metadata.name,
            "models_dir": str(models_dir),
            "checkpoint": checkpoint,
            "mesh": self.mesh,
            "env": env,
            "out_dir": str(out_dir),
            "prompts": [p.to_dict() for p in self.prompts],
            "paths": list(self.paths),
            "max_tokens": self.max_tokens,
            "chunk_size": self.tests.chunk_size,
            "sampling": self.tests.sampling.model_dump(),
            "device_mode": self.device_mode,
            "perplexity_text": self.tests.perplexity_text if self.runs_perplexity else None,
            "max_model_len": target.max_model_len if target else None,
            "max_num_seqs": target.max_num_seqs if target else None,
        }


def resolve_plan(
    bundle_dir: Path,
    metadata: BundleMetadata,
    *,
    paths: list[str] | None = None,
    max_tokens: int | None = None,
    mesh: str = HOST,
) -> TestPlan:
    """The plan for `bundle_dir`; raises InvalidBundleError (TTB110, TTB111, TTB101), and
    ConfigurationError for a mesh that is no preset or grid (TTB106; any case is fine)."""
    mesh = canonical(mesh, source="--mesh") or HOST
    tests = metadata.tests or BundleTests()
    problems: list[Diagnostic] = []
    if metadata.targets and mesh not in metadata.targets:
        problems.append(
            Diagnostic(
                "TTB101",
                Severity.ERROR,
                f"{metadata.name} does not target mesh {mesh} (targets: "
                f"{', '.join(metadata.targets)})",
                hint=f"test on one of its targets: --mesh {next(iter(metadata.targets))}",
            )
        )
    prompts = text_prompts(tests.prompts)
    if tests.prompt_file is not None:
        try:
            prompts += read_prompt_file(bundle_dir / tests.prompt_file)
        except PromptFileError as exc:
            problems.append(exc.diagnostic)
    if not tests.prompts and tests.prompt_file is None and not tests.image_prompts:
        prompts = text_prompts(list(DEFAULT_PROMPTS))
    prompts += image_prompts(tests.image_prompts, bundle_dir)
    problems.extend(
        image_prompt_problems(bundle_dir, metadata, str(bundle_dir / "vllm_metadata.json"))
    )
    names = [p.name for p in prompts]
    if len(set(names)) != len(names):
        problems.append(
            Diagnostic(
                "TTB111",
                Severity.ERROR,
                "prompt names repeat (texts are named p0, p1, ...; the prompt file's own "
                "names must differ from them)",
                hint="rename the prompt file's entries",
            )
        )
    if paths:
        unknown = [p for p in paths if p not in ALL_PATHS]
        if unknown:
            problems.append(
                Diagnostic(
                    "TTB033",
                    Severity.ERROR,
                    f"unknown test path {unknown[0]!r}",
                    hint=f"use one of {', '.join(ALL_PATHS)}",
                )
            )
        chosen = [p for p in ALL_PATHS if p in paths]
        problems.extend(path_problems(metadata, chosen, file=None, pointer=None))
    elif tests.paths is not None:
        chosen = [p for p in TEST_PATHS if p in tests.paths]
        chosen += pooling_paths(metadata)
        problems.extend(
            path_problems(
                metadata,
                tests.paths,
                file=str(bundle_dir / "vllm_metadata.json"),
                pointer="/tests/paths",
            )
        )
    else:
        chosen = default_paths(metadata)
    if problems:
        raise InvalidBundleError(problems)
    modes = metadata.capabilities.sample_on_device
    device_mode = "all" if "all" in modes else (modes[0] if modes else None)
    return TestPlan(
        bundle_dir=bundle_dir,
        metadata=metadata,
        tests=tests,
        prompts=prompts,
        paths=chosen,
        max_tokens=max_tokens or tests.max_tokens,
        mesh=mesh,
        device_mode=device_mode,
    )
