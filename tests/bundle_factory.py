"""Bundles and archives on disk for the archive and install tests.

Plain functions rather than fixtures: hypothesis examples and multiprocessing workers
need them too, and neither can use function-scoped fixtures.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import tarfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

_CONTRACT = '''"""A test generator: the contract, and nothing else."""
{preamble}

class {name}:
{attributes}
    @classmethod
    def initialize_vllm_model(cls, hf_config, mesh_device, max_batch_size, max_seq_len,
                              **kwargs):
        return cls()

    def allocate_kv_cache(self, kv_cache_shape, dtype, num_layers):
        return None

    def prefill_forward(self, tokens, page_table, kv_cache, prompt_lens, **kwargs):
        return None

    def decode_forward(self, tokens, start_pos, page_table, kv_cache, **kwargs):
        return None
'''


def contract_adapter(name: str = "Generator", *, preamble: str = "", attributes: str = "") -> str:
    """Source of an adapter module whose class `name` satisfies the generator contract;
    `preamble` goes before the class, `attributes` (indented) into its body."""
    return _CONTRACT.format(name=name, preamble=preamble, attributes=attributes)


ADAPTER = contract_adapter()


def metadata(name: str = "demo", version: str = "1.0.0", **extra: object) -> dict:
    """A valid schema-1 document for ADAPTER's generator; `extra` adds or overrides keys."""
    return {
        "schema_version": 1,
        "name": name,
        "version": version,
        "arch": "DemoForCausalLM",
        "main_class": "adapter:Generator",
        **extra,
    }


def write_bundle(
    folder: Path,
    *,
    name: str = "demo",
    version: str = "1.0.0",
    files: Mapping[str, bytes | str] | None = None,
    document: dict | None = None,
) -> Path:
    """A valid bundle at `folder`: metadata, adapter.py and `files` (relative path: data)."""
    folder.mkdir(parents=True, exist_ok=True)
    document = metadata(name, version) if document is None else document
    contents: dict[str, bytes | str] = {
        "vllm_metadata.json": json.dumps(document, indent=2) + "\n",
        "adapter.py": ADAPTER,
        **(files or {}),
    }
    for rel, data in contents.items():
        path = folder / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(data, str):
            data = data.encode("utf-8")
        path.write_bytes(data)
    return folder


def snapshot(folder: Path) -> dict[str, bytes | None]:
    """Every path under `folder` with its bytes (None for a folder): to compare states."""
    if not folder.exists():
        return {}
    state: dict[str, bytes | None] = {}
    for root, dirs, names in os.walk(folder):
        for d in dirs:
            state[os.path.relpath(os.path.join(root, d), folder)] = None
        for n in names:
            path = os.path.join(root, n)
            state[os.path.relpath(path, folder)] = Path(path).read_bytes()
    return state


@dataclass
class Entry:
    """One tar entry to write into a crafted archive."""

    name: str
    data: bytes = b""
    type: bytes = tarfile.REGTYPE
    linkname: str = ""
    size: int | None = None  # header size when it must differ from len(data)
    mode: int = 0o644


def read_entries(archive: Path) -> list[Entry]:
    """The entries of a (small, trusted) archive, to edit and write back."""
    entries = []
    with tarfile.open(archive, "r:gz") as tar:
        for member in tar:
            handle = tar.extractfile(member)
            data = handle.read() if handle is not None else b""
            entries.append(Entry(member.name, data, member.type, member.linkname, mode=member.mode))
    return entries


