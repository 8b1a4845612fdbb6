"""`python -m pp4.reuse`, both run by ninja:

    python -m pp4.reuse CONFIG [--env NAME=VALUE]... -- COMPILER ARGS...   one compile (pp4/reuse/edge.py)
    python -m pp4.reuse --prepass CONFIG ACTIONS STAMP                    all compiles of the build at once
                                                                          (pp4/reuse/prepass.py)
    python -m pp4.reuse --recheck CONFIG ACTIONS STAMP                    before ninja decides: outputs whose
                                                                          observations no longer hold
                                                                          (pp4/reuse/recheck.py)
    python -m pp4.reuse why OBJECT                                        why an object was compiled, not
                                                                          restored (pp4/reuse/why.py)
"""

from __future__ import annotations

import sys
from pathlib import Path

from pp4 import interrupt


@interrupt.command("pp4.reuse")
def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    from pp4.build.config import BuildFolderError

    try:
        return _main(argv)
    except BuildFolderError as e:
        if argv and argv[0] == "--recheck":
            return 0  # configure runs next (it is what the check waits before) and writes the config anew
        print(f"pp4.reuse: error: {e}", file=sys.stderr)
        return 2


def _main(argv: list[str]) -> int:
    if argv and argv[0] == "why":
        from pp4.reuse import why

        return why.main(argv[1:])
    if argv and argv[0] == "--recheck" and len(argv) == 4:
        from pp4.reuse import recheck

        if not (Path(argv[1]).is_file() and Path(argv[2]).is_file()):
            return 0  # configure has not written them yet (a deleted build folder): it runs next
        if recheck.nothing_built(Path(argv[1]), Path(argv[2]), Path(argv[3])):
            return 0
    # Loaded here, not above: a new build folder's check needs none of it, the prepass no compile edge.
    from pp4.reuse import actionkey
    from pp4.build.config import ReuseConfig
    from pp4.toolchain.compilers import CompilerError

    try:
        if argv and argv[0] == "--prepass":
            if len(argv) != 4:
                print("usage: python -m pp4.reuse --prepass CONFIG ACTIONS STAMP", file=sys.stderr)
                return 2
            from pp4.reuse import client
            from pp4.reuse.prepass import prepass  # not imported by the compile edges

            server = []  # started where a compile will run after all, loading while the prepass goes on

            def start_server():
                server.append(client.start_for(argv[1]))

            from pp4.certify.ahead import ahead  # the command may reach above the rule; the rule does not

            def after(*facts):
                ahead(Path(argv[1]), Path(argv[2]), *facts)

            code = prepass(ReuseConfig.load(argv[1]), Path(argv[2]), Path(argv[3]), start_server, after)
            if server and server[0]:
                client.ready(server[0])
            return code
        if argv and argv[0] == "--recheck":
            if len(argv) != 4:
                print("usage: python -m pp4.reuse --recheck CONFIG ACTIONS STAMP", file=sys.stderr)
                return 2
            from pp4.reuse.recheck import recheck

            return recheck(ReuseConfig.load(argv[1]), Path(argv[2]), Path(argv[3]))
        from pp4.reuse.edge import compile_one
        from pp4.toolchain import compilerenv

        env, rest = compilerenv.parse_env_args(argv[1:])
        if not argv or len(rest) < 2 or rest[0] != "--":
            print("usage: python -m pp4.reuse CONFIG [--env NAME=VALUE]... -- COMPILER ARGS...", file=sys.stderr)
            return 2
        if "PATH" not in env:
            print("pp4.reuse: error: no --env PATH=...: a compile runs only in the environment configure chose; "
                  "run it as build.ninja does, with the action's \"env\" from actions.json as --env NAME=VALUE",
                  file=sys.stderr)
            return 2
        return compile_one(ReuseConfig.load(argv[0]), env, rest[1:])
    except (actionkey.CommandError, CompilerError) as e:
        print(f"pp4.reuse: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
