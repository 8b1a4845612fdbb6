"""Who stored an entry, and whether this build may restore it: ed25519 keys, signed statements, the
trust list.

Whoever can write a store (a shared folder, a Redis password, a compromised CI runner) could hand
every reader a chosen object under a real key: checksums anyone can recompute prove nothing about
who made it. So a builder signs what it stores, and a build restores an entry only when builders on
its trust list signed it (`Trust.verdict`), as Nix's binary caches do with `trusted-public-keys`.

A signature covers the *statement* of an entry: compiling the command of manifest key M (its
argv, environment and root) with the observations of input sets S gives the object of sha256 O
and size N, with these warnings. The sets are named by the hash of their content and the action
key by M and S, so a signature binds every observation a compile made; an old signed entry
replayed is restored only where all of them still hold, which makes it the right object.

Because pp4's objects are the same bytes wherever they are compiled, two builders that compile
one action independently must agree: a second builder that compiles an action another signed adds
its signature when its object is the same, and when it is not, it signs a *dispute* (its own
object's sha256) instead: an entry any trusted builder disputes is never restored again
(poisoning, or a compiler that is not deterministic: both worth a human's look).

Keys live in pp4's configuration folder (`paths.config_dir()`, `$PP4_CONFIG_DIR`):

    keys/signing.key     this user's private key, readable by its owner alone
    keys/signing.pub     its public key: give it to teammates (`python -m pp4.store keys show`)
    trusted/*.pub        public keys whose entries this user's builds restore
    revoked              public keys never trusted again, one a line (`BASE64 [name]`)
    disputes             the signed disputes this user's builds made or saw (DISPUTES_FORMAT)
    disputed             action keys disputed by pp4s before the disputes file (read, never written)

Whoever can write one of these chooses whose entries the user's builds restore, so each is read as
the signing key is: a file of this user (or root) that neither the group nor others may write, not
a link, in folders of the same kind; anything else is refused, naming the file and the fix.

A key is its 32 bytes (`PublicKey.raw`): trust, revocation, counting signers and disputes compare
them. Base64 spells 32 bytes in more than one way (the last character's two unused bits), so only
the canonical spelling is accepted anywhere a key is read, and a signature naming its signer
otherwise counts for nobody. A name is a label for messages, never an identity.

A public key file is one line: `pp4-ed25519 <base64 of the 32-byte key> <name>`.
The signing library is `cryptography` (its ed25519, through OpenSSL).
"""

from __future__ import annotations

import base64
import binascii
import errno
import json
import os
import stat
import sys
from pathlib import Path

import attrs

from pp4 import paths
from pp4.files import canonical_json, write_whole
from pp4.store.records import ACTION_KEY_RE, SHA256_RE

STATEMENT_FORMAT = "pp4-entry-1"
DISPUTE_FORMAT = "pp4-dispute-1"
PUBLIC_TAG = "pp4-ed25519"
SECRET_TAG = "pp4-ed25519-secret"
# The disputes file's first line. 1: then one canonical JSON object a line, {"action_key",
# "object_sha256", "signer", "sig"[, "name"]}: a dispute as a record carries it, with its action key.
DISPUTES_FORMAT = "pp4-disputes-1"
KEY_BYTES = 32
SIGNATURE_BYTES = 64
# What of an action record's payload a signature covers, besides its key, object and sets.
SIGNED_PAYLOAD = ("manifest_key", "command", "env", "in_root", "outside_root", "warnings")


class SigningKeyError(Exception):
    """A key that is missing, unreadable, readable by others, or not a key: the message says which
    and what to do."""


def key_folder() -> Path:
    return paths.config_dir() / "keys"


def trusted_folder() -> Path:
    return paths.config_dir() / "trusted"


def revoked_file() -> Path:
    return paths.config_dir() / "revoked"


def disputed_file() -> Path:
    """Action keys disputed, as pp4s before the disputes file kept them (still honoured)."""
    return paths.config_dir() / "disputed"


