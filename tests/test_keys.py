"""A key is its 32 bytes, and the trust list is only what this user wrote (pp4/store/signing.py):
the key-line, trust-file, dispute and record parsers accept one spelling of each thing (properties,
with hypothesis), trust counts raw keys, and a trust-list file someone else could write is refused.
No compiles: the store's trust decision is called directly, and the oracle is whether a statement
over other bytes (a forged object) would be restored."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import pwd
import subprocess
import sys
from pathlib import Path

import attrs
import pytest
from conftest import REPO
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pp4.store import signing
from pp4.store.records import ActionRecord, InvalidRecord, decode_record, encode_record

ACTION = "ab" * 32
GOOD, EVIL = "11" * 32, "ee" * 32
PAYLOAD = {"manifest_key": "m", "command": ["g++"], "env": {}, "in_root": True, "outside_root": [], "warnings": ""}


@pytest.fixture
def config(tmp_path, monkeypatch) -> Path:
    """A configuration folder of this test's own (0700, as pp4 makes it)."""
    folder = tmp_path / "config"
    monkeypatch.setenv("PP4_CONFIG_DIR", str(folder))
    signing.new_key(name="me")
    return folder


def spellings(raw: bytes) -> list[str]:
    """Every base64 text b64decode(validate=True) takes for these 32 bytes: the canonical one and
    those whose last character's two unused bits are set."""
    text = base64.b64encode(raw).decode()
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
    at = alphabet.index(text[42])
    return [text[:42] + alphabet[(at & ~3) | low] + "=" for low in range(4)]


def sign_evil(signer: signing.Signer, signer_text: str | None = None) -> dict:
    message = signing.statement(ACTION, EVIL, 5, ["s1"], PAYLOAD)
    return {"signer": signer_text or signer.public.key, "sig": signer.sign(message)}


def evil_verdict(trust: signing.Trust, signatures, disputes=()) -> signing.Verdict:
    return trust.verdict(ACTION, EVIL, 5, ["s1"], PAYLOAD, signatures, disputes)


# ------------------------------------------------------------------ one key, one spelling

names = st.text(st.characters(blacklist_categories=("Cs",)), max_size=30)
printable_names = names.filter(str.isprintable)


@given(st.binary(min_size=32, max_size=32), printable_names)
def test_every_spelling_of_a_key_but_one_is_refused(raw, name):
    texts = spellings(raw)
    assert base64.b64decode(texts[1], validate=True) == raw  # what the old parser took as a second key
    accepted = []
    for text in texts:
        for line in (text, f"pp4-ed25519 {text} {name}"):
            try:
                accepted.append((text, signing.parse_public(line, "k")))
            except signing.SigningKeyError as e:
                assert "canonical" in str(e)
    assert {t for t, _ in accepted} == {base64.b64encode(raw).decode()}
    assert all(k.raw == raw for _, k in accepted)
    assert sum(signing.raw_signer(t) is not None for t in texts) == 1


key_lines = st.one_of(
    st.text(max_size=120),
    st.builds(lambda tag, raw, cut, sep, name, tail: f"{tag}{base64.b64encode(raw).decode()[:cut]}{sep}{name}{tail}",
              st.sampled_from(["", "pp4-ed25519 ", "pp4-ed25519\t", "pp4-ed25519-secret ", "ssh-ed25519 "]),
              st.binary(min_size=31, max_size=33), st.sampled_from([44, 43, 42]), st.sampled_from(["", " ", "  "]),
              names, st.sampled_from(["", "\n", "\n\n", "\nmore"])),
    st.builds(lambda raw, i, name: f"pp4-ed25519 {spellings(raw)[i]} {name}", st.binary(min_size=32, max_size=32),
              st.integers(0, 3), names))


@given(key_lines)
@settings(max_examples=400)
def test_an_accepted_key_line_has_one_canonical_form(text):
    """Whatever the key-line parser accepts is one key whose line reads back as itself, and its
    base64 word was already that form's."""
    try:
        key = signing.parse_public(text, "k")
    except signing.SigningKeyError:
        return
    line = key.line()
    again = signing.parse_public(line, "k")
    assert again == key and again.name == key.name and again.line() == line
    assert line == f"pp4-ed25519 {base64.b64encode(key.raw).decode()} {key.name}".rstrip() + "\n"
    assert base64.b64encode(key.raw).decode() in text.split()


