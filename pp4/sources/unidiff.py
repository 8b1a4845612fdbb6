"""A strict unified-diff applier: exact context, an offset allowed but no fuzz, whole hunks or an
error that names the hunk. The facc variant of exllamav3 is the stock sources with
pp4/sources/patches/exl3-facc.patch applied this way (pp4/sources/exl3.py)."""

from __future__ import annotations

import re
from pathlib import Path

import attrs

from pp4 import paths


class PatchError(ValueError):
    """A patch is malformed or does not apply."""


@attrs.frozen
class Hunk:
    index: int  # 1-based, within its file
    old_start: int
    old_len: int
    new_start: int
    new_len: int
    old: tuple[bytes, ...]  # lines with their line ends
    new: tuple[bytes, ...]


@attrs.frozen
class FilePatch:
    path: str  # with a/ b/ stripped, relative to the tree the patch applies to
    hunks: tuple[Hunk, ...]


_HUNK_HEADER = re.compile(rb"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


def shown(path: Path) -> str:
    """A patch's path as messages name it: pp4's own from the package's folder (pp4/sources/...),
    the same in a checkout and an installed pp4; any other in full."""
    path, top = Path(path).absolute(), paths.PACKAGE_DIR.parent
    return path.relative_to(top).as_posix() if path.is_relative_to(paths.PACKAGE_DIR) else str(path)


def _lines(data: bytes) -> list[bytes]:
    parts = data.split(b"\n")
    out = [p + b"\n" for p in parts[:-1]]
    if parts[-1]:
        out.append(parts[-1])
    return out


def _strip_prefix(name: bytes, patch: Path, lineno: int) -> str:
    name = name.split(b"\t")[0].strip()
    text = name.decode("utf-8", "surrogateescape")
    if text == "/dev/null":
        raise PatchError(f"{shown(patch)}:{lineno}: creating or deleting files is not supported")
    if "/" not in text:
        raise PatchError(f"{shown(patch)}:{lineno}: file name {text!r} lacks the a/ or b/ prefix")
    rel = text.split("/", 1)[1]
    if rel.startswith("/") or ".." in rel.split("/"):
        raise PatchError(f"{shown(patch)}:{lineno}: unsafe file name {text!r}")
    return rel


def parse_patch(patch: Path) -> list[FilePatch]:
    """A unified diff (diff -u / git diff): files, hunks; anything malformed raises PatchError."""
    lines = _lines(Path(patch).read_bytes())
    files: list[FilePatch] = []
    i = 0
    while i < len(lines):
        if not lines[i].startswith(b"--- "):
            i += 1  # headers (diff, index, comments) between files are ignored
            continue
        if i + 1 >= len(lines) or not lines[i + 1].startswith(b"+++ "):
            raise PatchError(f"{shown(patch)}:{i + 1}: '---' line without a '+++' line after it")
        _strip_prefix(lines[i][4:], patch, i + 1)
        path = _strip_prefix(lines[i + 1][4:], patch, i + 2)
        i += 2
        hunks: list[Hunk] = []
        while i < len(lines) and lines[i].startswith(b"@@"):
            m = _HUNK_HEADER.match(lines[i])
            if not m:
                raise PatchError(f"{shown(patch)}:{i + 1}: malformed hunk header {lines[i].rstrip()!r}")
            old_start, new_start = int(m.group(1)), int(m.group(3))
            old_len = int(m.group(2)) if m.group(2) is not None else 1
            new_len = int(m.group(4)) if m.group(4) is not None else 1
            header_line = i + 1
            i += 1
            old: list[bytes] = []
            new: list[bytes] = []
            while len(old) < old_len or len(new) < new_len:
                if i >= len(lines):
                    raise PatchError(f"{shown(patch)}:{header_line}: hunk {len(hunks) + 1} of {path} ends early")
                line = lines[i]
                tag, body = line[:1], line[1:]
                if line in (b"\n", b"\r\n"):  # an empty context line whose leading space was lost
                    tag, body = b" ", line
                if tag == b" ":
                    old.append(body)
                    new.append(body)
                elif tag == b"-":
                    old.append(body)
                elif tag == b"+":
                    new.append(body)
                elif tag == b"\\":
                    pass
                else:
                    raise PatchError(f"{shown(patch)}:{i + 1}: unexpected line in hunk {len(hunks) + 1} of {path}")
                i += 1
                if i < len(lines) and lines[i].startswith(b"\\"):  # "\ No newline at end of file"
                    if tag in (b" ", b"-") and old:
                        old[-1] = old[-1].rstrip(b"\n")
                    if tag in (b" ", b"+") and new:
                        new[-1] = new[-1].rstrip(b"\n")
                    i += 1
            if len(old) != old_len or len(new) != new_len:
                raise PatchError(f"{shown(patch)}:{header_line}: hunk {len(hunks) + 1} of {path} has other line counts than its header")
            hunks.append(Hunk(len(hunks) + 1, old_start, old_len, new_start, new_len, tuple(old), tuple(new)))
        if not hunks:
            raise PatchError(f"{shown(patch)}:{i}: no hunks for {path}")
        files.append(FilePatch(path, tuple(hunks)))
    if not files:
        raise PatchError(f"{shown(patch)}: no file changes found (is it a unified diff?)")
    paths_seen = [f.path for f in files]
    if len(set(paths_seen)) != len(paths_seen):
        raise PatchError(f"{shown(patch)}: a file appears twice; give each file one set of hunks")
    return files


def _find(lines: list[bytes], block: tuple[bytes, ...], expected: int, lowest: int) -> int | None:
    """Where block occurs exactly, nearest to the expected index and not before lowest."""
    n = len(block)
    for pos in sorted(range(lowest, len(lines) - n + 1), key=lambda p: (abs(p - expected), p)):
        if tuple(lines[pos:pos + n]) == block:
            return pos
    return None


def _apply_hunks(lines: list[bytes], hunks: tuple[Hunk, ...], reverse: bool = False) -> tuple[list[bytes] | None, Hunk | None]:
    """The patched lines, or (None, the first hunk that does not apply)."""
    out: list[bytes] = []
    pos = 0
    for h in hunks:
        old, new = (h.new, h.old) if reverse else (h.old, h.new)
        start, length = (h.new_start, h.new_len) if reverse else (h.old_start, h.old_len)
        expected = start if length == 0 else start - 1
        at = _find(lines, old, expected, pos)
        if at is None:
            return None, h
        out += lines[pos:at]
        out += new
        pos = at + len(old)
    out += lines[pos:]
    return out, None


def _not_applying(patch: Path, path: str, hunk: Hunk) -> PatchError:
    return PatchError(
        f"{shown(patch)}: hunk {hunk.index} of {path} (at line {hunk.old_start}) does not apply: "
        "the source changed; update the patch"
    )


def apply_patch_to_files(patch: Path, files: dict[str, bytes]) -> dict[str, bytes]:
    """files (relative path -> bytes, pristine) with the patch applied; PatchError if any hunk fails."""
    out = dict(files)
    for fp in parse_patch(patch):
        if fp.path not in files:
            raise PatchError(f"{shown(patch)}: {fp.path} does not exist in the sources; update the patch")
        new, failed = _apply_hunks(_lines(files[fp.path]), fp.hunks)
        if new is None:
            raise _not_applying(patch, fp.path, failed)
        out[fp.path] = b"".join(new)
    return out