def write_entries(archive: Path, entries: Iterable[Entry]) -> Path:
    """A gzip'd tar holding exactly `entries`, whatever they are (no safety checks)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for entry in entries:
            info = tarfile.TarInfo(entry.name)
            info.type = entry.type
            info.linkname = entry.linkname
            info.mode = entry.mode
            info.size = len(entry.data) if entry.size is None else entry.size
            if entry.type in (tarfile.REGTYPE, tarfile.AREGTYPE):
                tar.addfile(info, io.BytesIO(entry.data))
            else:
                info.size = 0
                tar.addfile(info)
    archive.write_bytes(gzip.compress(buffer.getvalue(), mtime=0))
    return archive


@dataclass
class Crafted:
    """A malicious or broken archive, and how it must be refused."""

    path: Path
    code: str
    entry: str | None  # the entry the diagnostic must name, when there is one


# Every way crafted_archives breaks an archive (its keys): the parametrize ids of the
# verify and install tests, checked against the corpus itself by a test.
CRAFTED_CASES = (
    "absolute-path",
    "dotdot",
    "nested-dotdot",
    "symlink",
    "hardlink",
    "char-device",
    "fifo",
    "duplicate",
    "not-in-manifest",
    "larger-than-manifest",
    "no-manifest",
    "manifest-not-last",
    "not-gzip",
    "plain-tar",
    "truncated",
    "empty-file",
)


def crafted_corpus(root: Path, weights: bytes) -> tuple[Path, dict[str, Crafted]]:
    """A packed bundle with weights/w.bin under `root`, and the crafted archives."""
    from ttbundles.build import pack

    folder = write_bundle(root / "src", files={"weights/w.bin": weights})
    good = pack(folder, root / "dist")
    return good, crafted_archives(good, root / "crafted")


def crafted_archives(good: Path, out: Path) -> dict[str, Crafted]:
    """The corpus: each archive derived from `good` (a packed bundle with
    weights/w.bin), broken in one way. Keys are readable test ids."""
    out.mkdir(parents=True, exist_ok=True)
    entries = read_entries(good)
    *files, manifest = entries
    assert manifest.name == "MANIFEST.json"
    raw = good.read_bytes()

    def variant(key: str, new_files: list[Entry], tail: list[Entry] | None = None) -> Path:
        return write_entries(
            out / f"{key}.ttbundle", [*new_files, *(tail if tail is not None else [manifest])]
        )

    def replaced(name: str, data: bytes) -> list[Entry]:
        return [Entry(e.name, data, e.type, mode=e.mode) if e.name == name else e for e in files]

    weights = next(e for e in files if e.name == "weights/w.bin")
    corpus = {
        "absolute-path": Crafted(
            variant("abs", [*files, Entry("/tmp/evil", b"x")]), "TTB085", "/tmp/evil"
        ),
        "dotdot": Crafted(variant("dotdot", [*files, Entry("../evil", b"x")]), "TTB085", "../evil"),
        "nested-dotdot": Crafted(
            variant("nested", [*files, Entry("weights/../../evil", b"x")]),
            "TTB085",
            "weights/../../evil",
        ),
        "symlink": Crafted(
            variant(
                "symlink", [*files, Entry("link", type=tarfile.SYMTYPE, linkname="/etc/passwd")]
            ),
            "TTB085",
            "link",
        ),
        "hardlink": Crafted(
            variant(
                "hardlink", [*files, Entry("hard", type=tarfile.LNKTYPE, linkname="adapter.py")]
            ),
            "TTB085",
            "hard",
        ),
        "char-device": Crafted(
            variant("chr", [*files, Entry("tty", type=tarfile.CHRTYPE)]), "TTB085", "tty"
        ),
        "fifo": Crafted(
            variant("fifo", [*files, Entry("pipe", type=tarfile.FIFOTYPE)]), "TTB085", "pipe"
        ),
        "duplicate": Crafted(
            variant("dup", [*files, Entry("adapter.py", b"print('second copy')\n")]),
            "TTB086",
            "adapter.py",
        ),
        "not-in-manifest": Crafted(
            variant("extra", [*files, Entry("extra.py", b"x = 1\n")]), "TTB084", "extra.py"
        ),
        "larger-than-manifest": Crafted(
            variant("big", replaced("weights/w.bin", weights.data + b"more")),
            "TTB087",
            "weights/w.bin",
        ),
        "no-manifest": Crafted(variant("nomanifest", files, tail=[]), "TTB081", None),
        "manifest-not-last": Crafted(
            write_entries(out / "first.ttbundle", [manifest, *files]), "TTB081", "adapter.py"
        ),
        "not-gzip": Crafted(out / "junk.ttbundle", "TTB080", None),
        "plain-tar": Crafted(out / "plain.ttbundle", "TTB080", None),
        "truncated": Crafted(out / "truncated.ttbundle", "TTB080", None),
        "empty-file": Crafted(out / "empty.ttbundle", "TTB080", None),
    }
    (out / "junk.ttbundle").write_bytes(b"this is not an archive at all\n" * 100)
    (out / "plain.ttbundle").write_bytes(gzip.decompress(raw))
    (out / "truncated.ttbundle").write_bytes(raw[: len(raw) // 2])
    (out / "empty.ttbundle").write_bytes(b"")
    return corpus