def test_a_private_key_given_as_a_public_one_says_so(config, tmp_path):
    private = config / "keys" / "signing.key"
    with pytest.raises(signing.SigningKeyError, match=r"is a private key; give the .pub beside it"):
        signing.read_public(private)
    proc = subprocess.run([sys.executable, "-m", "pp4.store", "keys", "trust", str(private)], capture_output=True,
                          text=True, cwd=REPO, env=dict(os.environ, PP4_CONFIG_DIR=str(config)))
    assert proc.returncode == 2 and "private key" in proc.stderr and "not base64" not in proc.stderr, proc.stderr
    assert not (config / "trusted").exists()


def test_one_key_in_two_spellings_is_one_signer(config, tmp_path):
    """A writer that holds one trusted key signs a forged object twice, naming the signer in two
    spellings: --require-signers 2 is not met; with the key revoked, neither spelling counts."""
    thief = signing.new_key(tmp_path / "ci.key", name="ci")
    signing.trust_key(thief.public)
    trust = signing.load_trust(require=2, own=signing.load_signer().public)
    canonical, other = spellings(thief.public.raw)[0], [s for s in spellings(thief.public.raw)
                                                           if s != thief.public.key][0]
    assert canonical == thief.public.key
    twice = [sign_evil(thief), sign_evil(thief, other)]
    verdict = evil_verdict(trust, twice)
    assert not verdict.ok and "1 more needed" in verdict.why, verdict
    assert evil_verdict(attrs.evolve(trust, require=1), [sign_evil(thief, other)]).ok is False
    assert evil_verdict(attrs.evolve(trust, require=1), twice).ok  # the key itself does sign
    signing.revoke_key(signing.parse_public(thief.public.line(), "ci"))
    revoked = signing.load_trust(require=1)
    assert thief.public.raw in revoked.revoked and thief.public.raw not in revoked.keys
    assert not evil_verdict(revoked, twice).ok and not evil_verdict(revoked, twice[1:]).ok
    assert "revoked key (ci)" in evil_verdict(revoked, twice).why


def test_a_non_canonical_trust_file_is_refused(config, tmp_path):
    thief = signing.new_key(tmp_path / "ci.key", name="ci")
    other = [s for s in spellings(thief.public.raw) if s != thief.public.key][0]
    (config / "trusted").mkdir(mode=0o700)
    (config / "trusted" / "ci2.pub").write_text(f"pp4-ed25519 {other} ci2\n")
    with pytest.raises(signing.SigningKeyError, match="ci2.pub: the public key is not in canonical base64"):
        signing.load_trust()


# ------------------------------------------------------------------ trust files only this user writes


BAD_FILES = {
    "world-writable": (lambda p, shared: p.chmod(0o666), "chmod go-w"),
    "group-writable": (lambda p, shared: p.chmod(0o664), "chmod go-w"),
    "a-link-into-a-shared-folder": (lambda p, shared: (shared.write_text(p.read_text()), p.unlink(),
                                                       p.symlink_to(shared)), "symbolic link"),
    "another-users": (lambda p, shared: os.chown(p, 4242, -1), "belongs to another user (uid 4242)"),
}


@pytest.mark.parametrize("how", BAD_FILES)
@pytest.mark.parametrize("which", ["trusted", "revoked", "disputes", "own-public"])
def test_a_trust_list_file_someone_else_could_write_is_refused(config, tmp_path, how, which):
    """Whoever can write a trust-list file chooses whose entries are restored: such a file is
    refused, naming the file and the fix, and no forged entry is restored (the trust list cannot be
    loaded at all)."""
    if how == "another-users" and os.geteuid() != 0:
        pytest.skip("giving a file to another user needs root")
    writer = signing.new_key(tmp_path / "writer.key", name="writer")
    own = signing.load_signer()
    path = {"trusted": signing.trust_key(writer.public), "revoked": signing.revoked_file(),
            "disputes": signing.disputes_file(), "own-public": config / "keys" / "signing.pub"}[which]
    if which == "revoked":
        signing.revoke_key(signing.new_key(tmp_path / "old.key", name="old").public)
    if which == "disputes":
        signing.remember_dispute({"action_key": "cd" * 32, "object_sha256": GOOD, "signer": own.public.key,
                                  "sig": own.sign(signing.dispute_statement("cd" * 32, GOOD))})
    assert path.is_file() and signing.load_trust(own=own.public)
    shared = tmp_path / "shared-store" / "team.pub"
    shared.parent.mkdir()
    change, fix = BAD_FILES[how]
    change(path, shared)
    with pytest.raises(signing.SigningKeyError) as e:
        if which == "own-public":
            signing.read_own_public(None)
        signing.load_trust(own=own.public)
    assert str(path) in str(e.value) and fix in str(e.value) and "\n" not in str(e.value), e.value


