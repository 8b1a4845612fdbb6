"""A shared store nobody can poison: what a store writer can and cannot do (docs/store.md's threat
model), each line tried on a real Redis server and on a shared folder.

Builders are configuration folders of their own ($PP4_CONFIG_DIR: a key pair and a trust list) that
configure and build the same tiny project, each in a fresh folder with an empty local store and the
one remote tier. A writer of the store forges entries the way another machine writes them: with
pp4's own encoders, under the real keys, with signatures made by pp4's own code where the case needs
one. The oracle owes nothing to signatures: the object a build ends with is compared byte for byte
with a real compile (--no-reuse) of the same sources.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import attrs
import pytest
from conftest import REPO, RedisServer, group_doc, group_frame, group_of, zstd_frame
from test_build import ninja_bin

from pp4.store import signing
from pp4.store.records import decode_record, encode_record
from pp4.store.remote.backend import open_remote

pytestmark = pytest.mark.slow

FIXTURE = REPO / "tests" / "fixtures" / "debuginfo"


class Builder:
    """A machine of the team: a key pair of its own, and whose entries it restores."""

    def __init__(self, base: Path, name: str):
        self.name = name
        self.config = base / f"config-{name}"
        self.config.mkdir()
        self.n = 0
        self.base = base
        self.keys("new", "--name", name)

    def env(self) -> dict:
        return dict(os.environ, PP4_CONFIG_DIR=str(self.config))

    @property
    def public(self) -> Path:
        return self.config / "keys" / "signing.pub"

    def signer(self) -> signing.Signer:
        return signing.load_signer(self.config / "keys" / "signing.key")

    def keys(self, *args: str) -> str:
        proc = subprocess.run([sys.executable, "-m", "pp4.store", "keys", *args], env=self.env(), capture_output=True,
                              text=True, cwd=REPO)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return proc.stdout

    def trusts(self, *others: "Builder") -> "Builder":
        for other in others:
            self.keys("trust", str(other.public))
        return self

    def configure(self, remote: str | None, *options: str,
                  src: Path | None = None) -> tuple[Path, subprocess.CompletedProcess]:
        """configure in a fresh folder with an empty local store: (the folder, configure's process)."""
        self.n += 1
        work = self.base / f"work-{self.name}-{self.n}"
        work.mkdir()
        shutil.copytree(src or FIXTURE, work / "src")
        remote_opts = ["--remote-store", remote] if remote else []
        proc = subprocess.run([sys.executable, str(REPO / "configure.py"), "--arch", "9.0", "--ext-spec",
                               "src/plain.toml", "--store", str(work / "store"), *remote_opts, *options],
                              cwd=work, env=self.env(), capture_output=True, text=True, timeout=300)
        return work, proc

    def ninja(self, work: Path, out: str = "") -> tuple[dict, bytes, str]:
        """ninja in a configured folder: (certificate object, object bytes, output)."""
        proc = subprocess.run([ninja_bin()], cwd=work, env=self.env(), capture_output=True, text=True, timeout=300)
        out += proc.stdout + proc.stderr
        assert proc.returncode == 0, f"ninja failed:\n{out}"
        (obj,) = json.loads(gzip.decompress((work / "build" / "certificate.json.gz").read_bytes()))["objects"]
        return obj, (work / obj["output"]).read_bytes(), out

    def build(self, remote: str | None, *options: str, src: Path | None = None) -> tuple[dict, bytes, str]:
        """configure and ninja in a fresh folder with an empty local store: (certificate object,
        object bytes, output)."""
        work, proc = self.configure(remote, *options, src=src)
        assert proc.returncode == 0, f"configure failed:\n{proc.stdout + proc.stderr}"
        return self.ninja(work, proc.stdout + proc.stderr)


def redis_url(tmp_path):
    """A real redis-server for a test, and its URL; skipped where Debian's package is missing."""
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed (.ci/run installs Debian's package)")
    return RedisServer(tmp_path / "redis")


@pytest.fixture(params=["redis", "folder"])
def remote(request, tmp_path):
    """The remote tier on both backends: for the cases where how a value is written and read matters."""
    if request.param == "redis":
        server = redis_url(tmp_path)
        yield server.url()
        server.stop()
    else:
        yield folder_remote(tmp_path)


@pytest.fixture
def shared(tmp_path):
    """The remote tier as a shared folder: for the cases the trust list decides, whatever the backend."""
    return folder_remote(tmp_path)


def folder_remote(tmp_path) -> str:
    folder = tmp_path / "shared"
    folder.mkdir()
    return f"file://{folder}"


def real_compile(base: Path, src: Path | None = None) -> bytes:
    """The object a compile of the sources gives, by a builder of its own that reuses nothing."""
    _, data, _ = Builder(base, f"real{len(list(base.glob('config-real*')))}").build(None, "--no-reuse", src=src)
    return data


def forge(remote: str, action_key: str, *, object_bytes: bytes, signatures, disputes=()) -> None:
    """Write an entry's record and object the way another machine's pp4 does, under the real key."""
    storage = open_remote(remote)
    key, doc = group_of(storage, action_key)
    record = decode_record(doc["records"][action_key].encode(), expected_key=action_key)
    sha = hashlib.sha256(object_bytes).hexdigest()
    storage.put(f"obj/{sha}", zstd_frame(object_bytes))
    forged = attrs.evolve(record, object_sha256=sha, object_size=len(object_bytes), signatures=tuple(signatures),
                          disputes=tuple(disputes))
    doc["records"][action_key] = encode_record(forged).decode()
    storage.put(key, group_frame(doc))


def signed_by(builder: Builder, action_key: str, object_bytes: bytes, record_payload: dict, input_sets) -> dict:
    message = signing.statement(action_key, hashlib.sha256(object_bytes).hexdigest(), len(object_bytes), input_sets,
                                record_payload)
    signer = builder.signer()
    return {"signer": signer.public.key, "sig": signer.sign(message)}


def published(remote: str, action_key: str):
    _, doc = group_of(open_remote(remote), action_key)
    return decode_record(doc["records"][action_key].encode(), expected_key=action_key)


def evil_of(data: bytes) -> bytes:
    return data[:-16] + b"POISONED-OBJECT!"


def test_a_trusted_builders_entry_is_restored_and_certified(tmp_path, remote):
    ci = Builder(tmp_path, "ci")
    obj, first, out = ci.build(remote)
    assert obj["status"] == "compiled" and [s["signer"] for s in obj["signatures"]] == [signing.read_public(ci.public).key]
    laptop = Builder(tmp_path, "laptop").trusts(ci)
    obj, data, out = laptop.build(remote)
    assert obj["status"] == "reused" and obj["tier"] == "remote", out
    assert data == first  # the trusted builder's cold compile: the same bytes in any folder
    assert [s["signer"] for s in obj["signatures"]] == [signing.read_public(ci.public).key]


FORGERIES = {"unsigned": "unsigned", "signed-by-a-stranger": "not on the trust list",
             "a-valid-signature-on-other-bytes": "does not match the entry's bytes",
             "signed-by-the-writer-not-on-the-list": "not on the trust list"}


def test_a_forged_entry_is_never_restored(tmp_path, remote):
    """The store's writer replaces a published entry's object with its own bytes, under the real
    action key, with a checksum anyone can recompute: unsigned, signed by a key nobody trusts
    (a stranger's, or the writer's own), or carrying the trusted builder's signature copied from the
    real entry (it covers other bytes). Each time the reader compiles instead, says why once, and
    ends with a real compile's object (the trusted builder's cold compile: the same bytes in any
    folder)."""
    ci = Builder(tmp_path, "ci")
    obj, first, _ = ci.build(remote)
    record = published(remote, obj["action_key"])
    evil = evil_of(first)
    stranger, writer = Builder(tmp_path, "stranger"), Builder(tmp_path, "writer")
    for how, reason in FORGERIES.items():
        laptop = Builder(tmp_path, f"laptop-{how}").trusts(ci)  # reads only: its compile disputes nothing
        signatures = {"unsigned": [],
                      "signed-by-a-stranger": [signed_by(stranger, obj["action_key"], evil, record.payload,
                                                         obj["input_sets"])],
                      "a-valid-signature-on-other-bytes": list(record.signatures),
                      "signed-by-the-writer-not-on-the-list": [signed_by(writer, obj["action_key"], evil,
                                                                         record.payload, obj["input_sets"])]}[how]
        forge(remote, obj["action_key"], object_bytes=evil, signatures=signatures)
        got, data, out = laptop.build(remote, "--remote-store-mode", "read")
        assert got["status"] == "compiled" and data != evil and data == first, how
        assert "not restored for who stored them" in out and reason in out, (how, out)


def test_a_forged_object_under_its_own_name_is_refused(tmp_path, shared):
    """The writer overwrites the object's bytes under its sha256's name: they do not hash to it."""
    ci = Builder(tmp_path, "ci")
    obj, first, _ = ci.build(shared)
    open_remote(shared).put(f"obj/{obj['object_sha256']}", zstd_frame(evil_of(first)))
    got, data, out = Builder(tmp_path, "laptop").trusts(ci).build(shared)
    assert got["status"] == "compiled" and data == first


def test_a_revoked_key_is_never_trusted_again(tmp_path, shared):
    ci = Builder(tmp_path, "ci")
    obj, first, _ = ci.build(shared)
    laptop = Builder(tmp_path, "laptop").trusts(ci)
    assert laptop.build(shared)[0]["status"] == "reused"
    laptop.keys("revoke", str(ci.public))
    got, data, out = laptop.build(shared)
    assert got["status"] == "compiled" and data == first and "signed by a revoked key (ci)" in out, out
    assert signing.read_public(ci.public).key not in laptop.keys("list").split("\n")[0]


def test_a_key_missing_from_the_trust_list(tmp_path, shared):
    ci = Builder(tmp_path, "ci")
    ci.build(shared)
    got, _, out = Builder(tmp_path, "stranger").build(shared)
    assert got["status"] == "compiled" and "not on the trust list" in out


def test_configure_trust_names_a_key_for_one_build(tmp_path, shared):
    """configure --trust FILE trusts a key for that build alone, not on the user's list."""
    ci = Builder(tmp_path, "ci")
    ci.build(shared)
    laptop = Builder(tmp_path, "laptop")
    assert laptop.build(shared, "--trust", str(ci.public))[0]["status"] == "reused"
    assert laptop.build(shared)[0]["status"] == "compiled"


def test_two_builders_that_agree_countersign_and_require_signers_counts_them(tmp_path, remote):
    """--require-signers 2: one signature is not enough; a second trusted builder that compiles the
    same bytes adds its signature, and then the entry is restored where two are required."""
    ci = Builder(tmp_path, "ci")
    obj, first, _ = ci.build(remote)
    second = Builder(tmp_path, "second").trusts(ci)
    got, data, out = second.build(remote, "--require-signers", "2")
    assert got["status"] == "compiled" and "signed by 1 trusted builder(s) (ci), 2 required: 1 more needed" in out, out
    record = published(remote, obj["action_key"])
    assert {s["signer"] for s in record.signatures} == {signing.read_public(b.public).key for b in (ci, second)}
    reader = Builder(tmp_path, "reader").trusts(ci, second)
    got, data, out = reader.build(remote, "--require-signers", "2")
    assert got["status"] == "reused" and data == first, out
    assert len(got["signatures"]) == 2
    if remote.startswith("file:"):  # what a notice says is the trust list's, whatever the backend
        # one who trusts ci alone is told who else signed, by the name it gives itself, and how to trust it
        got, _, out = Builder(tmp_path, "half").trusts(ci).build(remote, "--require-signers", "2",
                                                                 "--remote-store-mode", "read")
        assert got["status"] == "compiled" and "also signed by 'second', key" in out and "keys trust" in out, out


def test_two_builders_that_disagree_dispute_the_entry_for_good(tmp_path, remote):
    """A trusted builder's key signs other bytes (it was stolen, or its compiler is not
    deterministic): a second builder, which requires two signers and so compiles, finds the remote
    entry holds other bytes than its compile, says so loudly and signs a dispute; from then on every
    builder that trusts it refuses the entry, even one that would trust the first alone."""
    ci = Builder(tmp_path, "ci")
    obj, first, _ = ci.build(remote)
    record = published(remote, obj["action_key"])
    evil = evil_of(first)
    forge(remote, obj["action_key"], object_bytes=evil,
          signatures=[signed_by(ci, obj["action_key"], evil, record.payload, obj["input_sets"])])
    checker = Builder(tmp_path, "checker").trusts(ci)
    got, data, out = checker.build(remote, "--require-signers", "2")
    assert got["status"] == "compiled" and data == first
    assert "DISAGREES with the store" in out, out
    disputed = published(remote, obj["action_key"])
    assert [d["signer"] for d in disputed.disputes] == [signing.read_public(checker.public).key]
    reader = Builder(tmp_path, "reader").trusts(ci, checker)  # reads only: it sees the dispute, makes none
    got, data, out = reader.build(remote, "--remote-store-mode", "read")
    assert got["status"] == "compiled" and data == first and "disputed by checker" in out, out
    # The writer rewrites the record without the dispute: neither the checker nor the reader, which
    # saw it, restores the entry again; one requiring two signers never did (the writer holds one key).
    forge(remote, obj["action_key"], object_bytes=evil,
          signatures=[signed_by(ci, obj["action_key"], evil, record.payload, obj["input_sets"])])
    assert not published(remote, obj["action_key"]).disputes
    for builder in (checker, reader):
        got, data, out = builder.build(remote, "--remote-store-mode", "read")
        assert got["status"] == "compiled" and data == first and "a builder disputed this entry" in out, out
    if remote.startswith("file:"):  # the trust list's decision, whatever the backend
        got, data, out = Builder(tmp_path, "careful").trusts(ci, checker).build(remote, "--require-signers", "2")
        assert got["status"] == "compiled" and data == first


def test_an_old_signed_entry_replayed_is_restored_only_where_it_holds(tmp_path, shared):
    """The writer puts back an older signed entry of the same command (from before a source edit)
    as the newest: its observations do not hold for the edited source, so it is not restored; the
    object is the edited source's real compile."""
    ci = Builder(tmp_path, "ci")
    old_obj, old, _ = ci.build(shared)
    edited = tmp_path / "edited"
    shutil.copytree(FIXTURE, edited)
    (edited / "unit.cpp").write_text((FIXTURE / "unit.cpp").read_text().replace("3 * x + 1", "3 * x + 2"))
    new_obj, new, _ = ci.build(shared, src=edited)
    storage = open_remote(shared)
    for key in list(storage.keys("ent")):
        doc = group_doc(storage.get(key))
        for mkey, entries in doc["manifests"].items():
            old_entries = [e for e in entries if e["action_key"] == old_obj["action_key"]]
            doc["manifests"][mkey] = [e for e in entries if e["action_key"] != old_obj["action_key"]] + old_entries
        storage.put(key, group_frame(doc))
    got, data, _ = Builder(tmp_path, "laptop").trusts(ci).build(shared, src=edited)
    assert data == new and data != old  # new: the edited source's cold compile


def test_a_writer_can_deny_service_and_nothing_more(tmp_path, shared):
    """Deleting everything the store holds: builds compile, and succeed."""
    ci = Builder(tmp_path, "ci")
    obj, first, _ = ci.build(shared)
    storage = open_remote(shared)
    for kind in ("obj", "ent"):
        for key in list(storage.keys(kind)):
            storage.remove(key)
    got, data, _ = Builder(tmp_path, "laptop").trusts(ci).build(shared)
    assert got["status"] == "compiled" and data == first


def test_a_key_readable_by_others_is_refused_with_what_to_do(tmp_path):
    builder = Builder(tmp_path, "careless")
    key = builder.config / "keys" / "signing.key"
    key.chmod(0o644)
    proc = subprocess.run([sys.executable, str(REPO / "configure.py"), "--arch", "9.0", "--ext-spec",
                           str(FIXTURE / "plain.toml"), "--store", str(tmp_path / "store")],
                          cwd=tmp_path, env=builder.env(), capture_output=True, text=True)
    assert proc.returncode != 0 and f"chmod 600 {key}" in proc.stdout + proc.stderr
    key.unlink()
    proc = subprocess.run([sys.executable, str(REPO / "configure.py"), "--arch", "9.0", "--ext-spec",
                           str(FIXTURE / "plain.toml"), "--store", str(tmp_path / "store"), "--signing-key", str(key)],
                          cwd=tmp_path, env=builder.env(), capture_output=True, text=True)
    assert proc.returncode != 0 and "no signing key at" in proc.stdout + proc.stderr and "keys new" in proc.stdout + proc.stderr


def other_spelling(key: str) -> str:
    """The same 32 bytes in another base64 spelling (the last character's unused bits set), which
    base64.b64decode(validate=True) reads as the same key."""
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
    return key[:42] + alphabet[alphabet.index(key[42]) ^ 1] + "="


def test_one_key_in_two_spellings_is_one_signer(tmp_path, shared):
    """A writer that holds ci's key forges an entry signed twice, the signer named in two spellings,
    and hands out ci's key in its other spelling as a second builder's: a reader requiring two signers
    refuses the file at configure, and with ci alone compiles; the object is a real compile's."""
    ci = Builder(tmp_path, "ci")
    obj, first, _ = ci.build(shared)
    record = published(shared, obj["action_key"])
    evil = evil_of(first)
    signature = signed_by(ci, obj["action_key"], evil, record.payload, obj["input_sets"])
    assert base64.b64decode(other_spelling(signature["signer"]), validate=True) == base64.b64decode(signature["signer"])
    forge(shared, obj["action_key"], object_bytes=evil,
          signatures=[signature, dict(signature, signer=other_spelling(signature["signer"]))])
    again = tmp_path / "ci-laptop.pub"
    again.write_text(f"pp4-ed25519 {other_spelling(signature['signer'])} ci-laptop\n")
    reader = Builder(tmp_path, "reader").trusts(ci)
    work, proc = reader.configure(shared, "--require-signers", "2", "--trust", str(again))
    assert proc.returncode != 0 and f"{again}: the public key is not in canonical base64" in proc.stdout + proc.stderr
    got, data, out = reader.build(shared, "--require-signers", "2")
    assert got["status"] == "compiled" and data == first and "1 more needed" in out, out


def test_a_trust_file_others_can_write_is_refused_and_nothing_forged_is_restored(tmp_path, shared):
    """The writer signs a forged entry with its own key and gets that key onto the reader's trust
    list through a trust file it can write: one world-writable, or a link into the shared store's
    folder. configure refuses either, naming the file and the fix; made so after configure, the build
    restores nothing and compiles."""
    ci = Builder(tmp_path, "ci")
    obj, first, _ = ci.build(shared)
    writer = Builder(tmp_path, "writer")
    record = published(shared, obj["action_key"])
    evil = evil_of(first)
    forge(shared, obj["action_key"], object_bytes=evil,
          signatures=[signed_by(writer, obj["action_key"], evil, record.payload, obj["input_sets"])])
    reader = Builder(tmp_path, "reader").trusts(ci)
    team = reader.config / "trusted" / "team.pub"
    work, proc = reader.configure(shared)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    team.write_text(writer.public.read_text())
    team.chmod(0o666)
    got, data, out = reader.ninja(work)
    assert got["status"] == "compiled" and data == first and f"chmod go-w {team}" in out, out
    audit = subprocess.run([ninja_bin(), "certify"], cwd=work, env=reader.env(), capture_output=True, text=True)
    assert audit.returncode != 0 and f"chmod go-w {team}" in audit.stdout + audit.stderr  # nor does it certify
    _, proc = reader.configure(shared)
    assert proc.returncode != 0 and f"chmod go-w {team}" in proc.stdout + proc.stderr
    team.unlink()
    in_store = Path(shared[len("file://"):]) / "team.pub"
    in_store.write_text(writer.public.read_text())
    team.symlink_to(in_store)
    _, proc = reader.configure(shared)
    assert proc.returncode != 0 and f"{team} is a symbolic link" in proc.stdout + proc.stderr
    assert len((proc.stdout + proc.stderr).strip().splitlines()[-1]) > 0


def test_key_misuses_are_refused_at_configure_with_the_fix(tmp_path):
    """--trust given a private key, and --require-signers more than the keys trusted."""
    ci = Builder(tmp_path, "ci")
    reader = Builder(tmp_path, "reader")
    _, proc = reader.configure(None, "--trust", str(ci.config / "keys" / "signing.key"))
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "is a private key; give the .pub beside it" in out and "base64" not in out, out
    _, proc = reader.configure(None, "--require-signers", "5", "--trust", str(ci.public))
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "--require-signers 5: your trust list has 2 key(s) (reader, ci)" in out, out
    assert "trust 3 more: `python -m pp4.store keys trust FILE`" in out, out

