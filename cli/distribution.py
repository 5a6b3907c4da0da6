"""`ttbundle push`, `pull` and `sign`: bundles through OCI registries, signed.

Thin over `ttbundles.distribution` and `ttbundles.trust`; `verify --key` is in
`archive.py` with the rest of `verify`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from .archive import _progress, _report
from .options import FormatOption, ModelsDirOption
from .output import Format, Output

PlainHttpOption = Annotated[
    bool,
    typer.Option(
        "--plain-http",
        help="Talk plain HTTP to a registry that is not on this machine (loopback "
        "registries always use it).",
    ),
]


def _interruptible() -> None:
    """SIGTERM unwinds like Ctrl-C, so a stopped pull removes its temporary file."""
    import signal

    def stop(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)


def push(
    source: Annotated[
        Path,
        typer.Argument(
            help="A .ttbundle archive, or a bundle folder (packed first).", metavar="ARCHIVE|DIR"
        ),
    ],
    ref: Annotated[
        str,
        typer.Argument(help="HOST[:PORT]/REPOSITORY[:TAG] (no tag: latest)", metavar="REF"),
    ],
    plain_http: PlainHttpOption = False,
    fmt: FormatOption = Format.human,
) -> None:
    """Push a bundle to an OCI registry (verified first; signature attached).

    The digest reference pushed is the last line of standard output.

    Example: ttbundle push dist/my-llama-1.2.0.ttbundle 127.0.0.1:5000/team/my-llama:1.2.0
    """
    from ttbundles.distribution.push import push as push_bundle

    out = Output(fmt)
    with _progress(f"pushing {source.name}", not out.is_json) as progress:
        result = push_bundle(source, ref, plain_http=plain_http, progress=progress)
    if out.is_json:
        out.result(True, [], **result.to_dict())
        return
    sent = "uploaded" if result.uploaded else "already in the registry"
    out.plain(f"pushed {result.name} {result.version} ({result.size} bytes, {sent})")
    if result.signature:
        out.plain(f"signature attached: {result.signature}")
    out.plain(result.reference)


def pull(
    ref: Annotated[
        str, typer.Argument(help="HOST[:PORT]/REPOSITORY:TAG or ...@sha256:DIGEST", metavar="REF")
    ],
    output_dir: Annotated[
        Path, typer.Option("--output-dir", "-o", help="Where to write the archive.")
    ] = Path("."),
    install: Annotated[
        bool,
        typer.Option(
            "--install", help="Install it (into --models-dir) instead of keeping the archive."
        ),
    ] = False,
    models_dir: ModelsDirOption = None,
    replace: Annotated[
        bool, typer.Option("--replace", help="With --install: replace an installed bundle.")
    ] = False,
    plain_http: PlainHttpOption = False,
    fmt: FormatOption = Format.human,
) -> None:
    """Pull a bundle from an OCI registry; every digest verified before anything is written.

    Example: ttbundle pull 127.0.0.1:5000/team/my-llama:1.2.0 --install --models-dir /opt/tt-bundles
    """
    from ttbundles.distribution.pull import pull as pull_bundle

    out = Output(fmt)
    _interruptible()
    if not install:
        with _progress("pulling", not out.is_json) as progress:
            result, archive = pull_bundle(ref, output_dir, plain_http=plain_http, progress=progress)
        if out.is_json:
            out.result(True, [], **result.to_dict())
            return
        out.plain(f"pulled {result.name} {result.version} from {result.reference}")
        out.plain(str(archive))
        return
    from ttbundles.distribution.pull import pull_install
    from ttbundles.installer.operations import resolve_models_dir

    with _progress("pulling", not out.is_json) as progress:
        result, installed = pull_install(
            ref,
            resolve_models_dir(models_dir),
            replace=replace,
            plain_http=plain_http,
            progress=progress,
        )
    if out.is_json:
        out.result(True, [], pulled=result.to_dict(), **installed.to_dict())
        return
    out.plain(f"pulled {result.name} {result.version} from {result.reference}")
    _report(out, installed)


def sign(
    path: Annotated[
        Path, typer.Argument(help="A bundle folder or a .ttbundle archive.", metavar="DIR|ARCHIVE")
    ],
    key: Annotated[
        Path,
        typer.Option(
            "--key",
            help="The PEM elliptic-curve private key (P-256/P-384/P-521): "
            "openssl ecparam -name prime256v1 -genkey -noout -out key.pem.",
            dir_okay=False,
        ),
    ],
    certificate: Annotated[
        Path | None,
        typer.Option(
            "--certificate", help="Sign with this certificate (of --key).", dir_okay=False
        ),
    ] = None,
    chain: Annotated[
        list[Path] | None,
        typer.Option(
            "--certificate-chain",
            help="Certificates up to the root, root last (repeat), as for verify.",
            dir_okay=False,
        ),
    ] = None,
    force: Annotated[
        bool,
        typer.Option("--force", help="Replace a signature by another key or certificate (TTB146)."),
    ] = False,
    fmt: FormatOption = Format.human,
) -> None:
    """Sign a bundle (OpenSSF model signing): writes model.sig into it.

    An archive is rewritten with its signature inside. Signing again with the same key
    replaces the signature; a bundle signed by another key or certificate is refused
    (TTB146) unless --force.

    Example: ttbundle sign my-bundle --key signing-key.pem
    """
    from ttbundles.trust.signature import signer_of
    from ttbundles.trust.signing import sign as sign_bundle

    out = Output(fmt)
    written = sign_bundle(path, key, certificate=certificate, chain=chain or (), force=force)
    if out.is_json:
        out.result(True, [], path=str(written))
        return
    signer = signer_of(path) if path.is_dir() else None
    out.plain(f"signed {path}{f' ({signer})' if signer else ''}")
    out.plain(str(written))
