"""The bundle's serving defaults (`serving`, schema 4) checked against what serves them.

A tool-call or reasoning parser the installed vLLM lacks would fail `vllm serve` only
when the server starts (or, for a reasoning parser, at the first request): validate says
so first (TTB112), and the plan refuses with the same words. A chat template must be a
file of the bundle that reads (TTB113).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ttbundles.errors import Diagnostic, Severity
from ttbundles.format.metadata import BundleMetadata
from ttbundles.suggest import did_you_mean
from ttbundles.vllm_parsers import ParserKind, known_names

# (key in `serving`, parser kind, vllm serve's option)
PARSER_KEYS: tuple[tuple[str, ParserKind, str], ...] = (
    ("tool_call_parser", "tool_call", "--tool-call-parser"),
    ("reasoning_parser", "reasoning", "--reasoning-parser"),
)


def parser_problems(
    metadata: BundleMetadata,
    file: str | None = None,
    *,
    names: Callable[[ParserKind], frozenset[str] | None] = known_names,
) -> list[Diagnostic]:
    """TTB112 for each parser the bundle names that `names(kind)` lacks; an INFO when
    the installed vLLM's parsers cannot be read (nothing checked)."""
    serving = metadata.serving
    if serving is None:
        return []
    out: list[Diagnostic] = []
    for key, kind, option in PARSER_KEYS:
        wanted = getattr(serving, key)
        if wanted is None:
            continue
        known = names(kind)
        if known is None:
            out.append(
                Diagnostic(
                    "TTB112",
                    Severity.INFO,
                    f"serving.{key} {wanted!r} not checked: the installed vLLM's "
                    f"{kind.replace('_', '-')} parsers cannot be read here",
                    file=file,
                    pointer=f"/serving/{key}",
                    hint="validate where the serving vLLM is installed",
                )
            )
        elif wanted not in known:
            best = did_you_mean(wanted, known)
            out.append(
                Diagnostic(
                    "TTB112",
                    Severity.ERROR,
                    f"serving.{key} {wanted!r} is not a {kind.replace('_', '-')} parser of "
                    f"the installed vLLM ({len(known)} known)",
                    file=file,
                    pointer=f"/serving/{key}",
                    hint=(f"did you mean {best!r}? " if best else "")
                    + f"name one vLLM lists ({option} choices), or serve with a vLLM "
                    "release that has it",
                )
            )
    return out


def template_problems(bundle_dir: Path, metadata: BundleMetadata, file: str) -> list[Diagnostic]:
    """TTB113 when `serving.chat_template` is not a readable file of the bundle."""
    serving = metadata.serving
    if serving is None or serving.chat_template is None:
        return []
    path = bundle_dir / serving.chat_template
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        why = "does not exist"
    except IsADirectoryError:
        why = "is a folder"
    except (OSError, UnicodeDecodeError) as exc:
        why = f"does not read ({exc.__class__.__name__})"
    else:
        if text.strip():
            return []
        why = "is empty"
    return [
        Diagnostic(
            "TTB113",
            Severity.ERROR,
            f"serving.chat_template {serving.chat_template!r}: {path} {why}",
            file=file,
            pointer="/serving/chat_template",
            hint="add the Jinja template at that path in the bundle, or drop the key to "
            "use the checkpoint's own template",
        )
    ]


def check_serving(bundle_dir: Path, metadata: BundleMetadata, file: str) -> list[Diagnostic]:
    """Every finding on the bundle's serving defaults."""
    return parser_problems(metadata, file) + template_problems(bundle_dir, metadata, file)