def disputes_file() -> Path:
    return paths.config_dir() / "disputes"


def default_key_path() -> Path:
    return key_folder() / "signing.key"


# ---------------------------------------------------------------------------------------------
# statements


def statement(action_key: str, object_sha256: str, object_size: int, input_sets, payload: dict) -> bytes:
    """The bytes a signature covers (canonical JSON)."""
    doc = {"format": STATEMENT_FORMAT, "action_key": action_key, "object_sha256": object_sha256,
           "object_size": object_size, "input_sets": list(input_sets),
           **{k: payload.get(k) for k in SIGNED_PAYLOAD}}
    return canonical_json(doc)


def dispute_statement(action_key: str, object_sha256: str) -> bytes:
    """What a builder signs when its compile of an action gave other bytes than the entry's."""
    return canonical_json({"format": DISPUTE_FORMAT, "action_key": action_key, "object_sha256": object_sha256})


# ---------------------------------------------------------------------------------------------
# keys


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def canonical_b64(text: str, size: int, what: str) -> bytes:
    """The raw bytes of `size` that text spells in canonical base64; SigningKeyError otherwise. A
    spelling whose unused bits are set decodes to the same bytes as the canonical one, so accepting
    it would give one key two names."""
    try:
        data = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise SigningKeyError(f"{what} is not base64") from None
    if len(data) != size:
        raise SigningKeyError(f"{what} is {len(data)} bytes, not {size}")
    if _b64(data) != text:
        raise SigningKeyError(f"{what} is not in canonical base64 (the same bytes are spelled {_b64(data)}; "
                              "a key has one spelling)")
    return data


def raw_signer(text) -> bytes | None:
    """The raw key a record's "signer" field names, or None: not a string, or not the canonical
    spelling of 32 bytes (such a signature counts for nobody)."""
    if not isinstance(text, str):
        return None
    try:
        return canonical_b64(text, KEY_BYTES, "signer")
    except SigningKeyError:
        return None


def _clean_name(name: str, where: str) -> str:
    """A key's label, whitespace collapsed; SigningKeyError for characters a terminal would act on."""
    name = " ".join(name.split())
    if not name.isprintable():
        raise SigningKeyError(f"{where}: the key's name has control characters in it")
    return name


def _raw_key(value: bytes) -> bytes:
    if not isinstance(value, bytes) or len(value) != KEY_BYTES:
        raise ValueError(f"a public key is {KEY_BYTES} raw bytes")
    return bytes(value)


@attrs.frozen
class PublicKey:
    raw: bytes = attrs.field(converter=_raw_key)  # the key: what trust, revocation and counting compare
    name: str = attrs.field(default="", eq=False)  # a label for messages only

    @property
    def key(self) -> str:
        """The canonical base64 of the raw bytes: how records and trust lists write a signer."""
        return _b64(self.raw)

    @property
    def label(self) -> str:
        return self.name or f"{self.key[:12]}..."

    def line(self) -> str:
        return f"{PUBLIC_TAG} {self.key} {self.name}".rstrip() + "\n"

    def verifies(self, signature: str, message: bytes) -> bool:
        from cryptography.exceptions import InvalidSignature
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

        try:
            raw = base64.b64decode(signature, validate=True)
            Ed25519PublicKey.from_public_bytes(self.raw).verify(raw, message)
            return True
        except (InvalidSignature, binascii.Error, ValueError, TypeError):
            return False


def parse_public(text: str, where: str) -> PublicKey:
    """A public key line (`pp4-ed25519 BASE64 [name]`), or the bare base64: one line, the key in
    its canonical spelling."""
    lines = text.strip().splitlines()
    if len(lines) > 1:
        raise SigningKeyError(f"{where}: more than one line (a pp4 public key is one line: {PUBLIC_TAG} BASE64 NAME)")
    words = text.strip().split(None, 2)
    if words and words[0] == SECRET_TAG:
        raise SigningKeyError(f"{where}: this is a private key; give the .pub beside it (its public key), and keep "
                              "this file to yourself")
    if words and words[0] == PUBLIC_TAG:
        words = words[1:]
    if not words:
        raise SigningKeyError(f"{where}: no public key in it (a pp4 public key is one line: {PUBLIC_TAG} BASE64 NAME)")
    raw = canonical_b64(words[0], KEY_BYTES, f"{where}: the public key")
    return PublicKey(raw, _clean_name(words[1], where) if len(words) > 1 else "")