def test_a_trust_folder_others_may_write_or_a_linked_one_is_refused(config, tmp_path):
    writer = signing.new_key(tmp_path / "writer.key", name="writer")
    signing.trust_key(writer.public)
    trusted = config / "trusted"
    trusted.chmod(0o777)
    with pytest.raises(signing.SigningKeyError, match=f"chmod go-w {trusted}"):
        signing.load_trust()
    trusted.chmod(0o700)
    config.chmod(0o775)
    with pytest.raises(signing.SigningKeyError, match=f"chmod go-w {config}"):
        signing.load_trust()
    config.chmod(0o700)
    shared = tmp_path / "shared-store"
    trusted.rename(shared)
    trusted.symlink_to(shared)
    with pytest.raises(signing.SigningKeyError, match="is a symbolic link"):
        signing.load_trust()


def test_a_folder_above_the_configuration_others_may_write_is_refused_unless_sticky(tmp_path, monkeypatch):
    """Whoever may rename an entry of a folder above the configuration folder can swap in a trust
    list of its own: such a folder is refused, unless sticky (as /tmp: only an entry's owner renames it)."""
    above = tmp_path / "above"
    monkeypatch.setenv("PP4_CONFIG_DIR", str(above / "config"))
    signing.new_key(name="me")
    above.chmod(0o777)
    with pytest.raises(signing.SigningKeyError, match=f"the folder above the .* {above} is writable .*"
                                                      f"`chmod go-w {above}`"):
        signing.load_trust()
    above.chmod(0o1777)
    assert signing.load_trust().keys == {}


def test_files_pp4_writes_pass_its_own_checks_under_a_loose_umask(tmp_path, monkeypatch):
    monkeypatch.setenv("PP4_CONFIG_DIR", str(tmp_path / "fresh" / "config"))
    old = os.umask(0o002)
    try:
        me = signing.new_key(name="me")
        signing.trust_key(signing.new_key(tmp_path / "ci.key", name="ci").public)
        signing.revoke_key(signing.new_key(tmp_path / "old.key", name="old").public)
        signing.remember_dispute({"action_key": ACTION, "object_sha256": GOOD, "signer": me.public.key,
                                  "sig": me.sign(signing.dispute_statement(ACTION, GOOD))})
    finally:
        os.umask(old)
    trust = signing.load_trust(own=signing.read_own_public(None))
    assert {k.name for k in trust.keys.values()} == {"me", "ci"} and trust.disputed == {ACTION}


def test_a_new_keys_default_name_is_the_login_name(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("USER", "LOGNAME")}
    env["PP4_CONFIG_DIR"] = str(tmp_path / "config")
    proc = subprocess.run([sys.executable, "-m", "pp4.store", "keys", "new"], capture_output=True, text=True,
                          cwd=REPO, env=env)
    assert proc.returncode == 0, proc.stderr
    name = (tmp_path / "config" / "keys" / "signing.pub").read_text().split()[2]
    assert name == f"{pwd.getpwuid(os.getuid()).pw_name}@{os.uname().nodename}"


# ------------------------------------------------------------------ disputes kept, checked on read


