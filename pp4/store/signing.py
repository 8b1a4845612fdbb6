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
    revoked              public keys never trusted again, one a line
    disputed             action keys this user's builds saw disputed, never restored

A public key file is one line: `pp4-ed25519 <base64 of the 32-byte key> <name>`.
The signing library is `cryptography` (its ed25519, through OpenSSL).
"""

from __future__ import annotations

import base64
import binascii
import os
import stat
from pathlib import Path

import attrs

from pp4 import paths
from pp4.files import canonical_json, write_whole

STATEMENT_FORMAT = "pp4-entry-1"
DISPUTE_FORMAT = "pp4-dispute-1"
PUBLIC_TAG = "pp4-ed25519"
SECRET_TAG = "pp4-ed25519-secret"
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
    return paths.config_dir() / "disputed"


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


def _unb64(text: str, size: int, what: str) -> bytes:
    try:
        data = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise SigningKeyError(f"{what} is not base64") from None
    if len(data) != size:
        raise SigningKeyError(f"{what} is {len(data)} bytes, not {size}")
    return data


@attrs.frozen
class PublicKey:
    key: str  # base64 of the 32 raw bytes: how records and trust lists name a signer
    name: str = ""

    def line(self) -> str:
        return f"{PUBLIC_TAG} {self.key} {self.name}".rstrip() + "\n"

    def verifies(self, signature: str, message: bytes) -> bool:
        from cryptography.exceptions import InvalidSignature
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

        try:
            raw = base64.b64decode(signature, validate=True)
            Ed25519PublicKey.from_public_bytes(base64.b64decode(self.key)).verify(raw, message)
            return True
        except (InvalidSignature, binascii.Error, ValueError):
            return False


def parse_public(text: str, where: str) -> PublicKey:
    """A public key line (`pp4-ed25519 BASE64 [name]`), or the bare base64."""
    words = text.strip().split(None, 2)
    if words and words[0] == PUBLIC_TAG:
        words = words[1:]
    if not words:
        raise SigningKeyError(f"{where}: no public key in it (a pp4 public key is one line: {PUBLIC_TAG} BASE64 NAME)")
    _unb64(words[0], 32, f"{where}: the public key")
    return PublicKey(words[0], words[1].strip() if len(words) > 1 else "")


def read_public(path: str | Path) -> PublicKey:
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise SigningKeyError(f"cannot read the public key {path}: {e.strerror}") from None
    return parse_public(text, str(path))


class Signer:
    """This builder's private key."""

    def __init__(self, path: Path, seed: bytes, name: str):
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
        from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

        self.path = path
        self._key = Ed25519PrivateKey.from_private_bytes(seed)
        raw = self._key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
        self.public = PublicKey(_b64(raw), name)

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
    return Signer(path, _unb64(words[1], 32, f"{path}: the key"), words[2].strip() if len(words) > 2 else "")