def read_public(path: str | Path) -> PublicKey:
    """A public key file handed to pp4 (a teammate's .pub, wherever it is): read once and copied."""
    try:
        text = Path(path).read_text(errors="replace")
    except OSError as e:
        raise SigningKeyError(f"cannot read the public key {path}: {e.strerror}") from None
    if text.split(None, 1)[:1] == [SECRET_TAG]:
        raise SigningKeyError(f"{path} is a private key; give the .pub beside it ({public_path(Path(path))}), and "
                              "keep this file to yourself")
    return parse_public(text, str(path))


def read_own_public(private: str | Path | None) -> PublicKey | None:
    """The public key beside this user's private key (default: keys/signing.pub), read as the trust
    list is (it is on it); None when there is none."""
    path = public_path(Path(private) if private else default_key_path())
    text = read_config_file(path, "your public key")
    return None if text is None else parse_public(text, str(path))


class Signer:
    """This builder's private key."""

    def __init__(self, path: Path, seed: bytes, name: str):
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
        from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

        self.path = path
        self._key = Ed25519PrivateKey.from_private_bytes(seed)
        self.public = PublicKey(self._key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw), name)

    def sign(self, message: bytes) -> str:
        return _b64(self._key.sign(message))


def load_signer(path: str | Path | None = None) -> Signer:
    """The private key at path (default: keys/signing.key); SigningKeyError saying what is wrong: missing,
    unreadable, readable by the group or others, or not a key."""
    path = Path(path) if path else default_key_path()
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except FileNotFoundError:
        raise SigningKeyError(f"no signing key at {path}: make one with `python -m pp4.store keys new`") from None
    except OSError as e:
        raise SigningKeyError(f"cannot read the signing key {path}: {e.strerror} (it must be a file its owner may read; "
                        f"a link is not followed)") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise SigningKeyError(f"the signing key {path} is not a regular file")
        if st.st_mode & 0o077:
            raise SigningKeyError(f"the signing key {path} is readable or writable by others (mode "
                            f"{stat.S_IMODE(st.st_mode):04o}): anyone who reads it can sign as you. `chmod 600 {path}`, "
                            "and if others may have read it, make a new one (`python -m pp4.store keys new --force`) "
                            "and have your teammates revoke the old")
        if st.st_uid != os.geteuid():
            raise SigningKeyError(f"the signing key {path} belongs to another user (uid {st.st_uid})")
        text = os.read(fd, 4096).decode(errors="replace")
    finally:
        os.close(fd)
    words = text.split(None, 2)
    if len(words) < 2 or words[0] != SECRET_TAG:
        raise SigningKeyError(f"{path} is not a pp4 signing key (it begins with {SECRET_TAG})")
    name = _clean_name(words[2], str(path)) if len(words) > 2 else ""
    return Signer(path, canonical_b64(words[1], 32, f"{path}: the key"), name)


def default_name() -> str:
    """user@host: the login name of this uid where $USER is unset (a number names nobody)."""
    user = os.environ.get("USER")
    if not user:
        import pwd

        try:
            user = pwd.getpwuid(os.getuid()).pw_name
        except KeyError:
            user = f"uid{os.getuid()}"
    return f"{user}@{os.uname().nodename}"