def test_a_dispute_seen_is_kept_and_a_forged_one_counts_for_nobody(config, tmp_path):
    checker = signing.new_key(tmp_path / "checker.key", name="checker")
    thief = signing.new_key(tmp_path / "ci.key", name="ci")
    writer = signing.new_key(tmp_path / "writer.key", name="writer")
    for k in (checker, thief):
        signing.trust_key(k.public)
    trust = signing.load_trust()
    dispute = {"signer": checker.public.key, "object_sha256": GOOD,
               "sig": checker.sign(signing.dispute_statement(ACTION, GOOD))}
    forged = [{"signer": writer.public.key, "object_sha256": GOOD,   # a key nobody trusts
               "sig": writer.sign(signing.dispute_statement(ACTION, GOOD))},
              dict(dispute, object_sha256="22" * 32),                 # the checker's signature, on other words
              {"signer": checker.public.key, "object_sha256": GOOD,  # of another action
               "sig": checker.sign(signing.dispute_statement("cd" * 32, GOOD))}]
    assert evil_verdict(trust, [sign_evil(thief)], forged).ok
    verdict = evil_verdict(trust, [sign_evil(thief)], [dispute])
    assert not verdict.ok and "disputed by checker" in verdict.why and verdict.dispute is not None
    signing.remember_dispute(verdict.dispute)
    signing.remember_dispute(verdict.dispute)
    lines = signing.disputes_file().read_text().splitlines()
    assert lines[0] == signing.DISPUTES_FORMAT and len(lines) == 2
    # the record rewritten without it revives nothing here
    assert not evil_verdict(signing.load_trust(), [sign_evil(thief)]).ok
    # a line whose signature does not verify is refused, naming it
    bad = json.loads(lines[1])
    bad["object_sha256"] = "33" * 32
    signing.disputes_file().write_text(lines[0] + "\n" + json.dumps(bad, sort_keys=True, separators=(",", ":")) + "\n")
    with pytest.raises(signing.SigningKeyError, match=r"disputes:2: its signature does not verify; remove that line"):
        signing.load_trust()


dispute_fields = st.fixed_dictionaries({"action_key": st.sampled_from([ACTION, "cd" * 32, "AB" * 32, "ab"]),
                                        "object_sha256": st.sampled_from([GOOD, EVIL, "1" * 63]),
                                        "signer": st.sampled_from(["me", "other", "bad"]),
                                        "sig": st.sampled_from(["good", "other", "x"])},
                                       optional={"name": names, "extra": st.integers()})


@given(dispute_fields, st.sampled_from([None, 0, 2]))
@settings(max_examples=200, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_an_accepted_dispute_line_is_canonical_and_verifies(config, doc, indent):
    me = signing.load_signer()
    doc = dict(doc)
    doc["signer"] = {"me": me.public.key, "other": spellings(me.public.raw)[1], "bad": "x"}[doc["signer"]]
    if doc["signer"] == me.public.key and doc["sig"] == "good":
        doc["sig"] = me.sign(signing.dispute_statement(doc["action_key"], doc["object_sha256"]))
    line = json.dumps(doc, indent=indent, sort_keys=indent is None, separators=(",", ":") if indent is None else None)
    try:
        got = signing.parse_dispute(line)
    except signing.SigningKeyError:
        return
    assert json.dumps(got, sort_keys=True, separators=(",", ":")) == line
    assert got["signer"] == me.public.key
    assert me.public.verifies(got["sig"], signing.dispute_statement(got["action_key"], got["object_sha256"]))


# ------------------------------------------------------------------ the record parser

signature_dicts = st.fixed_dictionaries({"signer": st.text(max_size=50), "sig": st.text(max_size=90)},
                                        optional={"name": names})
records = st.builds(ActionRecord, st.sampled_from([ACTION, "0123456789abcdef"]),
                    st.sampled_from([GOOD, EVIL]), st.integers(0, 2**40),
                    st.dictionaries(st.text(max_size=8), st.one_of(st.text(max_size=8), st.integers())),
                    st.floats(0, 2e9), st.lists(signature_dicts, max_size=3), st.lists(signature_dicts, max_size=2))


@given(records, st.sampled_from([None, 1]), st.dictionaries(st.sampled_from(["extra", "more"]), st.integers()))
@settings(max_examples=200)
def test_an_accepted_record_has_one_canonical_form(record, indent, extra):
    """A record's bytes, in any JSON spelling that its checksum accepts (its canonical body is what
    the checksum covers), and with fields it does not know, read as the same record, whose encoding
    reads back as itself."""
    data = encode_record(record)
    assert decode_record(data) == record and decode_record(data).signatures == record.signatures
    body = json.loads(data)
    body.pop("checksum")
    body.update(extra)
    body["checksum"] = hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    assert encode_record(decode_record(json.dumps(body).encode())) == data  # fields it does not know: dropped
    respelled = json.dumps(json.loads(data), indent=indent).encode()
    try:
        got = decode_record(respelled)
    except InvalidRecord:
        return
    assert got == record and encode_record(got) == data