def new_key(path: str | Path | None = None, name: str | None = None, force: bool = False) -> Signer:
    """Make a key pair: the private key owner-only, the public key beside it (.pub)."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat

    path = Path(path) if path else default_key_path()
    if path.exists() and not force:
        raise SigningKeyError(f"{path} exists already (keep it, or pass --force to replace it: entries it signed are then "
                        "trusted by nobody who trusts the new one)")
    name = name or f"{os.environ.get('USER') or os.getuid()}@{os.uname().nodename}"
    seed = Ed25519PrivateKey.generate().private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())
    path.parent.mkdir(parents=True, exist_ok=True)
    os.chmod(path.parent, 0o700)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(f"{SECRET_TAG} {_b64(seed)} {name}\n")
    os.replace(tmp, path)
    signer = Signer(path, seed, name)
    write_whole(public_path(path), signer.public.line())
    return signer


def public_path(private: Path) -> Path:
    return private.with_suffix(".pub")


# ---------------------------------------------------------------------------------------------
# the trust list


@attrs.frozen
class Verdict:
    ok: bool
    signers: tuple[str, ...] = ()  # trusted signers whose signatures verify
    why: str | None = None  # why not, in words


@attrs.frozen
class Trust:
    """The keys whose entries a build restores, those it never trusts, and how many must agree."""
    keys: dict  # base64 -> PublicKey
    revoked: frozenset
    disputed: frozenset  # action keys this user saw disputed
    require: int = 1

    def verdict(self, action_key: str, object_sha256: str, object_size: int, input_sets, payload: dict,
                signatures, disputes=()) -> Verdict:
        """Whether an entry may be restored: at least `require` trusted, unrevoked keys signed its
        statement, and no trusted key disputes it."""
        if action_key in self.disputed:
            return Verdict(False, why="a builder disputed this entry: its compile gave other bytes")
        message = None
        good: list[str] = []
        first_problem = None
        for sig in signatures or ():
            signer = sig.get("signer") if isinstance(sig, dict) else None
            if signer in self.revoked:
                first_problem = first_problem or f"signed by a revoked key ({str(signer)[:12]}...)"
                continue
            key = self.keys.get(signer)
            if key is None:
                first_problem = first_problem or f"signed by a key not on the trust list ({str(signer)[:12]}...)"
                continue
            if message is None:
                message = statement(action_key, object_sha256, object_size, input_sets, payload)
            if key.verifies(str(sig.get("sig", "")), message):
                if signer not in good:
                    good.append(signer)
            else:
                first_problem = first_problem or f"a signature by {key.name or signer[:12]} does not match the entry's bytes"
        for dispute in disputes or ():
            signer = dispute.get("signer") if isinstance(dispute, dict) else None
            key = self.keys.get(signer) if signer not in self.revoked else None
            other = str(dispute.get("object_sha256", ""))
            if key is not None and other != object_sha256 and key.verifies(str(dispute.get("sig", "")),
                                                                            dispute_statement(action_key, other)):
                return Verdict(False, why=f"disputed by {key.name or signer[:12]}: its compile gave {other[:12]}")
        if len(good) >= self.require:
            return Verdict(True, tuple(sorted(good)))
        if not signatures:
            return Verdict(False, why="unsigned")
        if good:
            return Verdict(False, tuple(good), f"signed by {len(good)} trusted builder(s), {self.require} required")
        return Verdict(False, why=first_problem or "no trusted signature")


def load_trust(extra: list | None = None, require: int = 1, own: PublicKey | None = None) -> Trust:
    """This user's trust list (own key, trusted/*.pub), the build's own keys (configure --trust,
    as public key lines), minus revoked keys. A file that cannot be read is said in the SigningKeyError."""
    keys: dict[str, PublicKey] = {}
    if own is not None:
        keys[own.key] = own
    folder = trusted_folder()
    if folder.is_dir():
        for path in sorted(folder.glob("*.pub")):
            k = read_public(path)
            keys.setdefault(k.key, k)
    for line in extra or ():
        k = parse_public(line, "a key given to configure --trust")
        keys.setdefault(k.key, k)
    revoked = frozenset(_lines(revoked_file()))
    disputed = frozenset(_lines(disputed_file()))
    return Trust({k: v for k, v in keys.items() if k not in revoked}, revoked, disputed, max(1, int(require)))


def _lines(path: Path) -> list[str]:
    try:
        return [w.split()[0] for w in path.read_text().splitlines() if w.strip() and not w.startswith("#")]
    except OSError:
        return []


def remember_dispute(action_key: str) -> None:
    """This user's builds never restore the action again (kept whatever the stores say)."""
    path = disputed_file()
    if action_key in _lines(path):
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        f.write(action_key + "\n")


def trust_key(public: PublicKey) -> Path:
    """Put a public key on this user's trust list; where it went."""
    folder = trusted_folder()
    folder.mkdir(parents=True, exist_ok=True)
    name = "".join(c if c.isalnum() or c in "-_.@" else "_" for c in (public.name or public.key[:12]))
    path = folder / f"{name}.pub"
    write_whole(path, public.line())
    return path


def revoke_key(public: PublicKey) -> None:
    path = revoked_file()
    if public.key in _lines(path):
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        f.write(f"{public.key} {public.name}\n".rstrip() + "\n")
    for trusted in trusted_folder().glob("*.pub") if trusted_folder().is_dir() else ():
        try:
            if read_public(trusted).key == public.key:
                trusted.unlink()
        except SigningKeyError:
            continue
