"""Run the code examples of README.md and docs/**/*.md, so a stale example fails CI (.ci/docs.sh).

The rule (docs/contributing-docs.md): every ```bash, ```sh and ```python block runs, unless the line before its
fence (blank lines aside) is an HTML comment that gives the reason it cannot run here:

    <!-- not run: needs an Android phone on adb -->
    ```bash
    edgekit devices add pixel --target pixel-arm64 --adb 0123456789ABCDEF
    ```

Other fences (```text for output, ```yaml, ```json, a bare ```) are never run. A `not run` marker without a reason, or
one that is not followed by a runnable block, is an error: a marker cannot outlive its example unnoticed.

Each page's blocks run in order, in one scratch folder per page whose entries link to the repository's top-level
entries (so `examples/digits/...` resolves and `out/` lands in the scratch folder); a block may read what an earlier
block of the same page wrote. bash blocks run with `bash -e -o pipefail`, python blocks with this interpreter; the
venv's bin/ leads PATH, so `edgekit` and `python` are the venv's. A block fails on a non-zero exit or after
EDGEKIT_DOCS_BLOCK_TIMEOUT seconds (default 300). The runner prints every block it ran with its time, every block
it skipped with its reason, and exits 1 when a block failed.

    python .ci/docs_examples.py                  # README.md and docs/**/*.md
    python .ci/docs_examples.py --list           # what would run and what is skipped, and why
    python .ci/docs_examples.py docs/guides/compression.md --only 12   # one page; the block at line 12
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUNNABLE = {"bash": "bash", "sh": "bash", "shell": "bash", "python": "python", "py": "python"}
FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})[ \t]*(?P<info>[^`]*)$")
MARKER = re.compile(r"^\s*<!--\s*not run\b(?P<rest>.*?)-->\s*$", re.IGNORECASE)
MARKER_START = re.compile(r"^\s*<!--\s*not run\b", re.IGNORECASE)


class MarkerError(ValueError):
    """A malformed page: an unterminated fence, a `not run` marker without a reason or without its block."""


@dataclass(frozen=True)
class Block:
    path: str  # as given (relative to the repository root when found by default)
    line: int  # 1-based line of the opening fence
    lang: str  # "bash" or "python" for runnable blocks, else the fence's info word ("" when none)
    code: str
    skip: str | None = None  # the `not run` reason; None: it runs

    @property
    def runnable(self) -> bool:
        return self.lang in ("bash", "python")

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"


def extract(text: str, path: str = "<text>") -> list[Block]:
    """Every fenced code block of a Markdown page, with its language and its `not run` reason."""
    lines = text.splitlines()
    blocks: list[Block] = []
    pending: tuple[int, str] | None = None  # (line, reason) of a `not run` marker waiting for its block
    i = 0
    while i < len(lines):
        line = lines[i]
        m = FENCE.match(line)
        if not m:
            if MARKER_START.match(line):
                if pending is not None:
                    raise MarkerError(f"{path}:{pending[0]}: a `not run` marker with no code block after it")
                mm = MARKER.match(line)
                reason = (mm.group("rest") if mm else "").strip()
                if not mm or not reason.startswith(":") or not reason[1:].strip():
                    raise MarkerError(f"{path}:{i + 1}: write the reason: <!-- not run: WHY IT CANNOT RUN HERE -->")
                pending = (i + 1, reason[1:].strip())
            elif line.strip() and pending is not None:
                raise MarkerError(f"{path}:{pending[0]}: a `not run` marker must come right before its code block")
            i += 1
            continue
        indent, fence, info = m.group("indent"), m.group("fence"), m.group("info").strip()
        word = info.split()[0].lower() if info else ""
        body: list[str] = []
        j = i + 1
        close = re.compile(rf"^[ \t]*{re.escape(fence[0])}{{{len(fence)},}}[ \t]*$")
        while j < len(lines) and not close.match(lines[j]):
            body.append(lines[j][len(indent) :] if lines[j].startswith(indent) else lines[j].lstrip())
            j += 1
        if j >= len(lines):
            raise MarkerError(f"{path}:{i + 1}: the code block is never closed")
        lang = RUNNABLE.get(word, word)
        skip = None
        if pending is not None:
            if lang not in ("bash", "python"):
                raise MarkerError(
                    f"{path}:{pending[0]}: a `not run` marker before a ```{word} block, which never "
                    "runs: remove the marker"
                )
            skip = pending[1]
            pending = None
        blocks.append(Block(path, i + 1, lang, "\n".join(body) + "\n", skip))
        i = j + 1
    if pending is not None:
        raise MarkerError(f"{path}:{pending[0]}: a `not run` marker with no code block after it")
    return blocks


def default_pages() -> list[Path]:
    docs = sorted(p for p in (ROOT / "docs").rglob("*.md") if "_gen" not in p.relative_to(ROOT / "docs").parts)
    return [ROOT / "README.md", *docs]


def scratch_for(page: str, base: Path) -> Path:
    """A folder for one page's blocks: links to the repository's top-level entries, nothing else."""
    d = Path(tempfile.mkdtemp(prefix=re.sub(r"[^A-Za-z0-9]+", "-", page).strip("-") + "-", dir=base))
    for entry in ROOT.iterdir():
        if entry.name not in (".git", "site") and not entry.name.startswith(".ci-results"):
            (d / entry.name).symlink_to(entry)
    return d


def run_block(block: Block, cwd: Path, timeout: float) -> tuple[int, str, float]:
    """(exit code, output, seconds); exit code 124 when it ran past ``timeout``."""
    script = cwd / f".block-{block.line}.{'sh' if block.lang == 'bash' else 'py'}"
    script.write_text(block.code)
    argv = ["bash", "-e", "-o", "pipefail", str(script)] if block.lang == "bash" else [sys.executable, str(script)]
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    t0 = time.monotonic()
    proc = subprocess.Popen(
        argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
        rc = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the block's whole process group: its edgekit and agents too
        out, _ = proc.communicate()
        rc = 124
    return rc, out, time.monotonic() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("pages", nargs="*", help="Markdown files (default: README.md and docs/**/*.md)")
    ap.add_argument("--list", action="store_true", help="print what would run and what is skipped; run nothing")
    ap.add_argument("--only", type=int, action="append", help="run only the block whose fence is at this line")
    ap.add_argument("--keep", action="store_true", help="keep the scratch folders (their path is printed)")
    args = ap.parse_args(argv)
    pages = [Path(p).resolve() for p in args.pages] or default_pages()
    timeout = float(os.environ.get("EDGEKIT_DOCS_BLOCK_TIMEOUT", "300"))

    found: list[tuple[str, list[Block]]] = []
    errors = []
    for page in pages:
        rel = str(page.relative_to(ROOT)) if page.is_relative_to(ROOT) else str(page)
        try:
            blocks = [b for b in extract(page.read_text(encoding="utf-8"), rel) if b.runnable]
        except MarkerError as exc:
            errors.append(str(exc))
            continue
        if args.only:
            blocks = [b for b in blocks if b.line in args.only]
        found.append((rel, blocks))
    for e in errors:
        print(f"docs examples: {e}")
    if errors:
        return 1

    to_run = [b for _, bs in found for b in bs if b.skip is None]
    skipped = [b for _, bs in found for b in bs if b.skip is not None]
    if args.list:
        for b in to_run:
            print(f"run   {b.where} ({b.lang})")
        for b in skipped:
            print(f"skip  {b.where} ({b.lang}): {b.skip}")
        print(f"docs examples: {len(to_run)} to run, {len(skipped)} marked not run")
        return 0

    base = Path(tempfile.mkdtemp(prefix="edgekit-docs-examples-"))
    failed: list[Block] = []
    t_all = time.monotonic()
    try:
        for rel, blocks in found:
            runs = [b for b in blocks if b.skip is None]
            cwd = scratch_for(rel, base) if runs else None
            for b in blocks:
                if b.skip is not None:
                    print(f"skip  {b.where} ({b.lang}): {b.skip}", flush=True)
                    continue
                assert cwd is not None
                rc, out, dt = run_block(b, cwd, timeout)
                state = "ok" if rc == 0 else ("TIMED OUT" if rc == 124 else f"FAILED (exit {rc})")
                print(f"run   {b.where} ({b.lang}, {dt:.1f} s): {state}", flush=True)
                if rc != 0:
                    failed.append(b)
                    print("      the block:\n" + "".join(f"      | {ln}\n" for ln in b.code.splitlines()), end="")
                    tail = out.splitlines()[-40:]
                    print(
                        "      its output (last 40 lines):\n" + "".join(f"      > {ln}\n" for ln in tail),
                        end="",
                        flush=True,
                    )
    finally:
        if args.keep:
            print(f"docs examples: scratch folders kept under {base}")
        else:
            shutil.rmtree(base, ignore_errors=True)
    print(
        f"docs examples: ran {len(to_run)} blocks in {time.monotonic() - t_all:.0f} s, {len(failed)} failed; "
        f"{len(skipped)} marked not run"
    )
    for b in failed:
        print(f"docs examples: FAILED {b.where}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