def new_key(path: str | Path | None = None, name: str | None = None, force: bool = False) -> Signer:
    """Make a key pair: the private key owner-only, the public key beside it (.pub)."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat

    path = Path(path) if path else default_key_path()
    if path.exists() and not force:
        raise SigningKeyError(f"{path} exists already (keep it, or pass --force to replace it: entries it signed are then "
                        "trusted by nobody who trusts the new one)")
    name = _clean_name(name or default_name(), "--name")
    seed = Ed25519PrivateKey.generate().private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())
    _make_folder(path.parent)
    os.chmod(path.parent, 0o700)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(f"{SECRET_TAG} {_b64(seed)} {name}\n")
    os.replace(tmp, path)
    signer = Signer(path, seed, name)
    write_whole(public_path(path), signer.public.line(), mode=0o644)
    return signer


def public_path(private: Path) -> Path:
    return private.with_suffix(".pub")


# ---------------------------------------------------------------------------------------------
# the configuration folder's files, read as the signing key is


def _make_folder(folder: Path) -> None:
    """A folder of the configuration, made owner-only (the parents pp4 makes too)."""
    for part in reversed([folder, *folder.parents]):
        if not part.exists():
            part.mkdir(mode=0o700, exist_ok=True)


def _writable_by_others(path: Path, st: os.stat_result, what: str) -> str | None:
    """Why a file or folder of the trust list cannot be believed (its owner or mode), with the fix."""
    if st.st_uid not in (os.geteuid(), 0):
        return (f"{what} {path} belongs to another user (uid {st.st_uid}): only your own files say whose entries "
                f"you restore; remove it (`python -m pp4.store keys trust FILE` makes your own copy)")
    if st.st_mode & 0o022:
        who = "its group and others" if st.st_mode & 0o022 == 0o022 else "its group" if st.st_mode & 0o020 else "others"
        return (f"{what} {path} is writable by {who} (mode {stat.S_IMODE(st.st_mode):04o}): whoever writes it chooses "
                f"whose entries you restore. `chmod go-w {path}`")
    return None


def _check_folders(path: Path, what: str) -> None:
    """The folders from the configuration folder down to path's: this user's, written by nobody
    else, and inside it no link (a link there could lead to a folder others write)."""
    top = paths.config_dir()
    folder = path.parent
    chain = [folder, *folder.parents]
    inside = [f for f in chain if f == top or top in f.parents]
    if not inside:  # a file outside the configuration folder (--signing-key's .pub): its own folder
        inside = [folder]
    for f in inside:
        try:
            st = os.stat(f) if f == top or f == inside[-1] else os.lstat(f)
        except FileNotFoundError:
            continue
        except OSError as e:
            raise SigningKeyError(f"cannot read the folder {f} of {what} {path}: {e.strerror}") from None
        if stat.S_ISLNK(st.st_mode):
            raise SigningKeyError(f"the folder {f} of {what} {path} is a symbolic link: the trust list is read only "
                                  f"from folders of your configuration; remove the link and make the folder "
                                  f"(`python -m pp4.store keys trust FILE` fills it)")
        why = _writable_by_others(f, st, f"the folder of {what}")
        if why:
            raise SigningKeyError(why)
    # Above it, whoever may rename an entry could put another folder in its place: each folder up
    # to / is this user's or root's, and one others may write is sticky (as /tmp is: there only an
    # entry's owner renames it).
    for f in inside[-1].parents:
        try:
            st = os.stat(f)
        except OSError:
            continue
        if st.st_mode & stat.S_ISVTX and st.st_uid in (os.geteuid(), 0):
            continue
        why = _writable_by_others(f, st, f"the folder above {what}")
        if why:
            raise SigningKeyError(why)


def read_config_file(path: Path, what: str) -> str | None:
    """The text of a trust-list file (trusted/*.pub, revoked, disputes, your public key), or None
    when there is none; SigningKeyError, naming the file and the fix, when someone else could have
    written it: not this user's (or root's), writable by the group or others, a link, not a file,
    or in such a folder."""
    _check_folders(path, what)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise SigningKeyError(f"{what} {path} is a symbolic link: the trust list is read only from files of your "
                                  "configuration folder; remove the link (`python -m pp4.store keys trust FILE` "
                                  "copies a key in)") from None
        raise SigningKeyError(f"cannot read {what} {path}: {e.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise SigningKeyError(f"{what} {path} is not a regular file; remove it")
        why = _writable_by_others(path, st, what)
        if why:
            raise SigningKeyError(why)
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks).decode(errors="replace")
    finally:
        os.close(fd)


def _append_config_line(path: Path, line: str, header: str | None = None) -> None:
    """Add a line to a trust-list file (made owner-only; with header as its first line when new),
    in one write, so that two builds adding at once each add a whole line."""
    _make_folder(path.parent)
    if header is not None and not path.exists():
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
            with os.fdopen(fd, "w") as f:
                f.write(header + "\n")
            os.link(tmp, path)  # fails where another build made it first: its header is the same
        except FileExistsError:
            pass
        finally:
            tmp.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        why = _writable_by_others(path, os.fstat(fd), "the file")
        if why:
            raise SigningKeyError(why)
        os.write(fd, line.encode())
    finally:
        os.close(fd)


# ---------------------------------------------------------------------------------------------
# the trust list


@attrs.frozen
class Verdict:
    ok: bool
    signers: tuple[str, ...] = ()  # trusted signers whose signatures verify (canonical base64)
    why: str | None = None  # why not, in words
    dispute: dict | None = None  # the valid dispute by a trusted key the entry carries (to remember)


@attrs.frozen
class Trust:
    """The keys whose entries a build restores, those it never trusts, and how many must agree."""
    keys: dict  # raw key -> PublicKey (revoked keys left out)
    revoked: dict  # raw key -> PublicKey (its name as the revoked file has it)
    disputed: frozenset  # action keys this user saw disputed (the disputes file's valid lines)
    require: int = 1

    def label(self, signer) -> str:
        """How messages name a signer: its name on the trust list or revoked file, else a key's prefix."""
        raw = raw_signer(signer)
        known = self.keys.get(raw) or self.revoked.get(raw)
        return known.label if known is not None else f"{str(signer)[:12]}..."

    def verdict(self, action_key: str, object_sha256: str, object_size: int, input_sets, payload: dict,
                signatures, disputes=()) -> Verdict:
        """Whether an entry may be restored: at least `require` distinct trusted, unrevoked keys
        signed its statement, and no trusted key disputes it."""
        if action_key in self.disputed:
            return Verdict(False, why="a builder disputed this entry: its compile gave other bytes "
                                      f"({disputes_file()})")
        message = None
        good: dict[bytes, PublicKey] = {}
        untrusted: list[tuple[bytes, dict]] = []
        first_problem = None
        for sig in signatures or ():
            raw = raw_signer(sig.get("signer")) if isinstance(sig, dict) else None
            if raw is None:
                first_problem = first_problem or "a signature whose signer is not a key in its one spelling"
                continue
            if raw in self.revoked:
                first_problem = first_problem or f"signed by a revoked key ({self.revoked[raw].label})"
                continue
            key = self.keys.get(raw)
            if key is None:
                untrusted.append((raw, sig))
                first_problem = first_problem or f"signed by a key not on the trust list ({_claimed(raw, sig)})"
                continue
            if raw in good:
                continue
            if message is None:
                message = statement(action_key, object_sha256, object_size, input_sets, payload)
            if key.verifies(str(sig.get("sig", "")), message):
                good[raw] = key
            else:
                first_problem = first_problem or f"a signature by {key.label} does not match the entry's bytes"
        for dispute in disputes or ():
            raw = raw_signer(dispute.get("signer")) if isinstance(dispute, dict) else None
            key = self.keys.get(raw) if raw is not None else None
            other = str(dispute.get("object_sha256", "")) if key is not None else ""
            if key is not None and other != object_sha256 and key.verifies(str(dispute.get("sig", "")),
                                                                            dispute_statement(action_key, other)):
                return Verdict(False, why=f"disputed by {key.label}: its compile gave {other[:12]}",
                               dispute={"action_key": action_key, "object_sha256": other, "signer": key.key,
                                        "sig": str(dispute.get("sig"))})
        if len(good) >= self.require:
            return Verdict(True, tuple(sorted(k.key for k in good.values())))
        if not signatures:
            return Verdict(False, why="unsigned")
        if good:
            why = (f"signed by {len(good)} trusted builder(s) ({', '.join(k.label for k in good.values())}), "
                   f"{self.require} required: {self.require - len(good)} more needed")
        else:
            why = first_problem or "no trusted signature"
        if untrusted and good:  # who else vouched for it, by the name it gives itself: the key a user may trust
            if message is None:
                message = statement(action_key, object_sha256, object_size, input_sets, payload)
            others = [_claimed(raw, sig) for raw, sig in dict(untrusted).items()
                      if PublicKey(raw).verifies(str(sig.get("sig", "")), message)]
            if others:
                why += (f"; also signed by {', '.join(others)}, not on your trust list (if you trust them, "
                        "`python -m pp4.store keys trust FILE` with their .pub)")
        return Verdict(False, tuple(k.key for k in good.values()), why)


def _claimed(raw: bytes, sig: dict) -> str:
    """An untrusted signer as its signature names itself (a name nobody vouches for) and its key."""
    name = sig.get("name") if isinstance(sig.get("name"), str) else ""
    name = " ".join(name.split())[:40] if name.isprintable() else ""
    key = f"{_b64(raw)[:12]}..."
    return f"{name!r}, key {key}" if name else key


def load_trust(extra: list | None = None, require: int = 1, own: PublicKey | None = None) -> Trust:
    """This user's trust list (own key, trusted/*.pub), the build's own keys (configure --trust,
    as public key lines), minus revoked keys, and the disputes it made or saw. A file that cannot be
    read, or could have been written by someone else, is said in the SigningKeyError."""
    keys: dict[bytes, PublicKey] = {}
    if own is not None:
        keys[own.raw] = own
    folder = trusted_folder()
    try:
        st = os.lstat(folder)
    except FileNotFoundError:
        st = None
    if st is not None:
        _check_folders(folder / "x.pub", "the trust list")
        if not stat.S_ISDIR(st.st_mode):
            raise SigningKeyError(f"the trust list's folder {folder} is not a folder; remove it")
        for path in sorted(folder.glob("*.pub")):
            text = read_config_file(path, "the trusted key")
            if text is not None:
                k = parse_public(text, str(path))
                keys.setdefault(k.raw, k)
    for line in extra or ():
        k = parse_public(line, "a key given to configure --trust")
        keys.setdefault(k.raw, k)
    revoked = read_revoked()
    trusted = {raw: k for raw, k in keys.items() if raw not in revoked}
    disputed = frozenset(d["action_key"] for d in read_disputes() if raw_signer(d["signer"]) not in revoked)
    legacy = read_config_file(disputed_file(), "the disputed list")
    disputed |= frozenset(w.split()[0] for w in (legacy or "").splitlines() if w.strip() and not w.startswith("#"))
    return Trust(trusted, revoked, disputed, max(1, int(require)))


def build_trust(settings: dict) -> Trust:
    """A build's trust list from its configuration's trust settings (pp4.json's "trust": configure's
    --trust keys and --require-signers, its signing key, whose public key beside it is on the list):
    what its check before ninja and its audit judge restored entries by, as its restores did."""
    return load_trust(settings.get("keys"), settings.get("require_signers", 1),
                      read_own_public(settings.get("signing_key")))


def read_revoked() -> dict:
    """The revoked file: raw key -> PublicKey, each line `BASE64 [name]` (checked like a key file)."""
    path = revoked_file()
    revoked: dict[bytes, PublicKey] = {}
    for n, line in enumerate((read_config_file(path, "the revoked list") or "").splitlines(), 1):
        if line.strip() and not line.startswith("#"):
            k = parse_public(line, f"{path}:{n}")
            revoked.setdefault(k.raw, k)
    return revoked


def read_disputes() -> list[dict]:
    """The disputes this user's builds made or saw, each checked: its signature by the key it names
    verifies. A line that does not is an error naming it (a last line cut short by a crash is
    skipped)."""
    path = disputes_file()
    text = read_config_file(path, "the disputes file")
    if not text:
        return []
    lines = text.split("\n")
    if lines[0] != DISPUTES_FORMAT:
        raise SigningKeyError(f"{path} is not a pp4 disputes file (its first line is {DISPUTES_FORMAT}); move it away")
    found = []
    for n, line in enumerate(lines[1:], 2):
        if not line:
            continue
        try:
            found.append(parse_dispute(line))
        except SigningKeyError as e:
            if n == len(lines):  # no newline after it: a write cut short
                continue
            raise SigningKeyError(f"{path}:{n}: {e}; remove that line") from None
    return found


def parse_dispute(line: str) -> dict:
    """One line of the disputes file, checked: its canonical JSON, and a signature that verifies."""
    try:
        doc = json.loads(line)
    except ValueError:
        raise SigningKeyError("not JSON") from None
    if not isinstance(doc, dict) or not {"action_key", "object_sha256", "signer", "sig"} <= set(doc) <= {
            "action_key", "object_sha256", "signer", "sig", "name"}:
        raise SigningKeyError("not a dispute")
    if not (isinstance(doc["action_key"], str) and ACTION_KEY_RE.fullmatch(doc["action_key"])
            and isinstance(doc["object_sha256"], str) and SHA256_RE.fullmatch(doc["object_sha256"])
            and isinstance(doc["sig"], str) and all(isinstance(v, str) for v in doc.values())):
        raise SigningKeyError("not a dispute")
    if canonical_json(doc).decode() != line:
        raise SigningKeyError("not in its one spelling (canonical JSON)")
    raw = raw_signer(doc["signer"])
    message = dispute_statement(doc["action_key"], doc["object_sha256"])
    if raw is None or not PublicKey(raw).verifies(doc["sig"], message):
        raise SigningKeyError("its signature does not verify")
    return doc


def remember_dispute(dispute: dict) -> None:
    """Keep a dispute this builder made or saw (a signed one by a trusted key: Verdict.dispute): this
    user's builds never restore the action again, whatever the stores say later. Said on stderr,
    never raised, when it cannot be kept."""
    line = canonical_json({k: dispute[k] for k in ("action_key", "object_sha256", "signer", "sig")}).decode()
    try:
        parse_dispute(line)
        if any(d["action_key"] == dispute["action_key"] for d in read_disputes()):
            return
        _append_config_line(disputes_file(), line + "\n", header=DISPUTES_FORMAT)
    except (OSError, SigningKeyError) as e:
        print(f"pp4.reuse: warning: cannot keep the dispute of action {dispute.get('action_key', '?')[:16]} in "
              f"{disputes_file()} ({getattr(e, 'strerror', None) or e}); this build refuses the entry, a later one "
              "only while a store still carries the dispute", file=sys.stderr)


def trust_key(public: PublicKey) -> Path:
    """Put a public key on this user's trust list; where it went."""
    folder = trusted_folder()
    _make_folder(folder)
    name = "".join(c if c.isalnum() or c in "-_.@" else "_" for c in (public.name or public.key[:12]))
    path = folder / f"{name}.pub"
    write_whole(path, public.line(), mode=0o644)
    return path


def revoke_key(public: PublicKey) -> None:
    path = revoked_file()
    if public.raw not in read_revoked():
        _append_config_line(path, f"{public.key} {public.name}".rstrip() + "\n")
    for trusted in trusted_folder().glob("*.pub") if trusted_folder().is_dir() else ():
        try:
            text = read_config_file(trusted, "the trusted key")
            if text is not None and parse_public(text, str(trusted)).raw == public.raw:
                trusted.unlink()
        except SigningKeyError:
            continue
