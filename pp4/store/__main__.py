"""Command line for the object store: `python -m pp4.store {stats,gc,verify}`, for a remote tier
`python -m pp4.store remote URL {stats,verify,expire}`, and for the keys that sign what a builder
stores and say whose entries it restores: `python -m pp4.store keys {new,show,trust,revoke,list}`
(pp4/store/signing.py).

Exit codes: 0 fine, 1 verify found damage (repaired or not), 2 usage or store error.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pp4 import interrupt
from pp4.sizes import counted, human_bytes, parse_size
from pp4.store import packs
from pp4.store.layout import SETS_FOLDER
from pp4.store.local import Store, default_store_dir
from pp4.store.manifests import Manifests
from pp4.store.records import StoreError
from pp4.store.reports import GcResult, StoreStats, VerifyReport

EXIT_OK = 0
EXIT_DAMAGE = 1
EXIT_ERROR = 2


def _size_argument(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _this_builds_store() -> Path | None:
    """The store of the build configured in this folder (configure --store), so that `python -m
    pp4.store stats` beside build.ninja shows the store that build uses."""
    from pp4.build import config as buildconfig

    found = buildconfig.of_folder(".")
    return Path(found.store) if found is not None and found.store else None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m pp4.store",
        description="Inspect and maintain the pp4 object store (compiled objects reused across builds).",
    )
    parser.add_argument(
        "--store",
        metavar="DIR",
        type=Path,
        default=None,
        help="store directory (default: the one the build configured in this folder uses, else $PP4_STORE_DIR, else "
             f"the pp4 cache dir: {default_store_dir()})",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="{stats,gc,verify,remote,keys}")
    commands.add_parser("stats", help="count entries and bytes")
    gc = commands.add_parser("gc", help="evict least-recently-used entries down to a size; drop leftovers of crashed builds")
    gc.add_argument(
        "--max-bytes",
        metavar="N",
        type=_size_argument,
        default=None,
        help="target size, e.g. 10G or 500M (powers of 1024); default: the store bound ($PP4_STORE_MAX_BYTES or 20G)",
    )
    verify = commands.add_parser("verify", help="rehash every object, check every record; remove what is broken")
    verify.add_argument("--no-repair", dest="repair", action="store_false", help="only report damage, remove nothing")
    remote = commands.add_parser("remote", help="a remote tier (redis://..., file:///...): stats, verify, expire")
    remote.add_argument("url", help="the remote store's URL (a password may come from $PP4_REMOTE_PASSWORD)")
    remote.add_argument("action", choices=("stats", "verify", "expire"))
    remote.add_argument("--no-repair", dest="repair", action="store_false",
                        help="verify: only report damage, remove nothing")
    remote.add_argument("--days", type=float, help="expire: every value unread this long from now expires (Redis)")
    keys = commands.add_parser("keys", help="your signing key and the builders whose entries you restore")
    keys.add_argument("action", choices=("new", "show", "trust", "revoke", "list"),
                      help="new: make your key pair; show: print your public key (give it to teammates); trust FILE: "
                           "restore what that key signed; revoke FILE|KEY: never trust it again; list: the trust list")
    keys.add_argument("key", nargs="?", help="trust, revoke: a public key file (or, for revoke, the key itself)")
    keys.add_argument("--name", help="new: the name your public key carries (default: user@host)")
    keys.add_argument("--force", action="store_true", help="new: replace an existing key")
    keys.add_argument("--key-file", type=Path, help="new, show: this private key instead of the default")
    return parser


def keys_main(args) -> int:
    from pp4.store import signing

    try:
        if args.action == "new":
            signer = signing.new_key(args.key_file, args.name, args.force)
            print(f"made {signer.path} (owner-only) and {signing.public_path(signer.path)}:")
            print(signer.public.line(), end="")
            return EXIT_OK
        if args.action == "show":
            path = args.key_file or signing.default_key_path()
            print(signing.load_signer(path).public.line(), end="")
            return EXIT_OK
        if args.action == "list":
            trust = signing.load_trust(own=_own_public())
            for key in trust.keys.values():
                print(key.line(), end="")
            for key in trust.revoked.values():
                print(f"revoked {key.line()}", end="")
            return EXIT_OK
        if not args.key:
            print(f"pp4.store: error: keys {args.action} needs a public key file", file=sys.stderr)
            return EXIT_ERROR
        if args.action == "trust":
            key = signing.read_public(args.key)
            print(f"trusted {key.label}: {signing.trust_key(key)}")
            return EXIT_OK
        key = signing.read_public(args.key) if Path(args.key).exists() else signing.parse_public(args.key, "the key")
        signing.revoke_key(key)
        print(f"revoked {key.label}: never trusted again by your builds ({signing.revoked_file()})")
        return EXIT_OK
    except signing.SigningKeyError as exc:
        print(f"pp4.store: error: {exc}", file=sys.stderr)
        return EXIT_ERROR


def _own_public():
    from pp4.store import signing

    try:
        return signing.read_own_public(None)
    except signing.SigningKeyError:
        return None


def remote_main(args) -> int:
    """Counts and bytes per kind; verify rehashes every object and checks every group (its records,
    sets and entries) (a damaged value is removed: the entries that need it become misses); expire
    gives every value a time to live."""
    from pp4.store.remote import RemoteUnavailable, redact
    from pp4.store.remote.backend import open_remote
    from pp4.store.remote.tier import KINDS
    from pp4.store.remote.tier import damage as damage_of

    try:
        remote = open_remote(args.url)
        if args.action == "stats":
            total = 0
            print(f"remote:   {redact(args.url)}")
            for kind, what in (("obj", "objects"), ("ent", "entry groups")):
                keys = list(remote.keys(kind))
                size = sum(remote.size_of(k) for k in keys)
                total += size
                print(f"{what + ':':16}{len(keys)} ({human_bytes(size)})")
            facts = remote.server_facts()
            line = f"size:           {human_bytes(total)}"
            if facts.get("limit") and facts.get("used") is not None:
                line += f"; server {human_bytes(facts['used'])} used of {human_bytes(facts['limit'])}"
            if facts.get("policy"):
                line += f", policy {facts['policy']}"
            print(line)
            return EXIT_OK
        if args.action == "expire":
            if not args.days or args.days <= 0 or not remote.supports_expiry:
                print("pp4.store: error: expire needs --days N (more than 0) and a Redis remote", file=sys.stderr)
                return EXIT_ERROR
            n = sum(remote.expire(k, int(args.days * 86400)) for kind in KINDS for k in list(remote.keys(kind)))
            print(f"{n} values of {redact(args.url)} expire unless read within {args.days:g} days")
            return EXIT_OK
        damage = []
        for key in [k for kind in KINDS for k in remote.keys(kind)]:
            data = remote.get(key)
            why = None if data is None else damage_of(key, data)
            if why:
                damage.append((key, why))
        for key, why in damage:
            if args.repair:
                remote.remove(key)
            print(f"  DAMAGE {key}: {why} [{'removed' if args.repair else 'left in place'}]")
        print(f"verify {redact(args.url)}: " + ("no damage found" if not damage else f"{len(damage)} damaged values"))
        return EXIT_OK if not damage else EXIT_DAMAGE
    except (ValueError, RemoteUnavailable) as exc:
        print(f"pp4.store: error: {exc}", file=sys.stderr)
        return EXIT_ERROR


def format_stats(stats: StoreStats) -> str:
    share = 100.0 * stats.bytes / stats.bound if stats.bound else 0.0
    return "\n".join(
        [
            f"store:    {stats.root}",
            f"entries:  {stats.entries} action records",
            f"objects:  {stats.objects} distinct objects",
            f"size:     {human_bytes(stats.bytes)} ({stats.bytes} bytes) of {human_bytes(stats.bound)} bound ({share:.0f}%)",
            f"staging:  {stats.tmp_files} files in tmp/",
        ]
    )


def format_gc(result: GcResult) -> str:
    return "\n".join(
        [
            f"gc {result.root}: {human_bytes(result.bytes_before)} -> {human_bytes(result.bytes_after)} "
            f"(target {human_bytes(result.bound)})",
            f"  evicted {result.records_evicted} least-recently-used action records and "
            f"{counted(result.objects_evicted, 'object')}",
            f"  removed {result.invalid_records_removed} invalid records, {result.orphan_objects_removed} orphaned objects, "
            f"{result.tmp_files_removed} stale staging files",
            f"  removed {result.manifest_entries_removed} manifest entries of evicted actions, "
            f"{result.manifests_removed} empty manifests, {result.input_sets_removed} set packs no entry names",
        ]
    )


def format_verify(report: VerifyReport) -> str:
    lines = [f"verify {report.root}: checked {report.objects_checked} objects and {report.records_checked} records"]
    for damage in report.damage:
        action = "removed" if damage.repaired else "left in place"
        lines.append(f"  DAMAGE {damage.kind}: {damage.path}: {damage.detail} [{action}]")
    if report.orphan_objects or report.stale_tmp_files:
        lines.append(
            f"  note: {report.orphan_objects} unreferenced objects and {report.stale_tmp_files} stale staging files "
            f"(harmless leftovers of interrupted builds; `gc` removes them)"
        )
    if report.ok:
        lines.append("no damage found")
    elif report.repair:
        lines.append(f"{len(report.damage)} damaged files found and removed; those actions are now misses and will recompile")
    else:
        lines.append(f"{len(report.damage)} damaged files found; run without --no-repair to remove them")
    return "\n".join(lines)


@interrupt.command("pp4.store")
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "remote":
        return remote_main(args)
    if args.command == "keys":
        return keys_main(args)
    root = args.store if args.store is not None else _this_builds_store() or default_store_dir()
    if not root.exists():
        # Reporting on a store must not create one.
        print(f"no store at {root} (nothing has been cached there yet)")
        return EXIT_OK
    try:
        store = Store(root)
        if args.command == "stats":
            print(format_stats(store.stats()))
            return EXIT_OK
        if args.command == "gc":
            print(format_gc(store.gc(args.max_bytes)))
            print(f"  removed {Manifests(root).collect_locks()} compile locks no process holds")
            return EXIT_OK
        report = store.verify(repair=args.repair)
        print(format_verify(report))
        # The reuse rule's manifests (an index from commands to actions) and the set packs they
        # name live in the store too; the store checks their bytes, never their meaning.
        manifest_damage = Manifests(root).verify(args.repair)
        for path, detail, repaired in manifest_damage:
            print(f"  DAMAGE manifest-invalid: {path}: {detail} [{'repaired' if repaired else 'left in place'}]")
        set_damage = packs.verify(root / SETS_FOLDER, args.repair)
        for path, detail, repaired in set_damage:
            print(f"  DAMAGE setpack-invalid: {path}: {detail} [{'removed' if repaired else 'left in place'}]")
        return EXIT_OK if report.ok and not manifest_damage and not set_damage else EXIT_DAMAGE
    except StoreError as exc:
        print(f"pp4.store: error: {exc}", file=sys.stderr)
        return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
